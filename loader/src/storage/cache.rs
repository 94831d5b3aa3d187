//! The local cache of remote objects ([`RemoteCache`]): whole objects
//! kept in memory (least recently used first out, within a byte limit)
//! and, optionally, as files in a directory (within their own limit) that
//! a later run, or another rank on the node, reads instead of the store.
//!
//! An object is cached whole. A shard read at random is first read with
//! ranged requests while a background download (at most
//! [`MAX_DOWNLOADS`] at once, on the I/O runtime) fetches it whole; its
//! later reads are local. A sample file is kept from its one GET. A shard
//! is known by its URL, size and entity tag, so a rewritten shard is
//! fetched anew; a sample file (read without a HEAD request) by its URL
//! alone: clear the directory after rewriting sample files in place.
//!
//! Files are written under a temporary name of their own (64 random
//! bits, created exclusively: ranks that are each PID 1 in their own
//! container never share one), synced to disk, checked for their size and
//! renamed, so a crash or another process never sees half a file; a file
//! deleted by another process (its eviction, a cleanup) is a miss and is
//! fetched again. The directory's limit is kept over what is in it,
//! whoever wrote it: uses are stamped on the files (their modification
//! time, at most once a second a file), so every process ranks every
//! file by one clock; when this process's count passes the limit, the
//! least recently used files go until 90% of it is left, and the
//! directory is listed again (outside the lock) only once a tenth of the
//! limit was written or 10 s passed since the last listing: eviction
//! costs O(1) a file written, not a listing per sample.

use super::RemoteCache;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// How often a file's use is stamped on it, at most.
const TOUCH_EVERY: Duration = if cfg!(test) {
    Duration::ZERO
} else {
    Duration::from_secs(1)
};

/// How long a failed download of an object is not tried again (its reads
/// stay ranged meanwhile).
const FAILED_WAIT: Duration = Duration::from_secs(60);

/// Nanoseconds since the epoch: the one clock of uses, this process's and
/// (through the files' times) the others'.
fn now_ns() -> u64 {
    ns(SystemTime::now())
}

fn ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Most objects downloaded whole at once.
pub(crate) const MAX_DOWNLOADS: usize = 4;

/// The process's cache, if one is set.
fn slot() -> &'static RwLock<Option<Arc<ObjectCache>>> {
    static CACHE: OnceLock<RwLock<Option<Arc<ObjectCache>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The cache in use, if any.
pub(crate) fn current() -> Option<Arc<ObjectCache>> {
    slot().read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Uses `config` from now on (an equal one keeps what is cached).
pub(crate) fn set(config: &RemoteCache) -> crate::error::Result<()> {
    let mut slot = slot().write().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_some_and(|c| c.config == *config) {
        return Ok(());
    }
    *slot = if config.memory == 0 && config.dir.is_none() {
        None
    } else {
        Some(Arc::new(ObjectCache::new(config.clone())?))
    };
    Ok(())
}

/// Bytes the memory cache holds now (and downloads into it in flight).
pub(crate) fn memory() -> u64 {
    current().map_or(0, |c| {
        let m = crate::sync::lock(&c.mem);
        m.bytes + m.pending
    })
}

/// Bytes of files in the cache's directory, as this process knows them.
pub(crate) fn disk() -> u64 {
    current().map_or(0, |c| {
        c.disk.as_ref().map_or(0, |d| crate::sync::lock(d).bytes)
    })
}

#[derive(Default)]
struct Mem {
    map: HashMap<String, (Bytes, u64)>,
    bytes: u64,
    /// Bytes of memory-only downloads in flight.
    pending: u64,
    tick: u64,
}

struct Disk {
    dir: PathBuf,
    /// File name → its size and uses.
    map: HashMap<String, OnDisk>,
    bytes: u64,
    /// When the directory was last listed, and bytes written since.
    scanned: Option<Instant>,
    written: u64,
    /// Listings read (for the tests).
    scans: u64,
}

/// A file of the directory, as this process knows it.
#[derive(Debug, Clone, Copy)]
struct OnDisk {
    size: u64,
    /// Its last use, by this process or (its file's time) another.
    used: u64,
    /// When this process last stamped its use on the file.
    touched: u64,
}

/// A whole-object download under way ([`ObjectCache::want`]).
#[derive(Debug)]
pub(crate) struct Download {
    key: String,
    len: u64,
    /// The temporary file it writes, when it goes to the directory.
    pub(crate) file: Option<PathBuf>,
    /// Whether its bytes are kept in memory.
    pub(crate) keep: bool,
}

/// An object's lock file, as [`ObjectCache::lock_object`] found it.
enum Locked {
    /// Held by this process until the file drops.
    Held(File),
    /// Held by another process.
    Busy,
}

/// What [`ObjectCache::claim`] found of a file that one process of the
/// node makes for all of them.
pub(crate) enum Claim {
    /// The file, made: open.
    Ready(File),
    /// The lock, held by this process (until the file drops), which makes
    /// the file.
    Mine(File),
    /// Another process holds the lock.
    Busy,
}

/// A cache of whole remote objects, in memory and on disk.
pub(crate) struct ObjectCache {
    config: RemoteCache,
    mem: Mutex<Mem>,
    disk: Option<Mutex<Disk>>,
    downloading: Mutex<HashSet<String>>,
    /// Objects whose download failed, and when.
    failed: Mutex<HashMap<String, Instant>>,
}

/// The file name of `key` in the directory: a hash (FNV-1a, 64 bits) of
/// the key.
fn file_name(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}.obj")
}

