//! Megatron-LM's indexed datasets: `prefix.bin` (the tokens of every
//! document, back to back) and `prefix.idx` (their lengths, offsets and
//! document boundaries), as Megatron-Core's `IndexedDatasetBuilder` writes
//! them and as every Megatron, NeMo and GPT-NeoX pretraining corpus is
//! stored.
//!
//! The `.idx` layout (little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 9 | `MMIDIDX\0\0` |
//! | 8 | version, `1` |
//! | 1 | the tokens' type: 1 `u8`, 2 `i8`, 3 `i16`, 4 `i32`, 5 `i64`, 8 `u16` (6 and 7 are floats: refused) |
//! | 8 | sequences `n` |
//! | 8 | document boundaries `m` (documents + 1) |
//! | 4n | each sequence's length in tokens (`i32`) |
//! | 8n | each sequence's byte offset in the `.bin` (`i64`) |
//! | 8m | the sequence each document starts at, then `n` (`i64`) |
//! | n | (multimodal datasets only) each sequence's mode (`i8`) |
//!
//! Everything is checked when the dataset is opened, against both files,
//! with an error naming the file: the magic, version and type; the size
//! the counts imply; every offset against the lengths before it (the
//! builder writes them back to back); the `.bin`'s size against the
//! tokens; the document boundaries (from 0, never decreasing, ending at
//! `n`). A document is the sequences between two boundaries (one
//! sequence a document unless the corpus was split into sentences).
//!
//! The `.idx` is read once, in chunks, and what the windows need is kept:
//! 8 bytes a document (16 for [`DocumentWindows::WithinDocument`]). The
//! `.bin` is memory-mapped as a [`TokenFile`], with its guard against a
//! truncation while it is read.

use super::{window_key, window_record};
use super::{TokenFile, TokenLayout, TokenType};
use crate::contract::{check_index, reads_through, Parts, Record, Source, Value};
use crate::error::{Error, Result};
use crate::formats::{DatasetKind, Format};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The `.idx` magic.
const MAGIC: &[u8; 9] = b"MMIDIDX\0\0";
/// Bytes before the arrays: magic, version, type, two counts.
const HEADER: u64 = 9 + 8 + 1 + 8 + 8;

/// How a [`Megatron`] dataset's documents are cut into windows of
/// `seq_len + 1` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DocumentWindows {
    /// The documents back to back in their stored order, windows `seq_len`
    /// apart across document boundaries (Megatron's `GPTDataset`, whose
    /// corpora end each document with an end-of-document token). With
    /// `eos: Some(t)`, token `t` follows each document (for a corpus
    /// written without `--append-eod`). Every token is an input once per
    /// epoch; the loader's shuffle orders the windows.
    Packed {
        /// A token written after each document, if any.
        eos: Option<u32>,
    },
    /// Windows inside one document: `seq_len` apart from its start, the
    /// last one of a document shorter, padded with `pad` up to `seq_len +
    /// 1` tokens, the real count in the batch's `tokens_len` field. A
    /// document of fewer than 2 tokens (no input with a target) gives no
    /// window.
    WithinDocument {
        /// The token written after a short window's last.
        pad: u32,
    },
}

