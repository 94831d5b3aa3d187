//! A large object read by range: one local file of the object's size (a
//! sparse file: no byte on disk until written), filled chunk by chunk by
//! ranged GETs as reads reach the chunks, and mapped like a local file.
//! After the object's bytes the file holds one mark a chunk (1: written
//! and synced). In the remote cache's directory the file is the node's:
//! every process that opens the object opens it, a missing chunk is
//! fetched by one process under the file's lock (`flock`: released when
//! its holder ends, so a process that dies mid-fetch leaves none held;
//! its chunk stays unmarked and the next reader fetches it), and the
//! others find it marked. Without a directory the file is a temporary
//! one of the process, deleted once open.
//!
//! A token corpus of 1 TB read by 512 ranks of 64 nodes was downloaded
//! whole by each node (or each rank, without a directory) before its
//! first window; now a rank's first window costs one chunk, and a node
//! fetches only the chunks its ranks read, once.

use super::Object;
use crate::error::{Error, Result};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of a chunk: one ranged GET (32 MiB, in the 8–64 MiB that object
/// stores serve at full speed per request).
static CHUNK_BYTES: AtomicU64 = AtomicU64::new(32 << 20);

/// Sets the chunk size (tests: small objects read in chunks).
pub(crate) fn set_chunk_bytes(bytes: u64) {
    CHUNK_BYTES.store(bytes.max(1), Ordering::Relaxed);
}

/// The chunk size in use.
pub(crate) fn chunk_bytes() -> u64 {
    CHUNK_BYTES.load(Ordering::Relaxed)
}

/// A large object's local copy, filled as reads reach it ([module docs](self)).
#[derive(Debug)]
pub(crate) struct Chunks {
    object: Object,
    file: File,
    /// The local file (for errors).
    path: PathBuf,
    size: u64,
    chunk: u64,
    /// Chunks this process knows are in the file.
    have: Vec<AtomicBool>,
    /// One fetch at a time in this process (`flock` is per open file,
    /// not per thread).
    fetching: Mutex<()>,
}

impl Chunks {
    /// `url` opened to be read by range when it holds more than two
    /// chunks: its local copy (sized, holding the chunks fetched so far by
    /// any process of the node), open for reading and mapping, and the
    /// copy's state; `None` for a smaller object (read whole as before).
    pub(crate) fn open(url: &str) -> Result<Option<(File, Arc<Chunks>)>> {
        let object = Object::open(url)?;
        if object.len() <= 2 * chunk_bytes() {
            return Ok(None);
        }
        Self::of(object).map(Some)
    }

    /// [`open`](Self::open) of an object open already, whatever its size.
    /// A file the node's cache directory gets anew is counted in its
    /// limit (and evicted like its other files).
    pub(crate) fn of(object: Object) -> Result<(File, Arc<Chunks>)> {
        let chunk = chunk_bytes();
        let size = object.len();
        let n = size.div_ceil(chunk);
        let total = size + n;
        let key = format!("{}#chunks-of-{chunk}", object.key);
        let cache = super::super::cache::current();
        let shared = cache.as_ref().and_then(|c| c.path_of(&key));
        let in_dir = shared.is_some();
        let (file, path) = match shared {
            Some(path) => {
                let file = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
                    .map_err(io(&path))?;
                (file, path)
            }
            None => {
                let path = std::env::temp_dir()
                    .join(format!("wick-chunks-{:016x}", rand::random::<u64>()));
                let file = File::options()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(io(&path))?;
                let _ = std::fs::remove_file(&path);
                (file, path)
            }
        };
        {
            let _lock = Flock::exclusive(&file);
            let len = file.metadata().map_err(io(&path))?.len();
            if len != total {
                // New (or not of this layout): emptied and sized, every
                // chunk unmarked; the holes take no disk.
                file.set_len(0).map_err(io(&path))?;
                file.set_len(total).map_err(io(&path))?;
                if let Some(c) = cache.as_ref().filter(|_| in_dir) {
                    c.added(&key, total);
                }
            }
        }
        let mut marks = vec![0u8; n as usize];
        read_at(&file, &mut marks, size).map_err(io(&path))?;
        let have = marks.iter().map(|&m| AtomicBool::new(m == 1)).collect();
        let reader = file.try_clone().map_err(io(&path))?;
        Ok((
            reader,
            Arc::new(Chunks {
                object,
                file,
                path,
                size,
                chunk,
                have,
                fetching: Mutex::new(()),
            }),
        ))
    }

    /// The object's size: the bytes of the local file that are its.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The chunks that hold bytes `range` (below the size).
    fn chunks_of(&self, range: &std::ops::Range<u64>) -> std::ops::Range<usize> {
        if range.start >= range.end {
            return 0..0;
        }
        let last = ((range.end - 1) / self.chunk).min(self.have.len() as u64 - 1);
        (range.start / self.chunk) as usize..last as usize + 1
    }

    /// Whether bytes `range` are in the local file.
    pub(crate) fn has(&self, range: std::ops::Range<u64>) -> bool {
        self.chunks_of(&range)
            .all(|i| self.have[i].load(Ordering::Acquire))
    }

    /// Makes bytes `range` of the local file the object's: each chunk
    /// they touch that no process fetched yet is fetched now (one ranged
    /// GET of the version the open saw). The error names the URL.
    pub(crate) fn ensure(&self, range: std::ops::Range<u64>) -> Result<()> {
        for i in self.chunks_of(&range) {
            if !self.have[i].load(Ordering::Acquire) {
                self.fetch(i)?;
            }
        }
        Ok(())
    }

    /// Fills `buf` with the object's bytes at `offset`, fetching the
    /// chunks they touch that are not in the copy yet. Errors name the URL
    /// (a fetch) or the copy (a read).
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let range = offset..offset + buf.len() as u64;
        self.ensure(range)?;
        read_at(&self.file, buf, offset).map_err(io(&self.path))
    }

    /// Chunk `i`, fetched unless another thread or process did.
    fn fetch(&self, i: usize) -> Result<()> {
        let _one = crate::sync::lock(&self.fetching);
        if self.have[i].load(Ordering::Acquire) {
            return Ok(());
        }
        let _lock = Flock::exclusive(&self.file);
        let at = self.size + i as u64;
        let mut mark = [0u8];
        read_at(&self.file, &mut mark, at).map_err(io(&self.path))?;
        if mark[0] != 1 {
            let start = i as u64 * self.chunk;
            let end = (start + self.chunk).min(self.size);
            // Bounded by progress, as a whole download is: a chunk on a
            // slow link takes as long as it takes while bytes come.
            let object = self.object.clone();
            let bytes =
                super::block_on(async move { object.fetch_span(start..end, None, true).await })??;
            write_at(&self.file, &bytes, start).map_err(io(&self.path))?;
            // The bytes reach the disk before their mark: a crash between
            // leaves the chunk unmarked, fetched again.
            self.file.sync_data().map_err(io(&self.path))?;
            write_at(&self.file, &[1], at).map_err(io(&self.path))?;
        }
        self.have[i].store(true, Ordering::Release);
        Ok(())
    }
}

fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(unix)]
fn write_at(file: &File, buf: &[u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, at)
}

#[cfg(windows)]
fn read_at(file: &File, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, at)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                at += n as u64;
            }
        }
    }
    Ok(())
}

#[cfg(windows)]
fn write_at(file: &File, mut buf: &[u8], mut at: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        let n = file.seek_write(buf, at)?;
        buf = &buf[n..];
        at += n as u64;
    }
    Ok(())
}

/// The file's exclusive `flock` until dropped; nothing where `flock` is
/// missing or fails (each process then fetches for itself: the same
/// bytes, written before their mark).
struct Flock<'a>(#[allow(dead_code)] Option<&'a File>);

impl<'a> Flock<'a> {
    fn exclusive(file: &'a File) -> Self {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: flock takes an open descriptor (`file` outlives the
            // guard) and an operation flag.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0;
            Flock(locked.then_some(file))
        }
        #[cfg(not(unix))]
        {
            let _ = file;
            Flock(None)
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(file) = self.0 {
            use std::os::fd::AsRawFd;
            // SAFETY: as in `exclusive`: the descriptor is open.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}