impl ObjectCache {
    fn new(config: RemoteCache) -> crate::error::Result<Self> {
        let disk = match &config.dir {
            None => None,
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| crate::error::Error::Io {
                    path: dir.clone(),
                    source,
                })?;
                let mut disk = Disk {
                    dir: dir.clone(),
                    map: HashMap::new(),
                    bytes: 0,
                    scanned: None,
                    written: 0,
                    scans: 0,
                };
                disk.merge(scan(dir));
                Some(Mutex::new(disk))
            }
        };
        Ok(Self {
            config,
            mem: Mutex::default(),
            disk,
            downloading: Mutex::default(),
            failed: Mutex::default(),
        })
    }

    /// Bytes `range` of the object `key` (`len` bytes), if it is cached.
    pub(crate) fn read(&self, key: &str, len: u64, range: std::ops::Range<u64>) -> Option<Bytes> {
        {
            let mut m = crate::sync::lock(&self.mem);
            m.tick += 1;
            let tick = m.tick;
            if let Some((bytes, used)) = m.map.get_mut(key) {
                *used = tick;
                let (start, end) = (range.start as usize, range.end as usize);
                return (end <= bytes.len()).then(|| bytes.slice(start..end));
            }
        }
        let (path, file) = self.on_disk(key, Some(len))?;
        let mut buf = vec![0; (range.end - range.start) as usize];
        super::local::read_exact_at(&file, &path, range.start, &mut buf).ok()?;
        Some(buf.into())
    }

    /// The whole object `key`, if it is cached (and of `len` bytes, when
    /// that is known).
    pub(crate) fn whole(&self, key: &str, len: Option<u64>) -> Option<Bytes> {
        {
            let mut m = crate::sync::lock(&self.mem);
            m.tick += 1;
            let tick = m.tick;
            if let Some((bytes, used)) = m.map.get_mut(key) {
                *used = tick;
                return Some(bytes.clone());
            }
        }
        let (_, mut file) = self.on_disk(key, len)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).ok()?;
        let bytes: Bytes = bytes.into();
        self.keep_in_memory(key, &bytes);
        Some(bytes)
    }

    /// The file of `key`, open, if the directory holds it whole (its use
    /// stamped on it for the other processes); a file gone or of another
    /// size than it was written with or than the object's `len` (deleted
    /// or cut by someone else, or short after a crash before this process
    /// started) is forgotten, a miss.
    fn on_disk(&self, key: &str, len: Option<u64>) -> Option<(PathBuf, File)> {
        let mut d = crate::sync::lock(self.disk.as_ref()?);
        let name = file_name(key);
        let path = d.dir.join(&name);
        let known = *d.map.get(&name)?;
        let opened = File::open(&path).ok().filter(|f| {
            f.metadata()
                .is_ok_and(|m| m.len() == known.size && len.is_none_or(|len| len == m.len()))
        });
        let Some(file) = opened else {
            d.map.remove(&name);
            d.bytes -= known.size;
            return None;
        };
        let now = now_ns();
        let stamp = now.saturating_sub(known.touched) >= TOUCH_EVERY.as_nanos() as u64;
        if stamp {
            // Its use, for the other processes' eviction order.
            let _ = File::options()
                .append(true)
                .open(&path)
                .and_then(|f| f.set_modified(SystemTime::now()));
        }
        if let Some(e) = d.map.get_mut(&name) {
            e.used = now;
            if stamp {
                e.touched = now;
            }
        }
        Some((path, file))
    }

    /// A download of object `key` (`len` bytes) to start now, when a
    /// cache fits it and fewer than [`MAX_DOWNLOADS`] are under way; it
    /// must end with [`Self::downloaded`].
    pub(crate) fn want(&self, key: &str, len: u64) -> Option<Download> {
        let file = self.download_path(key, len);
        let keep = self.fits_memory(len);
        if file.is_none() && !keep {
            return None;
        }
        if crate::sync::lock(&self.failed)
            .get(key)
            .is_some_and(|t| t.elapsed() < FAILED_WAIT)
        {
            return None;
        }
        let mut d = crate::sync::lock(&self.downloading);
        if d.len() >= MAX_DOWNLOADS || d.contains(key) {
            return None;
        }
        d.insert(key.to_string());
        if keep {
            crate::sync::lock(&self.mem).pending += len;
        }
        Some(Download {
            key: key.to_string(),
            len,
            file,
            keep,
        })
    }

    /// Where a download of `key` writes, when it goes to the directory: a
    /// name no other writer has (64 random bits; the writer creates it
    /// exclusively). Process ids are not unique across containers.
    fn download_path(&self, key: &str, len: u64) -> Option<PathBuf> {
        let d = crate::sync::lock(self.disk.as_ref()?);
        (len <= self.config.disk).then(|| {
            let tmp = format!("{}.part-{:016x}", file_name(key), rand::random::<u64>());
            d.dir.join(tmp)
        })
    }

    /// Ends `download`: `got` is the object when it was read whole and
    /// its file (if any) written.
    pub(crate) fn downloaded(&self, download: Download, got: Option<Bytes>) {
        let Download {
            key,
            len,
            file,
            keep,
        } = download;
        if keep {
            crate::sync::lock(&self.mem).pending -= len;
        }
        match (&got, &file) {
            (Some(_), Some(tmp)) => self.store_file(&key, tmp, len),
            (None, Some(tmp)) => {
                let _ = std::fs::remove_file(tmp);
            }
            _ => {}
        }
        if got.is_none() {
            crate::sync::lock(&self.failed).insert(key.clone(), Instant::now());
        } else {
            crate::sync::lock(&self.failed).remove(&key);
        }
        if let (Some(bytes), true) = (&got, keep) {
            self.keep_in_memory(&key, bytes);
        }
        crate::sync::lock(&self.downloading).remove(&key);
    }

    /// Whether the cache keeps files in a directory.
    pub(crate) fn has_dir(&self) -> bool {
        self.disk.is_some()
    }

    /// The directory's byte limit, when it has one.
    pub(crate) fn dir_limit(&self) -> Option<u64> {
        self.disk.as_ref().map(|_| self.config.disk)
    }

    /// The path the directory would give object `key`, without a
    /// directory `None`. A file there is counted in the directory's bytes
    /// and evicted like the others (deleted under a reader, it stays
    /// readable to that reader).
    pub(crate) fn path_of(&self, key: &str) -> Option<PathBuf> {
        Some(
            crate::sync::lock(self.disk.as_ref()?)
                .dir
                .join(file_name(key)),
        )
    }

    /// The file of object `key` (`len` bytes) in the directory, open,
    /// written by `fetch` (to a new temporary path) when missing; `None`
    /// without a directory or when the object is over its limit.
    pub(crate) fn file(
        &self,
        key: &str,
        len: u64,
        fetch: impl FnOnce(&Path) -> crate::error::Result<()>,
    ) -> Option<crate::error::Result<File>> {
        if let Some((_, file)) = self.on_disk(key, Some(len)) {
            return Some(Ok(file));
        }
        // Another process (a rank of this node) may have written it since
        // this one listed the directory, or be writing it now: one process
        // downloads an object, under its lock file, and the others wait
        // for it and take its file. The lock is the kernel's (`flock`),
        // released when its holder ends, so a rank that dies mid-download
        // leaves none held.
        let _lock = match self.claim_sized(key, Some(len), true) {
            Some(Claim::Ready(file)) => return Some(Ok(file)),
            Some(Claim::Mine(lock)) => Some(lock),
            Some(Claim::Busy) | None => None,
        };
        let tmp = self.download_path(key, len)?;
        if let Err(e) = fetch(&tmp) {
            let _ = std::fs::remove_file(&tmp);
            return Some(Err(e));
        }
        // Opened before it is renamed: a file another process evicts at
        // once is still whole to this one.
        let file = File::open(&tmp).map_err(|source| crate::error::Error::Io {
            path: tmp.clone(),
            source,
        });
        self.store_file(key, &tmp, len);
        Some(file)
    }

    /// The object's file if the directory holds it whole (written by
    /// another process since this one listed it; of `len` bytes when
    /// given), taken into this process's table.
    fn adopt(&self, key: &str, len: Option<u64>) -> Option<File> {
        let name = file_name(key);
        let path = crate::sync::lock(self.disk.as_ref()?).dir.join(&name);
        let file = File::open(&path).ok()?;
        let meta = file.metadata().ok()?;
        if len.is_some_and(|len| meta.len() != len) {
            return None;
        }
        let len = meta.len();
        let mut d = crate::sync::lock(self.disk.as_ref()?);
        let now = now_ns();
        let entry = OnDisk {
            size: len,
            used: now,
            touched: ns(meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)),
        };
        d.put(name, entry);
        Some(file)
    }

    /// Holds object `key`'s lock file in the directory (`<name>.lock`,
    /// `flock` exclusive) until the guard drops, waiting for another
    /// holder when `wait` (else [`Locked::Busy`] while there is one);
    /// `None` where it cannot be taken (no directory, no `flock`): each
    /// process then makes its own copy, as before.
    fn lock_object(&self, key: &str, wait: bool) -> Option<Locked> {
        let path = crate::sync::lock(self.disk.as_ref()?)
            .dir
            .join(format!("{}.lock", file_name(key)));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ok()?;
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let op = if wait {
                libc::LOCK_EX
            } else {
                libc::LOCK_EX | libc::LOCK_NB
            };
            // SAFETY: flock takes an open descriptor this function owns
            // (`file`, alive until the guard drops) and an operation flag.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Some(Locked::Held(file));
            }
            let busy = std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock;
            (busy && !wait).then_some(Locked::Busy)
        }
        #[cfg(not(unix))]
        {
            let _ = wait;
            drop(file);
            None
        }
    }

    /// The file that one process of the node makes under `key` for all
    /// of them (a shard's index made by reading the shard): there
    /// already; else its lock, taken by this process, which then makes it
    /// and [`publish`](Self::publish)es it (or drops the lock, and the
    /// next process to take it makes it); else, when another process
    /// holds the lock, [`Claim::Busy`] or, when `wait`, its file once it
    /// is published. The lock is the kernel's (`flock`), released when its
    /// holder ends, so a process that dies while making the file holds
    /// no one up, and one started late finds the file. `None` without a
    /// directory or `flock`.
    pub(crate) fn claim(&self, key: &str, wait: bool) -> Option<Claim> {
        self.claim_sized(key, None, wait)
    }

    /// [`Self::claim`] of a file that counts as made only with `len`
    /// bytes, when given.
    fn claim_sized(&self, key: &str, len: Option<u64>, wait: bool) -> Option<Claim> {
        if let Some(file) = self.adopt(key, len) {
            return Some(Claim::Ready(file));
        }
        match self.lock_object(key, wait)? {
            Locked::Busy => Some(Claim::Busy),
            Locked::Held(lock) => Some(match self.adopt(key, len) {
                Some(file) => Claim::Ready(file),
                None => Claim::Mine(lock),
            }),
        }
    }

    /// Writes `bytes` as `key`'s file in the directory (a temporary file,
    /// synced, renamed into place), for a process holding its
    /// [`Claim::Mine`]; nothing when they are over the directory's limit.
    pub(crate) fn publish(&self, key: &str, bytes: &[u8]) -> crate::error::Result<()> {
        use std::io::Write;
        let len = bytes.len() as u64;
        let Some(tmp) = self.download_path(key, len) else {
            return Ok(());
        };
        let written = File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_data()));
        if let Err(source) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(crate::error::Error::Io { path: tmp, source });
        }
        self.store_file(key, &tmp, len);
        Ok(())
    }

    /// Keeps a whole object read anyway (a sample file's GET).
    pub(crate) fn store(&self, key: &str, bytes: &Bytes) {
        use std::io::Write;
        self.keep_in_memory(key, bytes);
        let Some(tmp) = self.download_path(key, bytes.len() as u64) else {
            return;
        };
        let written = File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(bytes)?;
                f.sync_data()
            });
        if written.is_ok() {
            self.store_file(key, &tmp, bytes.len() as u64);
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    pub(crate) fn fits_memory(&self, len: u64) -> bool {
        // An object over a quarter of the memory would evict most others.
        len <= self.config.memory / 4
    }

    fn keep_in_memory(&self, key: &str, bytes: &Bytes) {
        let len = bytes.len() as u64;
        if !self.fits_memory(len) {
            return;
        }
        let mut m = crate::sync::lock(&self.mem);
        if m.map.contains_key(key) {
            return;
        }
        while m.bytes + m.pending + len > self.config.memory && !m.map.is_empty() {
            let oldest = m.map.iter().min_by_key(|(_, (_, used))| *used);
            let Some(oldest) = oldest.map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some((b, _)) = m.map.remove(&oldest) {
                m.bytes -= b.len() as u64;
            }
        }
        if m.bytes + m.pending + len <= self.config.memory {
            m.tick += 1;
            let tick = m.tick;
            m.bytes += len;
            m.map.insert(key.to_string(), (bytes.clone(), tick));
        }
    }

    /// Renames a written (and synced) file into the directory when it
    /// holds `len` bytes, then keeps the directory within its limit.
    fn store_file(&self, key: &str, tmp: &Path, len: u64) {
        let Some(disk) = &self.disk else { return };
        let whole = std::fs::metadata(tmp).is_ok_and(|m| m.len() == len);
        let d = crate::sync::lock(disk);
        if !whole || std::fs::rename(tmp, d.dir.join(file_name(key))).is_err() {
            let _ = std::fs::remove_file(tmp);
            return;
        }
        self.count(d, key, len);
    }

    /// Counts object `key`'s file of `len` bytes, made in the directory
    /// by its path ([`path_of`](Self::path_of)), in the directory's
    /// limit, which is then kept.
    pub(crate) fn added(&self, key: &str, len: u64) {
        if let Some(disk) = &self.disk {
            self.count(crate::sync::lock(disk), key, len);
        }
    }

    /// Counts the file of `key` (`len` bytes, in the directory now) and
    /// keeps the directory within its limit (`d`: the directory, locked).
    fn count(&self, mut d: std::sync::MutexGuard<'_, Disk>, key: &str, len: u64) {
        let scan_now = {
            let name = file_name(key);
            let now = now_ns();
            let entry = OnDisk {
                size: len,
                used: now,
                touched: now,
            };
            d.put(name, entry);
            d.written += len;
            if d.bytes <= self.config.disk {
                return;
            }
            // What others wrote counts too: listed again now and then.
            let stale = d
                .scanned
                .is_none_or(|t| t.elapsed() > Duration::from_secs(10))
                || d.written > self.config.disk / 10;
            if !stale {
                d.evict(self.config.disk);
                return;
            }
            d.dir.clone()
        };
        drop(d);
        // The listing (a large directory's is slow) runs outside the lock.
        let found = scan(&scan_now);
        let Some(disk) = &self.disk else { return };
        let mut d = crate::sync::lock(disk);
        d.merge(found);
        d.evict(self.config.disk);
    }
}