/// A Megatron indexed dataset (one or more `prefix.bin` + `prefix.idx`
/// pairs) as a source of token windows: sample `k` is the `k`-th window
/// ([`DocumentWindows`]) counting through the prefixes in order; a window
/// never crosses from one prefix to the next. The loader shuffles,
/// batches and shards the windows like any source's samples, and
/// [`TokenWindowsMap::megatron`](crate::map::TokenWindowsMap::megatron)
/// writes each one into the batch's `tokens` field (with `input` and
/// `target` views), straight from the memory map.
///
/// ```no_run
/// use candle_wick::map::TokenWindowsMap;
/// use candle_wick::source::{DocumentWindows, Megatron};
/// use candle_wick::Loader;
/// # fn main() -> candle_wick::Result<()> {
/// let corpus = Megatron::open(
///     ["data/web_text_document", "data/code_text_document"],
///     2048,
///     DocumentWindows::Packed { eos: None },
/// )?;
/// let mut loader = Loader::builder(corpus.clone())
///     .map(TokenWindowsMap::megatron(&corpus))
///     .batch_size(8)
///     .shuffle(1234)
///     .build()?;
/// for batch in loader.epoch(0) {
///     let batch = batch?;
///     let (x, y) = (batch.get("input")?, batch.get("target")?); // u32 [8, 2048]
///     # let _ = (x, y);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Megatron {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    corpora: Vec<Corpus>,
    /// Windows before each corpus, then the total.
    before: Vec<usize>,
    seq_len: usize,
    windows: DocumentWindows,
}

/// One `prefix.bin` + `prefix.idx`.
#[derive(Debug)]
struct Corpus {
    /// The prefix as given, for keys and errors.
    name: String,
    bin: TokenFile,
    /// The first token of each document, then the token count.
    starts: Vec<u64>,
    /// [`DocumentWindows::WithinDocument`]: the windows before each
    /// document, then the corpus's windows. Empty when packed.
    windows_before: Vec<u64>,
    /// Windows in the corpus.
    windows: usize,
}

impl Megatron {
    /// Opens the datasets at `prefixes` (each the path without `.bin` /
    /// `.idx`, a local path or a URL; a trailing `.bin` or `.idx` is taken
    /// off) and cuts their documents into windows of `seq_len + 1` tokens
    /// as `windows` says. An error names the file that does not match its
    /// index, and says when `seq_len` is 0 or no prefix holds a window.
    pub fn open<P: AsRef<Path>>(
        prefixes: impl IntoIterator<Item = P>,
        seq_len: usize,
        windows: DocumentWindows,
    ) -> Result<Self> {
        if seq_len == 0 {
            return Err(Error::InvalidConfig("seq_len must be at least 1".into()));
        }
        let mut corpora = Vec::new();
        let mut before = vec![0];
        for prefix in prefixes {
            let corpus = Corpus::open(prefix.as_ref(), seq_len, windows)?;
            before.push(before.last().copied().unwrap_or(0) + corpus.windows);
            corpora.push(corpus);
        }
        if corpora.is_empty() {
            return Err(Error::InvalidConfig(
                "a Megatron dataset needs at least one prefix".into(),
            ));
        }
        if before.last() == Some(&0) {
            return Err(Error::InvalidConfig(format!(
                "the Megatron dataset {:?} holds no window of {} tokens",
                corpora.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
                seq_len + 1
            )));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                corpora,
                before,
                seq_len,
                windows,
            }),
        })
    }

    /// Tokens per input (and per target).
    pub fn seq_len(&self) -> usize {
        self.inner.seq_len
    }

    /// How documents are cut into windows.
    pub fn windows(&self) -> DocumentWindows {
        self.inner.windows
    }

    /// Documents, over every prefix.
    pub fn documents(&self) -> usize {
        self.inner.corpora.iter().map(|c| c.starts.len() - 1).sum()
    }

    /// Tokens, over every prefix.
    pub fn tokens(&self) -> u64 {
        self.inner.corpora.iter().map(|c| c.bin.len() as u64).sum()
    }

    /// The type of the tokens of each prefix, in order.
    pub fn token_types(&self) -> Vec<TokenType> {
        self.inner
            .corpora
            .iter()
            .map(|c| c.bin.token_type())
            .collect()
    }

    /// The corpus of window `index` and the window's number in it.
    fn locate(&self, index: usize) -> Result<(&Corpus, usize)> {
        check_index(index, self.len())?;
        let c = self.inner.before.partition_point(|&b| b <= index) - 1;
        Ok((&self.inner.corpora[c], index - self.inner.before[c]))
    }

    /// Writes window `index` into `out` (at least `seq_len + 1` long) and
    /// returns how many tokens it holds: `seq_len + 1`, or fewer for the
    /// last window of a document ([`DocumentWindows::WithinDocument`]).
    pub fn read_window(&self, index: usize, out: &mut [u32]) -> Result<usize> {
        let (corpus, k) = self.locate(index)?;
        let want = self.inner.seq_len + 1;
        let Some(out) = out.get_mut(..want) else {
            return Err(Error::InvalidConfig(format!(
                "a window buffer of {} tokens is shorter than the {want} of a window",
                out.len()
            )));
        };
        corpus.read(k, self.inner.seq_len, self.inner.windows, out)
    }

    /// Asks the CPU to start loading window `index`'s tokens (a hint).
    pub(crate) fn prefetch(&self, index: usize) {
        if let Ok((corpus, k)) = self.locate(index) {
            let (first, _) = corpus.place(k, self.inner.seq_len, self.inner.windows);
            corpus.bin.prefetch(first as usize, self.inner.seq_len + 1);
        }
    }
}

