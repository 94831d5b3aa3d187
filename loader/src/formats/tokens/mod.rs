//! Language-model token files, memory-mapped, in the two layouts LLM
//! trainers already write, and the windows of `seq_len + 1` tokens a
//! training step reads from them.
//!
//! - **Raw** tokens of one integer type and nothing else: `u16` for
//!   nanoGPT's and llama2.c's `train.bin`; any [`TokenType`] for a
//!   Megatron `.bin` (its type is in the `.idx`: see
//!   [`Megatron`]) or a NumPy `tofile` dump.
//! - **llm.c shards**: a header of 256 little-endian `i32` (magic
//!   20240520, version 1, token count), then that many `u16` tokens. The
//!   header is checked against the file's size before any token is read.
//!
//! A window never crosses a file's end. [`TokenWindows::plan`] gives an
//! epoch's window starts for one rank: every token used once as an input
//! (non-overlapping windows; the last token of each is the next one's
//! first, as the target of the last input) or at random offsets, a pure
//! function of `(seed, epoch)`, dealt to ranks in equal counts.
//!
//! [`TokenSource`] is these windows as a loader's source, and its map
//! writes each window as the `tokens` batch field, with `input` / `target`
//! as its views.

mod file;
pub(crate) mod megatron;
mod windows;

pub use file::{TokenFile, TokenLayout, TokenType};
pub use megatron::{DocumentWindows, Megatron};
pub use windows::{TokenWindows, WindowOrder, WindowStart};

use crate::contract::{check_index, reads_through, Parts, Record, Source, Value};
use crate::error::Result;

/// A source of token windows for language-model training: sample `k` is
/// the `k`-th non-overlapping window of `seq_len + 1` tokens over the
/// files, in order ([`TokenWindows::fixed_window`]). The loader's sampler
/// shuffles, batches and shards them like any source's samples; its map
/// ([`TokenWindowsMap`](crate::map::TokenWindowsMap)) writes each window
/// straight from the memory maps, and the batch gives `input` and `target`
/// as views of it.
///
/// ```no_run
/// use candle_wick::map::TokenWindowsMap;
/// use candle_wick::source::{TokenFile, TokenSource, WindowOrder};
/// use candle_wick::Loader;
/// # fn main() -> candle_wick::Result<()> {
/// let tokens = TokenSource::new(vec![TokenFile::open("train.bin")?], 1024, WindowOrder::NonOverlapping)?;
/// let mut loader = Loader::builder(tokens.clone())
///     .map(TokenWindowsMap::new(&tokens))
///     .batch_size(32)
///     .shuffle(1337)
///     .build()?;
/// for batch in loader.epoch(0) {
///     let batch = batch?;
///     let (x, y) = (batch.get("input")?, batch.get("target")?); // u32 [32, 1024]
///     # let _ = (x, y);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TokenSource {
    inner: std::sync::Arc<TokenInner>,
}

#[derive(Debug)]
struct TokenInner {
    files: Vec<TokenFile>,
    /// Each file's path as text, for the keys.
    names: Vec<String>,
    /// The windows, planned for one rank (the loader shards).
    windows: TokenWindows,
    order: WindowOrder,
}

impl TokenSource {
    /// Windows of `seq_len + 1` tokens over `files`, placed by `order`:
    /// [`WindowOrder::NonOverlapping`] (with the loader's shuffle, every
    /// token an input once per epoch) or [`WindowOrder::Random`] (each
    /// sample at a random offset, drawn from `(seed, epoch, index)` with
    /// the loader's seed). An error when no file holds a window.
    pub fn new(files: Vec<TokenFile>, seq_len: usize, order: WindowOrder) -> Result<Self> {
        let lens = files.iter().map(TokenFile::len).collect();
        // The seed of random windows is the loader's, given per sample.
        let windows = TokenWindows::new(lens, seq_len, order, 0, (0, 1))?;
        Ok(Self {
            inner: std::sync::Arc::new(TokenInner {
                names: files
                    .iter()
                    .map(|f| f.path().display().to_string())
                    .collect(),
                files,
                windows,
                order,
            }),
        })
    }

