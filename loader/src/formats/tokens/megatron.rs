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
//! The `.idx` is read in place: memory-mapped (from the remote cache's
//! directory for a URL, so a node's ranks share one copy in the page
//! cache), checked in one pass that keeps nothing per sequence, and a
//! document's first token read from its arrays when a window needs it
//! (the offset of the document's first sequence). Nothing grows with the
//! documents in the process's memory but, for
//! [`DocumentWindows::WithinDocument`], the windows before every 64th
//! document (a window's document is found from the nearest by counting
//! on through the starts). Both files are guarded against a truncation
//! while they are mapped: a read through a cut `.idx` is an error naming
//! it. The `.bin` is memory-mapped as a [`TokenFile`].

use super::{window_key, window_record};
use super::{TokenFile, TokenLayout, TokenType};
use crate::contract::{check_index, reads_through, Parts, Record, Source, Value};
use crate::error::{Error, Result};
use crate::formats::{DatasetKind, Format};
use crate::storage::Backing;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Documents between two of the window counts kept for
/// [`DocumentWindows::WithinDocument`] (8 bytes every 64 documents).
const STRIDE: usize = 64;

/// Windows of `seq_len + 1` tokens inside a document of tokens
/// `start..end`, `seq_len` apart.
fn windows_between(start: u64, end: u64, seq_len: usize) -> u64 {
    let len = end.saturating_sub(start);
    len.saturating_sub(1).div_ceil(seq_len as u64)
}

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
    /// The first token of each document, then the token count, read from
    /// the `.idx` in place.
    starts: Starts,
    /// [`DocumentWindows::WithinDocument`]: the windows before every
    /// [`STRIDE`]-th document (a window's document is found from the
    /// nearest one by counting on through at most `STRIDE` documents'
    /// starts). Empty when packed.
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
        self.inner.corpora.iter().map(Corpus::documents).sum()
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
            if corpus.starts.bytes.damaged() {
                return;
            }
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
        let tokens = index.starts.total;
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
        let docs = starts.documents();
        let (windows_before, count) = match windows {
            DocumentWindows::Packed { eos } => {
                let stream = tokens + if eos.is_some() { docs as u64 } else { 0 };
                (Vec::new(), stream.saturating_sub(1) / seq_len as u64)
            }
            DocumentWindows::WithinDocument { .. } => {
                let mut before = Vec::with_capacity(docs / STRIDE + 1);
                let mut total = 0u64;
                for d in 0..docs {
                    if d % STRIDE == 0 {
                        before.push(total);
                    }
                    total += windows_between(starts.get(d), starts.get(d + 1), seq_len);
                }
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
        self.starts.documents()
    }

    /// Where window `k` starts: its first position (a token of the `.bin`;
    /// with `eos`, a position of the stream of documents and end tokens)
    /// and, inside a document, the document.
    fn place(&self, k: usize, seq_len: usize, windows: DocumentWindows) -> (u64, usize) {
        match windows {
            DocumentWindows::Packed { .. } => (k as u64 * seq_len as u64, 0),
            DocumentWindows::WithinDocument { .. } => {
                let k = k as u64;
                let j = self.windows_before.partition_point(|&b| b <= k) - 1;
                let (mut d, mut before) = (j * STRIDE, self.windows_before[j]);
                // At most `STRIDE` documents on (bounded also when a
                // damaged `.idx` reads as zeros: the read reports it).
                let last = (d + STRIDE).min(self.documents()) - 1;
                let mut start = self.starts.get(d);
                while d < last {
                    let end = self.starts.get(d + 1);
                    let n = windows_between(start, end, seq_len);
                    if k < before + n {
                        break;
                    }
                    (before, start, d) = (before + n, end, d + 1);
                }
                let off = k.saturating_sub(before) * seq_len as u64;
                (start + off, d)
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
        // A damaged mapping is not read again (each fault costs mappings).
        self.starts.check()?;
        let (first, d) = self.place(k, seq_len, windows);
        let n = match windows {
            DocumentWindows::Packed { eos: None } => {
                self.bin.read_into(first as usize, out)?;
                out.len()
            }
            DocumentWindows::Packed { eos: Some(eos) } => {
                self.read_with_eos(first, eos, out)?;
                out.len()
            }
            DocumentWindows::WithinDocument { .. } => {
                let n = (self.starts.get(d + 1).saturating_sub(first)).min(out.len() as u64);
                self.bin.read_into(first as usize, &mut out[..n as usize])?;
                n as usize
            }
        };
        // Positions read from a `.idx` cut while mapped are zeros: the
        // window may be the wrong tokens.
        self.starts.check()?;
        Ok(n)
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
            if self.starts.get(mid) + mid as u64 <= pos {
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
            let (start, end) = (self.starts.get(d), self.starts.get(d + 1));
            let len = end.saturating_sub(start);
            let off = pos.saturating_sub(start + d as u64);
            if off < len {
                let n = ((len - off) as usize).min(out.len() - at);
                self.bin
                    .read_into((start + off) as usize, &mut out[at..at + n])?;
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
                let off = first.saturating_sub(self.starts.get(d));
                format!("{}#doc{d}@{off}", self.name)
            }
        }
    }
}

/// What a `.idx` says, checked: the tokens' type and where each
/// document starts.
struct Index {
    ty: TokenType,
    starts: Starts,
}

/// Each document's first token, then the token count, read from a
/// checked `.idx`'s arrays in place: document `d` starts at the offset of
/// its first sequence (its boundary), in tokens, or at the end when that
/// boundary is the sequence count (a document of no sequences at the end).
#[derive(Debug)]
struct Starts {
    bytes: Backing,
    /// The `.idx`, for errors.
    path: PathBuf,
    /// Sequences.
    sequences: usize,
    /// Document boundaries (documents + 1).
    bounds: usize,
    /// Bytes a token.
    item: u64,
    /// Tokens in every sequence.
    total: u64,
}

impl Starts {
    /// Little-endian `u64` number `i` of the array at byte `base`.
    fn u64_at(&self, base: usize, i: usize) -> u64 {
        let at = base + 8 * i;
        let b = &self.bytes.bytes()[at..at + 8];
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    }

    /// Documents.
    fn documents(&self) -> usize {
        self.bounds - 1
    }

    /// Document `d`'s first token; for `d` = the documents, the tokens.
    fn get(&self, d: usize) -> u64 {
        let pointers = HEADER as usize + 4 * self.sequences;
        let bounds = pointers + 8 * self.sequences;
        let seq = self.u64_at(bounds, d) as usize;
        if seq >= self.sequences {
            return self.total;
        }
        self.u64_at(pointers, seq) / self.item
    }

    /// An error when the `.idx` was cut short while mapped (what was read
    /// from it since is zeros).
    fn check(&self) -> Result<()> {
        if !self.bytes.damaged() {
            return Ok(());
        }
        Err(Error::Dataset {
            path: self.path.clone(),
            reason: "the index was cut short while it was read: its arrays are gone".into(),
            source: None,
        })
    }
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

/// Maps and checks `path`, a Megatron `.idx` (a URL's object fetched to
/// a local copy first: the remote cache's directory keeps it for the
/// node's other processes and later runs).
fn read_index(path: &Path) -> Result<Index> {
    parse_index(path, crate::storage::map_backed(path, None)?)
}

/// Checks the `.idx` in `bytes` (named `path` in errors) in one pass over
/// its arrays, keeping nothing per sequence.
fn parse_index(path: &Path, bytes: Backing) -> Result<Index> {
    let bad = |reason: String| Error::Dataset {
        path: path.to_path_buf(),
        reason,
        source: None,
    };
    let b = bytes.bytes();
    let size = b.len() as u64;
    if size < HEADER {
        return Err(bad(format!(
            "{size} bytes cannot hold a Megatron index's {HEADER}-byte header"
        )));
    }
    if &b[..9] != MAGIC {
        return Err(bad(format!(
            "starts {:?}, not Megatron's {:?}: not a Megatron index",
            String::from_utf8_lossy(&b[..9]),
            String::from_utf8_lossy(MAGIC)
        )));
    }
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    let version = u64_at(9);
    if version != 1 {
        return Err(bad(format!(
            "index version {version}: only version 1 is read"
        )));
    }
    let ty = token_type(b[17]).map_err(bad)?;
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
    // The arrays fit in the mapped bytes, so their counts fit in usize.
    let (n, m) = (n as usize, m as usize);
    let item = ty.size() as u64;
    let (lengths, pointers) = (HEADER as usize, HEADER as usize + 4 * n);
    let bounds = pointers + 8 * n;

    // Each offset against the lengths before it.
    let mut expected = 0u64;
    for i in 0..n {
        let len = i32::from_le_bytes(b[lengths + 4 * i..][..4].try_into().expect("4"));
        let len = u32::try_from(len).map_err(|_| bad(format!("sequence {i} has length {len}")))?;
        let pointer = i64::from_le_bytes(b[pointers + 8 * i..][..8].try_into().expect("8"));
        if u64::try_from(pointer) != Ok(expected * item) {
            return Err(bad(format!(
                "sequence {i} starts at byte {pointer} of the .bin; after the lengths before \
                 it, byte {} (the builder writes sequences back to back)",
                expected * item
            )));
        }
        expected += u64::from(len);
    }

    // Boundaries: from 0, never decreasing, ending at `n`.
    let mut last = 0u64;
    for i in 0..m {
        let at = i64::from_le_bytes(b[bounds + 8 * i..][..8].try_into().expect("8"));
        let at = u64::try_from(at)
            .ok()
            .filter(|&a| a >= last && a <= n as u64)
            .ok_or_else(|| {
                bad(format!(
                    "document boundary {i} is sequence {at}: boundaries run from 0 to the {n} \
                     sequences, never decreasing"
                ))
            })?;
        if i == 0 && at != 0 {
            return Err(bad(format!("the first document boundary is {at}, not 0")));
        }
        last = at;
    }
    if last != n as u64 {
        return Err(bad(format!(
            "the last document boundary is sequence {last}, not the end ({n}): sequences past \
             it belong to no document"
        )));
    }
    let starts = Starts {
        bytes,
        path: path.to_path_buf(),
        sequences: n,
        bounds: m,
        item,
        total: expected,
    };
    // Read through a mapping cut meanwhile: zeros, not the file.
    starts.check()?;
    Ok(Index { ty, starts })
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