impl Corpus {
    fn open(prefix: &Path, seq_len: usize, windows: DocumentWindows) -> Result<Self> {
        let ext = prefix.extension().and_then(|e| e.to_str());
        let base = match ext {
            Some("bin" | "idx") => prefix.with_extension(""),
            _ => prefix.to_path_buf(),
        };
        let with = |ext: &str| {
            let mut path = base.clone().into_os_string();
            path.push(ext);
            PathBuf::from(path)
        };
        let (idx_path, bin_path) = (with(".idx"), with(".bin"));
        let index = read_index(&idx_path)?;
        let bin = TokenFile::open_as(&bin_path, TokenLayout::Raw(index.ty))?;
        let tokens = *index.starts.last().expect("at least the end");
        if bin.len() as u64 != tokens {
            return Err(Error::Dataset {
                path: bin_path,
                reason: format!(
                    "holds {} {:?} tokens; its index {} says {tokens}",
                    bin.len(),
                    index.ty,
                    idx_path.display()
                ),
                source: None,
            });
        }
        let starts = index.starts;
        let docs = starts.len() - 1;
        let (windows_before, count) = match windows {
            DocumentWindows::Packed { eos } => {
                let stream = tokens + if eos.is_some() { docs as u64 } else { 0 };
                (Vec::new(), stream.saturating_sub(1) / seq_len as u64)
            }
            DocumentWindows::WithinDocument { .. } => {
                let mut before = Vec::with_capacity(docs + 1);
                let mut total = 0u64;
                for d in 0..docs {
                    before.push(total);
                    let len = starts[d + 1] - starts[d];
                    total += len.saturating_sub(1).div_ceil(seq_len as u64);
                }
                before.push(total);
                (before, total)
            }
        };
        let windows = usize::try_from(count).map_err(|_| Error::Dataset {
            path: idx_path.clone(),
            reason: format!("{count} windows do not fit this platform's usize"),
            source: None,
        })?;
        Ok(Self {
            name: base.display().to_string(),
            bin,
            starts,
            windows_before,
            windows,
        })
    }

    fn documents(&self) -> usize {
        self.starts.len() - 1
    }

    /// Where window `k` starts: its first position (a token of the `.bin`;
    /// with `eos`, a position of the stream of documents and end tokens)
    /// and, inside a document, the document.
    fn place(&self, k: usize, seq_len: usize, windows: DocumentWindows) -> (u64, usize) {
        match windows {
            DocumentWindows::Packed { .. } => (k as u64 * seq_len as u64, 0),
            DocumentWindows::WithinDocument { .. } => {
                let k = k as u64;
                let d = self.windows_before.partition_point(|&b| b <= k) - 1;
                let off = (k - self.windows_before[d]) * seq_len as u64;
                (self.starts[d] + off, d)
            }
        }
    }

