//! A token file, memory-mapped: its layout (raw tokens of one type, or
//! an llm.c shard with its header), opened, checked and read by window.

use crate::error::{Error, Result};
use memmap2::Mmap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// llm.c's header: this many little-endian `i32`.
pub(super) const LLMC_HEADER_INTS: usize = 256;
/// llm.c's magic number (`header[0]`).
pub(super) const LLMC_MAGIC: i32 = 20240520;
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
///   caught (see `storage/mmap.rs`) and the read fails;
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
    pub(super) guard: crate::storage::mmap::Guard,
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
    /// A large remote object's local copy, filled by range: the chunks a
    /// read touches are fetched before it reads them.
    chunks: Option<std::sync::Arc<crate::storage::Chunks>>,
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
        let (file, bytes, map, chunks) = crate::storage::map_by_range(path)?;
        if let Some(c) = &chunks {
            // The header's bytes, the most the layout checks read.
            c.ensure(0..bytes.min(4 * LLMC_HEADER_INTS as u64))?;
        }
        // Guarded before the header is read.
        let guard = crate::storage::mmap::Guard::new(&map);
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
            chunks,
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
        let _one = crate::sync::lock(&self.recovering);
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
        let range = self.start + ty.size() * first..self.start + ty.size() * end;
        if let Some(c) = &self.chunks {
            c.ensure(range.start as u64..range.end as u64)?;
        }
        let bytes = &self.map[range];
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
        let range = self.start + w * first..self.start + w * end;
        if let Some(c) = &self.chunks {
            if !c.has(range.start as u64..range.end as u64) {
                return;
            }
        }
        let Some(bytes) = self.map.get(range) else {
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