    /// Tokens per input (and per target).
    pub fn seq_len(&self) -> usize {
        self.inner.windows.seq_len
    }

    /// The files.
    pub fn files(&self) -> &[TokenFile] {
        &self.inner.files
    }

    /// Where sample `index` of `epoch` starts, for a loader seeded `seed`.
    pub fn window(&self, seed: u64, epoch: u64, index: usize) -> Result<WindowStart> {
        let w = &self.inner.windows;
        check_index(index, w.total())?;
        Ok(match self.inner.order {
            WindowOrder::NonOverlapping => w.fixed_window(index).expect("index checked"),
            WindowOrder::Random => w.random_window_seeded(seed, epoch, index),
        })
    }
}

impl Source for TokenSource {
    fn len(&self) -> usize {
        self.inner.windows.total()
    }

    reads_through!(read_reusing);

    /// A record with no bytes: the map reads the tokens from the memory
    /// map itself. Its key names the window for the non-overlapping
    /// order, the sample for the random one (whose offset depends on the
    /// epoch).
    fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
        window_record(self, index, bytes)
    }

    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let record = self.read_reusing(index, bytes)?;
        if !parts.wants("tokens") || self.inner.order != WindowOrder::NonOverlapping {
            return Ok(record);
        }
        let w = self.window(0, 0, index)?;
        let mut tokens = vec![0; self.seq_len() + 1];
        self.inner.files[w.file].read_into(w.token, &mut tokens)?;
        Ok(record.with_part("tokens", Value::Tokens(tokens)))
    }

    fn key(&self, index: usize) -> String {
        match (self.inner.order, self.inner.windows.fixed_window(index)) {
            (WindowOrder::NonOverlapping, Some(w)) => {
                // Sized once and written without `fmt`: a key a sample, and
                // `format!` grew each one and went through the formatter
                // (a cheap map's samples are dominated by such costs).
                window_key(&self.inner.names[w.file], w.token)
            }
            _ => format!("window #{index}"),
        }
    }

    /// Each file's name, layout and length in order, the window length and
    /// the window order: what decides which tokens a window holds.
    fn digest(&self) -> u32 {
        let inner = &*self.inner;
        let text = format!(
            "tokens seq_len {} order {:?}",
            inner.windows.seq_len, inner.order
        );
        inner
            .files
            .iter()
            .fold(crc32c::crc32c(text.as_bytes()), |crc, f| {
                let name = f.path().file_name().unwrap_or(f.path().as_os_str());
                let crc = crc32c::crc32c_append(crc, name.as_encoded_bytes());
                // "RawU16" as before raw files had other types: states
                // saved then still resume.
                let layout = match f.layout() {
                    TokenLayout::Raw(TokenType::U16) => "RawU16".to_string(),
                    other => format!("{other:?}"),
                };
                let crc = crc32c::crc32c_append(crc, format!(" {layout} ").as_bytes());
                crc32c::crc32c_append(crc, &(f.len() as u64).to_le_bytes())
            })
    }
}

/// Window `index` of a token source as a record: its key and no bytes
/// (`bytes` emptied, its capacity kept); the map reads the tokens.
pub(super) fn window_record(
    source: &dyn Source,
    index: usize,
    mut bytes: Vec<u8>,
) -> Result<Record> {
    check_index(index, source.len())?;
    bytes.clear();
    Ok(Record::encoded(source.key(index), bytes, 0))
}

/// `name@token`, sized once and written without the formatter (`itoa`).
pub(super) fn window_key(name: &str, token: usize) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(token);
    let mut key = String::with_capacity(name.len() + 1 + digits.len());
    key.push_str(name);
    key.push('@');
    key.push_str(digits);
    key
}