    /// Writes window `k` into `out` (`seq_len + 1` long); the tokens it holds.
    fn read(
        &self,
        k: usize,
        seq_len: usize,
        windows: DocumentWindows,
        out: &mut [u32],
    ) -> Result<usize> {
        let (first, d) = self.place(k, seq_len, windows);
        match windows {
            DocumentWindows::Packed { eos: None } => {
                self.bin.read_into(first as usize, out)?;
                Ok(out.len())
            }
            DocumentWindows::Packed { eos: Some(eos) } => {
                self.read_with_eos(first, eos, out)?;
                Ok(out.len())
            }
            DocumentWindows::WithinDocument { .. } => {
                let n = (self.starts[d + 1] - first).min(out.len() as u64) as usize;
                self.bin.read_into(first as usize, &mut out[..n])?;
                Ok(n)
            }
        }
    }

    /// Fills `out` from position `pos` of the stream in which `eos`
    /// follows each document.
    fn read_with_eos(&self, mut pos: u64, eos: u32, out: &mut [u32]) -> Result<()> {
        // Document `d` starts at `starts[d] + d` in the stream: the last
        // document starting at or before `pos`.
        let docs = self.documents();
        let (mut lo, mut hi) = (0, docs);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.starts[mid] + mid as u64 <= pos {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (mut d, mut at) = (lo, 0);
        while at < out.len() {
            if d >= docs {
                return Err(self.past_end(pos));
            }
            let doc_start = self.starts[d] + d as u64;
            let len = self.starts[d + 1] - self.starts[d];
            let off = pos - doc_start;
            if off < len {
                let n = ((len - off) as usize).min(out.len() - at);
                self.bin
                    .read_into((self.starts[d] + off) as usize, &mut out[at..at + n])?;
                at += n;
                pos += n as u64;
            } else {
                out[at] = eos;
                at += 1;
                pos += 1;
                d += 1;
            }
        }
        Ok(())
    }

    fn past_end(&self, pos: u64) -> Error {
        Error::Dataset {
            path: PathBuf::from(&self.name),
            reason: format!("stream position {pos} is past the last document"),
            source: None,
        }
    }

    fn key(&self, k: usize, seq_len: usize, windows: DocumentWindows) -> String {
        let (first, d) = self.place(k, seq_len, windows);
        match windows {
            DocumentWindows::Packed { .. } => window_key(&self.name, first as usize),
            DocumentWindows::WithinDocument { .. } => {
                format!("{}#doc{d}@{}", self.name, first - self.starts[d])
            }
        }
    }
}

/// What a `.idx` says, checked: the tokens' type and each document's
/// first token, then the token count.
struct Index {
    ty: TokenType,
    starts: Vec<u64>,
}

/// The type Megatron's `DType` code stands for.
fn token_type(code: u8) -> std::result::Result<TokenType, String> {
    Ok(match code {
        1 => TokenType::U8,
        2 => TokenType::I8,
        3 => TokenType::I16,
        4 => TokenType::I32,
        5 => TokenType::I64,
        8 => TokenType::U16,
        6 | 7 => {
            return Err(format!(
                "type code {code} is {}: floats are not tokens",
                if code == 6 { "float64" } else { "float32" }
            ))
        }
        other => return Err(format!("unknown type code {other} (Megatron's are 1 to 8)")),
    })
}

/// Reads and checks `path`, a Megatron `.idx` (a URL's object fetched to
/// a local copy first).
fn read_index(path: &Path) -> Result<Index> {
    if crate::storage::is_url(path) {
        return parse_index(path, crate::storage::local_copy(path)?);
    }
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_index(path, file)
}

/// Parses the `.idx` in `file` (named `path` in errors).
fn parse_index(path: &Path, file: std::fs::File) -> Result<Index> {
    let bad = |reason: String| Error::Dataset {
        path: path.to_path_buf(),
        reason,
        source: None,
    };
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = file.metadata().map_err(io)?.len();
    if size < HEADER {
        return Err(bad(format!(
            "{size} bytes cannot hold a Megatron index's {HEADER}-byte header"
        )));
    }
    let mut r = std::io::BufReader::with_capacity(1 << 20, file);
    let mut header = [0u8; HEADER as usize];
    r.read_exact(&mut header).map_err(io)?;
    if &header[..9] != MAGIC {
        return Err(bad(format!(
            "starts {:?}, not Megatron's {:?}: not a Megatron index",
            String::from_utf8_lossy(&header[..9]),
            String::from_utf8_lossy(MAGIC)
        )));
    }
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8"));
    let version = u64_at(9);
    if version != 1 {
        return Err(bad(format!(
            "index version {version}: only version 1 is read"
        )));
    }
    let ty = token_type(header[17]).map_err(bad)?;
    let (n, m) = (u64_at(18), u64_at(26));
    // Multimodal indexes end with a mode byte per sequence.
    let arrays = n
        .checked_mul(12)
        .and_then(|a| m.checked_mul(8).and_then(|b| a.checked_add(b)))
        .and_then(|a| a.checked_add(HEADER));
    let fits = arrays.is_some_and(|a| size == a || Some(size) == a.checked_add(n));
    if !fits {
        return Err(bad(format!(
            "the header says {n} sequences and {m} document boundaries ({} bytes), the file \
             has {size} bytes",
            arrays.map_or("too many".into(), |a| a.to_string())
        )));
    }
    if m == 0 {
        return Err(bad(
            "no document boundary: the first one, 0, is always written".into(),
        ));
    }
    let (n, m) = (n as usize, m as usize);
    let item = ty.size() as u64;

    // Lengths (kept while the boundaries are read), then the offsets,
    // each checked against the lengths before it.
    let mut lengths = Vec::with_capacity(n);
    each_le::<4>(&mut r, n, |i, b| {
        let len = i32::from_le_bytes(b);
        let len = u32::try_from(len).map_err(|_| format!("sequence {i} has length {len}"))?;
        lengths.push(len);
        Ok(())
    })
    .map_err(|e| e.into_error(path))?;
    let mut expected = 0u64;
    each_le::<8>(&mut r, n, |i, b| {
        let pointer = i64::from_le_bytes(b);
        if u64::try_from(pointer) != Ok(expected * item) {
            return Err(format!(
                "sequence {i} starts at byte {pointer} of the .bin; after the lengths before \
                 it, byte {} (the builder writes sequences back to back)",
                expected * item
            ));
        }
        expected += u64::from(lengths[i]);
        Ok(())
    })
    .map_err(|e| e.into_error(path))?;

    // Boundaries: from 0, never decreasing, ending at `n`; each
    // document's first token from the lengths.
    let mut starts = Vec::with_capacity(m);
    let (mut seq, mut token, mut last) = (0usize, 0u64, 0u64);
    each_le::<8>(&mut r, m, |i, b| {
        let at = i64::from_le_bytes(b);
        let at = u64::try_from(at)
            .ok()
            .filter(|&a| a >= last && a <= n as u64)
            .ok_or_else(|| {
                format!(
                    "document boundary {i} is sequence {at}: boundaries run from 0 to the {n} \
                     sequences, never decreasing"
                )
            })?;
        if i == 0 && at != 0 {
            return Err(format!("the first document boundary is {at}, not 0"));
        }
        while (seq as u64) < at {
            token += u64::from(lengths[seq]);
            seq += 1;
        }
        last = at;
        starts.push(token);
        Ok(())
    })
    .map_err(|e| e.into_error(path))?;
    if last != n as u64 {
        return Err(bad(format!(
            "the last document boundary is sequence {last}, not the end ({n}): sequences past \
             it belong to no document"
        )));
    }
    Ok(Index { ty, starts })
}

/// Why an array of a `.idx` is refused: a read error or a bad value.
enum ArrayError {
    Io(std::io::Error),
    Bad(String),
}

impl From<String> for ArrayError {
    fn from(s: String) -> Self {
        ArrayError::Bad(s)
    }
}

impl ArrayError {
    fn into_error(self, path: &Path) -> Error {
        match self {
            ArrayError::Io(source) => Error::Io {
                path: path.to_path_buf(),
                source,
            },
            ArrayError::Bad(reason) => Error::Dataset {
                path: path.to_path_buf(),
                reason,
                source: None,
            },
        }
    }
}

/// Reads `count` little-endian values of `N` bytes from `r` in chunks,
/// calling `each(i, bytes)` for each.
fn each_le<const N: usize>(
    r: &mut impl Read,
    count: usize,
    mut each: impl FnMut(usize, [u8; N]) -> std::result::Result<(), String>,
) -> std::result::Result<(), ArrayError> {
    let mut chunk = vec![0u8; N * 8192];
    let mut i = 0;
    while i < count {
        let take = (count - i).min(8192);
        r.read_exact(&mut chunk[..take * N])
            .map_err(ArrayError::Io)?;
        for b in chunk[..take * N].chunks_exact(N) {
            each(i, b.try_into().expect("N bytes"))?;
            i += 1;
        }
    }
    Ok(())
}

/// Megatron indexed datasets in the format table: `PREFIX.idx` (found by
/// its magic) and `PREFIX.bin`, named by `PREFIX`; opened only with a
/// window length.
pub(crate) const FORMAT: Format = Format {
    companions: &[".bin"],
    magic: Some(MAGIC),
    prefix: true,
    ..Format::shards(
        DatasetKind::Megatron,
        "a Megatron indexed dataset (.bin + .idx)",
        &[".idx"],
        |paths| {
            Err(Error::InvalidConfig(format!(
                "{} holds {}: open it with Megatron::open(prefixes, seq_len, windows), which \
             needs the window length",
                paths
                    .first()
                    .map_or(String::new(), |p| p.display().to_string()),
                DatasetKind::Megatron.name()
            )))
        },
    )
};

impl Source for Megatron {
    fn len(&self) -> usize {
        *self.inner.before.last().expect("at least one corpus")
    }

