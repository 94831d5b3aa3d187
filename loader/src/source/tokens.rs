//! Language-model token files, memory-mapped, in the two layouts LLM
//! trainers already write, and the windows of `seq_len + 1` tokens a
//! training step reads from them.
//!
//! - **Raw** tokens of one integer type and nothing else: `u16` for
//!   nanoGPT's and llama2.c's `train.bin`; any [`TokenType`] for a
//!   Megatron `.bin` (its type is in the `.idx`: see
//!   [`Megatron`](super::Megatron)) or a NumPy `tofile` dump.
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

use super::shards::open_shard;
use super::{check_index, Parts, Record, Source, Value};
use crate::error::{Error, Result};
use crate::rng::{keyed_rng, Purpose};
use memmap2::Mmap;
use rand::seq::SliceRandom;
use rand::Rng;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// llm.c's header: this many little-endian `i32`.
const LLMC_HEADER_INTS: usize = 256;
/// llm.c's magic number (`header[0]`).
const LLMC_MAGIC: i32 = 20240520;
/// The llm.c header version of `u16` tokens (`header[1]`).
const LLMC_VERSION_U16: i32 = 1;

/// How a token file stores its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenLayout {
    /// Little-endian tokens of one type, nothing else: `Raw(TokenType::U16)`
    /// is nanoGPT's `train.bin`.
    Raw(TokenType),
    /// llm.c: a 1 KiB header (magic, version, count), then `u16` tokens.
    LlmC,
}