#[cfg(test)]
mod tests {
    use super::file::{LLMC_HEADER_INTS, LLMC_MAGIC};
    use super::*;
    use crate::error::Error;
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};

    #[test]
    fn decimal_keys_match_the_formatter() {
        for n in [0, 7, 10, 99, 1024, 4_294_967_296, usize::MAX] {
            let s = window_key("f", n);
            assert_eq!(s, format!("f@{n}"));
        }
    }

    fn raw(dir: &Path, name: &str, tokens: &[u16]) -> PathBuf {
        let path = dir.join(name);
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// A file cut short while mapped: the read that meets a lost page is an
    /// error naming the file (not SIGBUS), and so is every read after it;
    /// a second file mapped meanwhile is not affected.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_file_truncated_while_mapped_is_an_error_not_sigbus() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u16> = (0..65_536u32).map(|i| (i % 50_000) as u16).collect();
        let path = raw(dir.path(), "cut.bin", &tokens);
        let other = TokenFile::open(raw(dir.path(), "other.bin", &tokens)).unwrap();
        let file = TokenFile::open(&path).unwrap();
        assert!(file.guard.guarded());
        let mut out = vec![0u32; 1025];
        file.read_into(60_000, &mut out).unwrap();
        assert_eq!(out[0], 10_000);
        // Cut to one page (2,048 tokens).
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(4096).unwrap();
        drop(f);
        let err = file.read_into(60_000, &mut out).unwrap_err();
        let text = crate::error::error_chain(&err);
        assert!(
            text.contains("cut.bin") && text.contains("truncated while it was read"),
            "{text}"
        );
        assert!(file.read_into(0, &mut out).is_err(), "every read after it");
        assert_eq!(file.get(0), None);
        other.read_into(60_000, &mut out).unwrap();
        assert_eq!((out[0], other.get(1)), (10_000, Some(1)));
    }

    fn cut(path: &Path, len: u64) {
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_len(len).unwrap();
    }

    /// A cut inside a page leaves that page mapped, zeros past the new
    /// end, with no fault: a read there is still an error naming the file,
    /// never zeros.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_cut_inside_a_page_is_an_error_not_zeros() {
        let dir = tempfile::tempdir().unwrap();
        // 3 pages, no zero token.
        let tokens: Vec<u16> = (0..6144u32).map(|i| (i % 50_000 + 1) as u16).collect();
        let path = raw(dir.path(), "cut.bin", &tokens);
        let file = TokenFile::open(&path).unwrap();
        let mut out = vec![0u32; 100];
        file.read_into(2304, &mut out).unwrap();
        cut(&path, 4096 + 512);
        // Tokens 2,048..2,304 are still the file's; 2,304.. are zeros now.
        file.read_into(2048, &mut out[..10]).unwrap();
        assert_eq!(out[0], 2049);
        let err = file.read_into(2304, &mut out).unwrap_err();
        assert!(crate::error::error_chain(&err).contains("cut.bin"), "{err}");
        // A read ending just past the cut, and every read from then on.
        assert!(file.read_into(2250, &mut out).is_err());
        assert!(file.read_into(0, &mut out).is_err());
        assert_eq!(file.get(2400), None);
    }

    /// Once damaged, a file is not touched again: a truncated file read on
    /// (under the skip policy, say) does not fault page after page until
    /// the process runs out of mappings.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_damaged_file_stops_faulting() {
        let dir = tempfile::tempdir().unwrap();
        // 4 MiB of tokens: 1,024 pages.
        let tokens: Vec<u16> = (0..(2u32 << 20)).map(|i| (i % 50_000 + 1) as u16).collect();
        let path = raw(dir.path(), "big.bin", &tokens);
        let file = TokenFile::open(&path).unwrap();
        cut(&path, 0);
        let maps = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .count()
        };
        let before = maps();
        for p in (0..1024).step_by(2) {
            assert!(file.read_into(p * 2048, &mut [0u32; 8]).is_err());
        }
        // (Other tests' threads map and unmap meanwhile: a margin.)
        let grown = maps().saturating_sub(before);
        assert!(grown < 64, "{grown} new mappings for 512 reads");
    }

    /// A page that faulted while the file kept (or got back) its size is
    /// a transient error: the file is mapped anew and the next read is the
    /// file's again, not an error for the life of the process.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_fault_on_a_whole_file_is_transient_and_mapped_anew() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u16> = (0..8192u32).map(|i| (i % 50_000 + 1) as u16).collect();
        let path = raw(dir.path(), "flaky.bin", &tokens);
        let file = TokenFile::open(&path).unwrap();
        let mut out = vec![0u32; 64];
        // Cut at a page: the read faults (as an I/O error on page-in does).
        cut(&path, 4096);
        let err = file.read_into(6000, &mut out).unwrap_err();
        assert!(!err.is_transient(), "a truncation is not transient: {err}");
        assert!(file.read_into(6000, &mut out).is_err(), "still cut");
        // The same bytes back, at the same size.
        raw(dir.path(), "flaky.bin", &tokens);
        let err = file.read_into(6000, &mut out).unwrap_err();
        assert!(err.is_transient(), "{err}");
        file.read_into(6000, &mut out).unwrap();
        assert_eq!(out[0], 6001);
        assert_eq!(file.get(8191), Some(8192));
    }

    fn llmc(dir: &Path, name: &str, tokens: &[u16], header: [i32; 3]) -> PathBuf {
        let path = dir.join(name);
        let mut h = [0i32; LLMC_HEADER_INTS];
        h[..3].copy_from_slice(&header);
        let mut bytes: Vec<u8> = h.iter().flat_map(|i| i.to_le_bytes()).collect();
        bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn both_layouts_read_the_tokens_written() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<u16> = (0..1000u32).map(|i| (i * 7919 % 65536) as u16).collect();
        let a = TokenFile::open(raw(dir.path(), "train.bin", &tokens)).unwrap();
        let n = tokens.len() as i32;
        let b = TokenFile::open(llmc(dir.path(), "s.bin", &tokens, [LLMC_MAGIC, 1, n])).unwrap();
        assert_eq!(
            (a.layout(), b.layout()),
            (TokenLayout::Raw(TokenType::U16), TokenLayout::LlmC)
        );
        for f in [&a, &b] {
            assert_eq!(f.len(), 1000);
            assert_eq!(f.get(999), Some(u32::from(tokens[999])));
            assert_eq!(f.get(1000), None);
            let mut w = vec![0u32; 65];
            f.read_into(100, &mut w).unwrap();
            let want: Vec<u32> = tokens[100..165].iter().map(|&t| t.into()).collect();
            assert_eq!(w, want);
            let err = f.read_into(990, &mut w).unwrap_err().to_string();
            assert!(err.contains("past the file"), "{err}");
            // A hint anywhere, past the end too, reads and changes nothing.
            for (first, len) in [(0, 65), (990, 65), (1000, 1), (usize::MAX, 2)] {
                f.prefetch(first, len);
            }
            f.read_into(100, &mut w).unwrap();
            assert_eq!(w, want);
        }
    }

    #[test]
    fn a_bad_header_or_size_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let t = [1u16, 2, 3, 4];
        let cases = [
            (
                llmc(dir.path(), "short.bin", &t, [LLMC_MAGIC, 1, 5]),
                "says 5 tokens",
            ),
            (
                llmc(dir.path(), "long.bin", &t, [LLMC_MAGIC, 1, 3]),
                "says 3 tokens",
            ),
            (
                llmc(dir.path(), "neg.bin", &t, [LLMC_MAGIC, 1, -1]),
                "negative",
            ),
            (
                llmc(dir.path(), "v2.bin", &t, [LLMC_MAGIC, 2, 4]),
                "version 2",
            ),
        ];
        for (path, want) in cases {
            let err = TokenFile::open(&path).unwrap_err().to_string();
            assert!(
                err.contains(want) && err.contains(path.to_str().unwrap()),
                "{err}"
            );
        }
        let odd = dir.path().join("odd.bin");
        std::fs::write(&odd, [1u8, 2, 3]).unwrap();
        let err = TokenFile::open(&odd).unwrap_err().to_string();
        assert!(
            err.contains("whole number") && err.contains("odd.bin"),
            "{err}"
        );
        let tiny = dir.path().join("tiny.bin");
        std::fs::write(&tiny, [0u8; 8]).unwrap();
        let err = TokenFile::open_as(&tiny, TokenLayout::LlmC)
            .unwrap_err()
            .to_string();
        assert!(err.contains("header"), "{err}");
        let err = TokenFile::open(dir.path().join("missing.bin")).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
    }

    #[test]
    fn a_non_overlapping_epoch_uses_every_token_once_across_disjoint_ranks() {
        // Files of 100, 41 and 7 tokens, windows of 10 + 1.
        let lens = vec![100, 41, 7];
        let plans: Vec<Vec<WindowStart>> = (0..3)
            .map(|rank| {
                let w =
                    TokenWindows::new(lens.clone(), 10, WindowOrder::NonOverlapping, 5, (rank, 3))
                        .unwrap();
                w.plan(2)
            })
            .collect();
        // 9 + 4 + 0 windows: 4 per rank, one left out this epoch.
        assert!(plans.iter().all(|p| p.len() == 4), "{plans:?}");
        let all: HashSet<WindowStart> = plans.iter().flatten().copied().collect();
        assert_eq!(all.len(), 12, "ranks are disjoint");
        for s in &all {
            assert_eq!(s.token % 10, 0);
            assert!(s.token + 11 <= lens[s.file], "{s:?} runs past its file");
        }
        // Over one rank, every window start of the epoch at most once;
        // with one rank, each input token exactly once.
        let one =
            TokenWindows::new(lens.clone(), 10, WindowOrder::NonOverlapping, 5, (0, 1)).unwrap();
        let mut inputs = vec![0u32; 148];
        let offset = [0, 100, 141];
        for s in one.plan(0) {
            for t in s.token..s.token + 10 {
                inputs[offset[s.file] + t] += 1;
            }
        }
        assert!(
            inputs[..90].iter().all(|&c| c == 1),
            "file 0's first 90 tokens once"
        );
        assert!(
            inputs[100..140].iter().all(|&c| c == 1),
            "file 1's first 40 once"
        );
        assert_ne!(one.plan(0), one.plan(1), "a new order every epoch");
        assert_eq!(
            one.plan(1),
            one.plan(1),
            "the same order for the same epoch"
        );
    }

    #[test]
    fn random_windows_stay_inside_their_file_and_follow_the_seed() {
        let lens = vec![50, 500];
        let w = TokenWindows::new(lens.clone(), 16, WindowOrder::Random, 9, (1, 2)).unwrap();
        let plan = w.plan(3);
        assert_eq!(plan.len(), w.per_rank());
        assert!(plan.iter().all(|s| s.token + 17 <= lens[s.file]));
        assert_eq!(plan, w.plan(3));
        assert_ne!(plan, w.plan(4));
    }

    #[test]
    fn impossible_settings_are_errors() {
        let w = |lens: Vec<usize>, seq, ranks| {
            TokenWindows::new(lens, seq, WindowOrder::NonOverlapping, 0, ranks)
        };
        assert!(w(vec![100], 0, (0, 1)).is_err());
        assert!(w(vec![100], 10, (2, 2)).is_err());
        let err = w(vec![21], 10, (0, 3)).unwrap_err().to_string();
        assert!(err.contains("fewer than the 3 ranks"), "{err}");
    }
}