    reads_through!(read_reusing);

    /// A record with no bytes: the map reads the tokens from the memory
    /// map itself ([`Parts`] asking for `tokens` gets them as a part).
    fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
        window_record(self, index, bytes)
    }

    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let record = self.read_reusing(index, bytes)?;
        if !parts.wants("tokens") {
            return Ok(record);
        }
        let mut tokens = vec![0; self.seq_len() + 1];
        let n = self.read_window(index, &mut tokens)?;
        tokens.truncate(n);
        Ok(record.with_part("tokens", Value::Tokens(tokens)))
    }

    fn key(&self, index: usize) -> String {
        match self.locate(index) {
            Ok((corpus, k)) => corpus.key(k, self.inner.seq_len, self.inner.windows),
            Err(_) => format!("window #{index}"),
        }
    }

    /// Each prefix's name, token type, tokens and documents, the window
    /// length and how documents are cut.
    fn digest(&self) -> u32 {
        let inner = &*self.inner;
        let text = format!(
            "megatron seq_len {} windows {:?}",
            inner.seq_len, inner.windows
        );
        inner
            .corpora
            .iter()
            .fold(crc32c::crc32c(text.as_bytes()), |crc, c| {
                let name = Path::new(&c.name)
                    .file_name()
                    .map_or(c.name.as_str().into(), |n| n.to_string_lossy());
                let line = format!(
                    " {name} {:?} {} {}",
                    c.bin.token_type(),
                    c.bin.len(),
                    c.documents()
                );
                crc32c::crc32c_append(crc, line.as_bytes())
            })
    }

    fn wants_read_ahead(&self) -> bool {
        // The `.bin` is fetched whole and mapped at open: reads are local.
        false
    }
}

#[cfg(test)]
#[path = "megatron_tests.rs"]
mod tests;