/// The integer type of a token file's tokens, little-endian. Every token
/// is read as a `u32`: a negative one, or an `i64` over `u32::MAX`, is an
/// error naming the file and the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenType {
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`: vocabularies under 65,536 (GPT-2's 50,257).
    U16,
    /// `i16`.
    I16,
    /// `i32`: Megatron's type for vocabularies of 65,500 and more.
    I32,
    /// `u32`.
    U32,
    /// `i64`.
    I64,
}

impl TokenType {
    /// Bytes a token.
    pub fn size(self) -> usize {
        match self {
            TokenType::U8 | TokenType::I8 => 1,
            TokenType::U16 | TokenType::I16 => 2,
            TokenType::I32 | TokenType::U32 => 4,
            TokenType::I64 => 8,
        }
    }

    /// Widens the tokens in `bytes` into `out` (as many as `out` holds);
    /// `Err(i)` when token `i` is not a `u32` (negative, or too large).
    fn widen(self, bytes: &[u8], out: &mut [u32]) -> std::result::Result<(), usize> {
        macro_rules! each {
            ($t:ty) => {{
                const N: usize = std::mem::size_of::<$t>();
                for (i, (o, b)) in out.iter_mut().zip(bytes.chunks_exact(N)).enumerate() {
                    let v = <$t>::from_le_bytes(b.try_into().expect("N bytes"));
                    *o = u32::try_from(v).map_err(|_| i)?;
                }
            }};
        }
        match self {
            // The common types first, without a check that cannot fail.
            TokenType::U16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = u32::from(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            TokenType::U8 => {
                for (o, b) in out.iter_mut().zip(bytes) {
                    *o = u32::from(*b);
                }
            }
            TokenType::I8 => each!(i8),
            TokenType::I16 => each!(i16),
            TokenType::I32 => each!(i32),
            TokenType::U32 => each!(u32),
            TokenType::I64 => each!(i64),
        }
        Ok(())
    }
}

/// One memory-mapped token file.
///
/// The mapping is read-only and every read is bounds-checked. Do not write
/// to the file in place while it is read (its bytes would change under a
/// reader); replacing it by a rename is fine.
///
/// A file cut short while it is read is an error naming it, never tokens
/// that are not the file's (on Linux, while at most 4,096 token files are
/// open; elsewhere such a read is `SIGBUS`, which ends the process):
/// - a read that meets a page past the new end faults; the fault is
///   caught (see `source/mapguard.rs`) and the read fails;
/// - a read inside the page that holds the new end does not fault (the
///   kernel keeps that page, zeros past the end): such a read ends in a
///   zero byte, and a read whose last byte is zero checks the file's size
///   (one `fstat`, for the few reads whose last token is below 256);
/// - once damaged, the file is not touched again (each read checks its
///   size instead), so no truncation can exhaust the process's mappings.
///
/// A page that could not be read while the file kept its size (a network
/// or FUSE file system's transient error) is not a truncation: the file
/// is mapped anew and the read fails with a transient error (EIO), which
/// [`retry(n)`](crate::LoaderBuilder::retry) retries. A file that was cut
/// and later restored to its size reads again the same way.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    /// Declared before `map`, so it is unregistered before the unmap.
    guard: super::mapguard::Guard,
    map: Mmap,
    /// The open file: its size is checked against `bytes`, and it is
    /// mapped anew after a page could not be read.
    file: std::fs::File,
    /// The file's size when it was opened.
    bytes: u64,
    /// Counts the times the file was mapped anew: a read during which it
    /// changed may have read the zeros a fault left, and fails.
    remaps: std::sync::atomic::AtomicU64,
    /// One recovery at a time.
    recovering: std::sync::Mutex<()>,
    /// Where the tokens start, in bytes.
    start: usize,
    len: usize,
    layout: TokenLayout,
}

impl TokenFile {
    /// Opens `path`: an llm.c shard when it starts with llm.c's magic
    /// number, raw `u16` tokens otherwise (another type: [`open_as`](Self::open_as)
    /// with [`TokenLayout::Raw`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::with_layout(path.as_ref(), None)
    }

    /// Opens `path` as `layout`, checking the file against it.
    pub fn open_as(path: impl AsRef<Path>, layout: TokenLayout) -> Result<Self> {
        Self::with_layout(path.as_ref(), Some(layout))
    }

    /// Opens `path` as `layout`, or as its first bytes say.
    fn with_layout(path: &Path, layout: Option<TokenLayout>) -> Result<Self> {
        let bad = |reason: String| Error::Dataset {
            path: path.to_path_buf(),
            reason,
            source: None,
        };
        let (file, bytes, map) = map(path)?;
        // Guarded before the header is read.
        let guard = super::mapguard::Guard::new(&map);
        let layout = layout.unwrap_or(match map.get(..4) {
            Some(m) if i32::from_le_bytes(m.try_into().expect("4 bytes")) == LLMC_MAGIC => {
                TokenLayout::LlmC
            }
            _ => TokenLayout::Raw(TokenType::U16),
        });
        let size = map.len();
        let (start, len) = match layout {
            TokenLayout::LlmC => {
                let header_bytes = 4 * LLMC_HEADER_INTS;
                if size < header_bytes {
                    return Err(bad(format!(
                        "{size} bytes cannot hold llm.c's {header_bytes}-byte header"
                    )));
                }
                let int = |i: usize| {
                    i32::from_le_bytes(map[4 * i..4 * i + 4].try_into().expect("4 bytes"))
                };
                let (magic, version, count) = (int(0), int(1), int(2));
                if magic != LLMC_MAGIC {
                    return Err(bad(format!(
                        "llm.c magic is {magic}, not {LLMC_MAGIC}: not an llm.c token shard"
                    )));
                }
                if version != LLMC_VERSION_U16 {
                    return Err(bad(format!(
                        "llm.c version {version}: only version {LLMC_VERSION_U16} (u16 tokens) \
                         is read"
                    )));
                }
                let count = usize::try_from(count)
                    .map_err(|_| bad(format!("llm.c token count {count} is negative")))?;
                let want = count
                    .checked_mul(2)
                    .and_then(|b| b.checked_add(header_bytes));
                if want != Some(size) {
                    return Err(bad(format!(
                        "the llm.c header says {count} tokens ({} bytes with the header), \
                         the file has {size} bytes",
                        want.map_or("too many".to_string(), |w| w.to_string())
                    )));
                }
                (header_bytes, count)
            }
            TokenLayout::Raw(ty) => {
                if !size.is_multiple_of(ty.size()) {
                    return Err(bad(format!(
                        "{size} bytes is not a whole number of {ty:?} tokens ({} bytes each)",
                        ty.size()
                    )));
                }
                (0, size / ty.size())
            }
        };
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        if guard.damaged() {
            return Err(bad(
                "the file was truncated while its header was read".into()
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            guard,
            map,
            file,
            bytes,
            remaps: Default::default(),
            recovering: Default::default(),
            start,
            len,
            layout,
        })
    }

    /// Whether the mapping is guarded against a truncation while it is
    /// read (on Linux, while at most 4,096 token files are open).
    pub fn is_guarded(&self) -> bool {
        self.guard.guarded()
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the file stores its tokens.
    pub fn layout(&self) -> TokenLayout {
        self.layout
    }

    /// Tokens in the file.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the file holds no token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The type of the file's tokens.
    pub fn token_type(&self) -> TokenType {
        match self.layout {
            TokenLayout::Raw(ty) => ty,
            TokenLayout::LlmC => TokenType::U16,
        }
    }

    /// Token `i`; `None` past the end, when it is not a `u32` (negative),
    /// or when it cannot be read as the file's (the file was cut short, or
    /// a page of it could not be read).
    pub fn get(&self, i: usize) -> Option<u32> {
        let mut one = [0];
        self.read_into(i, &mut one).ok().map(|()| one[0])
    }

    /// Runs `read` over `bytes` (a range of the map) when the file is
    /// whole, and checks afterwards that what it read was the file's:
    /// the read's own fault, a recovery during it, or (a last byte of
    /// zero) a cut inside the page at the new end fail it.
    fn guarded_read<T>(&self, bytes: &[u8], read: impl FnOnce(&[u8]) -> T) -> Result<T> {
        let remaps = self.remaps.load(Ordering::Acquire);
        if self.guard.damaged() {
            return Err(self.recover());
        }
        let value = read(bytes);
        // The loads above stay before the checks below (a signal fence:
        // the fault, and so the mark, come from this thread's loads).
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        if self.guard.damaged() || self.remaps.load(Ordering::Acquire) != remaps {
            return Err(self.recover());
        }
        // A cut inside a page leaves that page mapped with zeros past the
        // new end, which read without a fault: the read's bytes from the
        // end on are zero, its last token among them.
        let width = self.token_type().size();
        let last = &bytes[bytes.len().saturating_sub(width)..];
        if !last.is_empty() && last.iter().all(|&b| b == 0) && self.cut_short() {
            self.guard.mark();
            return Err(self.truncated());
        }
        Ok(value)
    }

    /// Whether the file is shorter now than when it was opened.
    fn cut_short(&self) -> bool {
        self.file.metadata().is_ok_and(|m| m.len() < self.bytes)
    }

    /// After a read met damage: the truncation's error while the file is
    /// short; otherwise (a page could not be read, or the file was
    /// restored to its size) the file is mapped anew and the read fails
    /// with a transient error, which a retry reads again.
    fn recover(&self) -> Error {
        let _one = crate::lock(&self.recovering);
        let size = match self.file.metadata() {
            Ok(m) => m.len(),
            Err(source) => {
                return Error::Io {
                    path: self.path.clone(),
                    source,
                }
            }
        };
        if size < self.bytes {
            self.guard.mark();
            return self.truncated();
        }
        if self.guard.damaged() {
            if let Err(source) = self.remap() {
                return Error::Io {
                    path: self.path.clone(),
                    source,
                };
            }
            // Counted before the mark is cleared: a reader that sees the
            // mark cleared sees the count changed, and fails its read.
            self.remaps.fetch_add(1, Ordering::AcqRel);
            self.guard.clear();
        }
        Error::Dataset {
            path: self.path.clone(),
            reason: format!(
                "a page of the file could not be read (it still holds its {} bytes): mapped \
                 anew, a retry reads it again",
                self.bytes
            ),
            source: Some(Box::new(std::io::Error::from_raw_os_error(5))),
        }
    }

    /// Maps the file anew over the whole mapping, in place: the pages a
    /// fault replaced with zeros are the file's again.
    fn remap(&self) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            use std::os::unix::io::AsRawFd;
            // SAFETY: the range is this value's own mapping (alive: `&self`
            // is borrowed), of the same length, file and protection;
            // MAP_FIXED replaces its pages in one step, so a concurrent
            // reader meets either the old page or the file's (the same
            // bytes for every page the file still has; a page of zeros is
            // what a reader discards on seeing the remap count change).
            // Memmap's later unmap covers the same range.
            let p = unsafe {
                libc::mmap(
                    self.map.as_ptr() as *mut libc::c_void,
                    self.map.len(),
                    libc::PROT_READ,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    self.file.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// The error of a read once the file was found cut short.
    fn truncated(&self) -> Error {
        Error::Dataset {
            path: self.path.clone(),
            reason: format!(
                "the file was truncated while it was read (it held {} tokens when opened); \
                 its reads fail until it has its size again",
                self.len
            ),
            source: None,
        }
    }

    /// Copies tokens `first..first + out.len()` into `out`, widened to
    /// `u32` (a window's input, or its target from `first + 1`). An error
    /// names the file when the range runs past its end.
    pub fn read_into(&self, first: usize, out: &mut [u32]) -> Result<()> {
        let end = first.checked_add(out.len()).filter(|&e| e <= self.len);
        let Some(end) = end else {
            return Err(Error::Dataset {
                path: self.path.clone(),
                reason: format!(
                    "tokens {first}..{} are past the file's {} tokens",
                    first.saturating_add(out.len()),
                    self.len
                ),
                source: None,
            });
        };
        let ty = self.token_type();
        let bytes = &self.map[self.start + ty.size() * first..self.start + ty.size() * end];
        self.guarded_read(bytes, |bytes| ty.widen(bytes, out))?
            .map_err(|i| Error::Dataset {
                path: self.path.clone(),
                reason: format!(
                    "token {} is not a token id (negative, or over {}): the file's {ty:?} \
                     tokens are read as u32",
                    first + i,
                    u32::MAX
                ),
                source: None,
            })
    }

    /// Asks the CPU to start loading tokens `first..first + len` into its
    /// cache (a hint: tokens past the file's end are left out, and
    /// nothing is read or can fault).
    pub fn prefetch(&self, first: usize, len: usize) {
        let end = first.saturating_add(len).min(self.len);
        if first >= end {
            return;
        }
        let w = self.token_type().size();
        let Some(bytes) = self.map.get(self.start + w * first..self.start + w * end) else {
            return;
        };
        for line in bytes.chunks(64) {
            prefetch_line(line.as_ptr());
        }
    }
}

/// Starts loading the cache line at `p` (x86-64 and AArch64; nothing
/// elsewhere).
#[inline(always)]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing into the program,
    // never faults (not even on an unmapped or truncated page) and has no
    // effect the program can observe but timing. SSE is part of x86-64.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above: PRFM is a hint that never faults and writes no
    // register or memory.
    unsafe {
        core::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// The open file, its size and its mapping. A URL's object is fetched
/// whole to a local file first (the remote cache's directory, when it has
/// one, keeps it for later runs; else a temporary file, deleted once
/// mapped: the mapping keeps its pages) and mapped from there.
fn map(path: &Path) -> Result<(std::fs::File, u64, Mmap)> {
    let (file, bytes) = if crate::storage::is_url(path) {
        let file = crate::storage::local_copy(path)?;
        let bytes = file
            .metadata()
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        (file, bytes)
    } else {
        open_shard(path)?
    };
    // SAFETY: the map is read-only and every access is bounds-checked
    // against its length. That is sound only while no one writes the file
    // in place, which this module cannot enforce (a concurrent write
    // changes bytes behind `&[u8]`): the type's docs state the contract. A
    // remote object's copy is a file no writer has open (the cache renames
    // a finished, synced file into place, or it is a deleted temporary).
    // A truncation is SIGBUS on the next read of a lost page, which the
    // mapping's guard (mapguard.rs) turns into zeros and an error on Linux.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((file, bytes, map))
}

/// Where an epoch's windows start: which file, which token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowStart {
    /// The file, as an index into the files given to [`TokenWindows::new`].
    pub file: usize,
    /// The first token of the window (`seq_len + 1` tokens from here).
    pub token: usize,
}

/// How an epoch's windows are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowOrder {
    /// Windows `seq_len` apart from each file's start, every token an input
    /// once per epoch; their order shuffled from `(seed, epoch)`.
    NonOverlapping,
    /// As many windows as `NonOverlapping` gives, each at a random offset
    /// of a random file (files weighted by their windows), from
    /// `(seed, epoch, index)`.
    Random,
}

/// The windows of `seq_len + 1` tokens over a set of token files, dealt to
/// data-parallel ranks.
#[derive(Debug, Clone)]
pub struct TokenWindows {
    /// Per file: how many tokens it holds.
    lens: Vec<usize>,
    seq_len: usize,
    order: WindowOrder,
    seed: u64,
    rank: usize,
    world_size: usize,
}

impl TokenWindows {
    /// Windows of `seq_len + 1` tokens over files of `lens` tokens, for
    /// rank `rank` of `world_size`. An error when `seq_len` is 0, the rank
    /// is out of range, or the files hold fewer windows than ranks.
    pub fn new(
        lens: Vec<usize>,
        seq_len: usize,
        order: WindowOrder,
        seed: u64,
        (rank, world_size): (usize, usize),
    ) -> Result<Self> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if seq_len == 0 {
            return bad("seq_len must be at least 1".into());
        }
        if world_size == 0 || rank >= world_size {
            return bad(format!("rank {rank} of world size {world_size}"));
        }
        let w = Self {
            lens,
            seq_len,
            order,
            seed,
            rank,
            world_size,
        };
        let total = w.total();
        if total < world_size {
            return bad(format!(
                "the files hold {total} windows of {} tokens: fewer than the {world_size} ranks",
                seq_len + 1
            ));
        }
        Ok(w)
    }

    /// Non-overlapping windows of file `f`: starts `0, seq_len, ...` while
    /// `seq_len + 1` tokens remain.
    fn windows_in(&self, f: usize) -> usize {
        self.lens[f].saturating_sub(1) / self.seq_len
    }

    fn total(&self) -> usize {
        (0..self.lens.len()).map(|f| self.windows_in(f)).sum()
    }

    /// Window `i` of `epoch` in the random order: a file by its share of
    /// the windows, then any start in it, from `(seed, epoch, i)` (the
    /// stream [`Sample::rng`](crate::map::Sample::rng) gives sample `i`).
    pub fn random_window(&self, epoch: u64, i: usize) -> WindowStart {
        self.random_window_seeded(self.seed, epoch, i)
    }

    fn random_window_seeded(&self, seed: u64, epoch: u64, i: usize) -> WindowStart {
        let mut rng = keyed_rng(seed, epoch, Purpose::Sample, i as u64);
        let mut pick = rng.random_range(0..self.total());
        let mut file = 0;
        while pick >= self.windows_in(file) {
            pick -= self.windows_in(file);
            file += 1;
        }
        let last = self.lens[file] - self.seq_len - 1;
        WindowStart {
            file,
            token: rng.random_range(0..=last),
        }
    }

    /// The `k`-th non-overlapping window, counting through the files in
    /// order; `None` past the last.
    pub fn fixed_window(&self, mut k: usize) -> Option<WindowStart> {
        for file in 0..self.lens.len() {
            let n = self.windows_in(file);
            if k < n {
                return Some(WindowStart {
                    file,
                    token: k * self.seq_len,
                });
            }
            k -= n;
        }
        None
    }

    /// Windows per epoch for each rank (equal on every rank: the tail that
    /// cannot go to all of them is left out that epoch).
    pub fn per_rank(&self) -> usize {
        self.total() / self.world_size
    }

    /// This rank's window starts for `epoch`, in order.
    pub fn plan(&self, epoch: u64) -> Vec<WindowStart> {
        let total = self.total();
        let all: Vec<WindowStart> = match self.order {
            WindowOrder::NonOverlapping => {
                let mut all: Vec<WindowStart> = (0..self.lens.len())
                    .flat_map(|file| (0..self.windows_in(file)).map(move |k| (file, k)))
                    .map(|(file, k)| WindowStart {
                        file,
                        token: k * self.seq_len,
                    })
                    .collect();
                // The sampler's shuffle, from the same `(seed, epoch)` stream.
                all.shuffle(&mut keyed_rng(self.seed, epoch, Purpose::Shuffle, 0));
                all
            }
            WindowOrder::Random => (0..total).map(|i| self.random_window(epoch, i)).collect(),
        };
        let n = self.per_rank();
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .take(n)
            .collect()
    }
}

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

    fn read(&self, index: usize) -> Result<Record> {
        self.read_reusing(index, Vec::new())
    }

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
    use super::*;
    use std::collections::HashSet;

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
        let text = crate::error_chain(&err);
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
        assert!(crate::error_chain(&err).contains("cut.bin"), "{err}");
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