/// The directory's objects: name, size and time of last use (the file's
/// modification time); temporary files over an hour old (a crashed
/// writer's) are deleted.
fn scan(dir: &Path) -> Option<Vec<(String, u64, u64)>> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut found = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(meta) = e.metadata() else { continue };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if name.ends_with(".obj") {
            found.push((name, meta.len(), ns(modified)));
        } else if name.contains(".obj.part-")
            && modified.elapsed().unwrap_or_default() > Duration::from_secs(3600)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Some(found)
}

impl Disk {
    /// Records file `name` in the table, its size counted once.
    fn put(&mut self, name: String, entry: OnDisk) {
        let size = entry.size;
        if let Some(old) = self.map.insert(name, entry) {
            self.bytes -= old.size;
        }
        self.bytes += size;
    }

    /// Takes a listing of the directory ([`scan`]) as what it holds; a
    /// file's last use is the later of its time and this process's use.
    fn merge(&mut self, found: Option<Vec<(String, u64, u64)>>) {
        let Some(found) = found else { return };
        let old = std::mem::take(&mut self.map);
        self.bytes = 0;
        for (name, size, modified) in found {
            let mine = old.get(&name);
            let entry = OnDisk {
                size,
                used: mine.map_or(modified, |o| o.used.max(modified)),
                touched: mine.map_or(0, |o| o.touched),
            };
            self.bytes += size;
            self.map.insert(name, entry);
        }
        self.scanned = Some(Instant::now());
        self.written = 0;
        self.scans += 1;
    }

    /// Deletes the least recently used files until 90% of `limit` holds
    /// (room for the next writes without an eviction each).
    fn evict(&mut self, limit: u64) {
        let target = limit - limit / 10;
        let mut order: Vec<(u64, String, u64)> = self
            .map
            .iter()
            .map(|(n, e)| (e.used, n.clone(), e.size))
            .collect();
        order.sort_unstable();
        for (_, name, size) in order {
            if self.bytes <= target {
                break;
            }
            // Deleted under a reader, a file stays readable to it (Unix).
            let _ = std::fs::remove_file(self.dir.join(&name));
            self.map.remove(&name);
            self.bytes -= size;
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
