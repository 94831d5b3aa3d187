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
//! Files are written under a temporary name and renamed, so a crash or
//! another process never sees half a file; a file deleted by another
//! process (its eviction) is a miss. The directory's limit is kept over
//! what is in it, whoever wrote it: when this process's count passes the
//! limit, the directory is listed and the least recently used files go.

use super::RemoteCache;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

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
pub(crate) fn set(config: &RemoteCache) -> crate::Result<()> {
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
        let m = crate::lock(&c.mem);
        m.bytes + m.pending
    })
}

/// Bytes of files in the cache's directory, as this process knows them.
pub(crate) fn disk() -> u64 {
    current().map_or(0, |c| c.disk.as_ref().map_or(0, |d| crate::lock(d).bytes))
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
    /// File name → (size, last use, touched by this process).
    map: HashMap<String, (u64, u64, bool)>,
    bytes: u64,
    tick: u64,
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

/// A cache of whole remote objects, in memory and on disk.
pub(crate) struct ObjectCache {
    config: RemoteCache,
    mem: Mutex<Mem>,
    disk: Option<Mutex<Disk>>,
    downloading: Mutex<HashSet<String>>,
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
    fn new(config: RemoteCache) -> crate::Result<Self> {
        let disk = match &config.dir {
            None => None,
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| crate::Error::Io {
                    path: dir.clone(),
                    source,
                })?;
                let mut disk = Disk {
                    dir: dir.clone(),
                    map: HashMap::new(),
                    bytes: 0,
                    tick: 0,
                };
                disk.rescan();
                Some(Mutex::new(disk))
            }
        };
        Ok(Self {
            config,
            mem: Mutex::default(),
            disk,
            downloading: Mutex::default(),
        })
    }

    /// Bytes `range` of the object `key`, if it is cached.
    pub(crate) fn read(&self, key: &str, range: std::ops::Range<u64>) -> Option<Bytes> {
        {
            let mut m = crate::lock(&self.mem);
            m.tick += 1;
            let tick = m.tick;
            if let Some((bytes, used)) = m.map.get_mut(key) {
                *used = tick;
                let (start, end) = (range.start as usize, range.end as usize);
                return (end <= bytes.len()).then(|| bytes.slice(start..end));
            }
        }
        let path = self.on_disk(key)?;
        let mut buf = vec![0; (range.end - range.start) as usize];
        let file = File::open(&path).ok()?;
        crate::source::read_exact_at(&file, &path, range.start, &mut buf).ok()?;
        Some(buf.into())
    }

    /// The whole object `key`, if it is cached.
    pub(crate) fn whole(&self, key: &str) -> Option<Bytes> {
        {
            let mut m = crate::lock(&self.mem);
            m.tick += 1;
            let tick = m.tick;
            if let Some((bytes, used)) = m.map.get_mut(key) {
                *used = tick;
                return Some(bytes.clone());
            }
        }
        let bytes: Bytes = std::fs::read(self.on_disk(key)?).ok()?.into();
        self.keep_in_memory(key, &bytes);
        Some(bytes)
    }

    /// The file of `key` if the directory holds it (marked used).
    fn on_disk(&self, key: &str) -> Option<PathBuf> {
        let mut d = crate::lock(self.disk.as_ref()?);
        let name = file_name(key);
        d.tick += 1;
        let tick = d.tick;
        let path = d.dir.join(&name);
        let (_, used, touched) = d.map.get_mut(&name)?;
        *used = tick;
        if !std::mem::replace(touched, true) {
            // Its use, for the other processes' eviction order.
            let _ = File::options()
                .append(true)
                .open(&path)
                .and_then(|f| f.set_modified(SystemTime::now()));
        }
        Some(path)
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
        let mut d = crate::lock(&self.downloading);
        if d.len() >= MAX_DOWNLOADS || d.contains(key) {
            return None;
        }
        d.insert(key.to_string());
        if keep {
            crate::lock(&self.mem).pending += len;
        }
        Some(Download {
            key: key.to_string(),
            len,
            file,
            keep,
        })
    }

    /// Where a download of `key` writes, when it goes to the directory.
    fn download_path(&self, key: &str, len: u64) -> Option<PathBuf> {
        let mut d = crate::lock(self.disk.as_ref()?);
        (len <= self.config.disk).then(|| {
            d.tick += 1;
            let tmp = format!("{}.part-{}-{}", file_name(key), std::process::id(), d.tick);
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
            crate::lock(&self.mem).pending -= len;
        }
        match (&got, &file) {
            (Some(_), Some(tmp)) => self.store_file(&key, tmp, len),
            (None, Some(tmp)) => {
                let _ = std::fs::remove_file(tmp);
            }
            _ => {}
        }
        if let (Some(bytes), true) = (&got, keep) {
            self.keep_in_memory(&key, bytes);
        }
        crate::lock(&self.downloading).remove(&key);
    }

    /// The file of object `key` (`len` bytes) in the directory, written by
    /// `fetch` (to a temporary path) when missing; `None` without a
    /// directory or when the object is over its limit.
    pub(crate) fn file(
        &self,
        key: &str,
        len: u64,
        fetch: impl FnOnce(&Path) -> crate::Result<()>,
    ) -> Option<crate::Result<PathBuf>> {
        if let Some(path) = self.on_disk(key) {
            return Some(Ok(path));
        }
        let tmp = self.download_path(key, len)?;
        if let Err(e) = fetch(&tmp) {
            let _ = std::fs::remove_file(&tmp);
            return Some(Err(e));
        }
        self.store_file(key, &tmp, len);
        Some(self.on_disk(key).ok_or_else(|| {
            crate::Error::InvalidConfig(format!(
                "{key}: downloaded into the remote cache's directory, but not found there"
            ))
        }))
    }

    /// Keeps a whole object read anyway (a sample file's GET).
    pub(crate) fn store(&self, key: &str, bytes: &Bytes) {
        self.keep_in_memory(key, bytes);
        let Some(tmp) = self.download_path(key, bytes.len() as u64) else {
            return;
        };
        if std::fs::write(&tmp, bytes).is_ok() {
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
        let mut m = crate::lock(&self.mem);
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

    /// Renames a written file into the directory, then keeps the
    /// directory within its limit.
    fn store_file(&self, key: &str, tmp: &Path, len: u64) {
        let Some(disk) = &self.disk else { return };
        let mut d = crate::lock(disk);
        let name = file_name(key);
        if std::fs::rename(tmp, d.dir.join(&name)).is_err() {
            let _ = std::fs::remove_file(tmp);
            return;
        }
        d.tick += 1;
        let tick = d.tick;
        if let Some((old, _, _)) = d.map.insert(name, (len, tick, true)) {
            d.bytes -= old;
        }
        d.bytes += len;
        if d.bytes > self.config.disk {
            d.rescan();
            d.evict(self.config.disk);
        }
    }
}

impl Disk {
    /// Reads the directory: its objects, oldest use first; temporary
    /// files over an hour old (a crashed writer's) are deleted.
    fn rescan(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut found: Vec<(SystemTime, String, u64)> = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(meta) = e.metadata() else { continue };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.ends_with(".obj") {
                found.push((modified, name, meta.len()));
            } else if name.contains(".obj.part-")
                && modified.elapsed().unwrap_or_default() > Duration::from_secs(3600)
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
        found.sort();
        let old = std::mem::take(&mut self.map);
        self.bytes = 0;
        for (n, (_, name, size)) in found.into_iter().enumerate() {
            // This process's own uses rank after what the files say.
            let used = old.get(&name).map_or(n as u64, |o| self.tick + o.1);
            let touched = old.get(&name).is_some_and(|o| o.2);
            self.bytes += size;
            self.map.insert(name, (size, used, touched));
        }
        self.tick += self.map.len() as u64 + old.values().map(|o| o.1).max().unwrap_or(0);
    }

    /// Deletes the least recently used files until `limit` holds.
    fn evict(&mut self, limit: u64) {
        let mut order: Vec<(u64, String, u64)> = self
            .map
            .iter()
            .map(|(n, (size, used, _))| (*used, n.clone(), *size))
            .collect();
        order.sort();
        for (_, name, size) in order {
            if self.bytes <= limit {
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
mod tests {
    use super::*;

    fn cache(memory: u64, dir: Option<(&Path, u64)>) -> ObjectCache {
        let mut c = RemoteCache::memory(memory);
        if let Some((dir, limit)) = dir {
            c = c.disk(dir, limit);
        }
        ObjectCache::new(c).unwrap()
    }

    fn memory_of(c: &ObjectCache) -> u64 {
        let m = crate::lock(&c.mem);
        m.bytes + m.pending
    }

    #[test]
    fn memory_keeps_the_most_recently_used_within_its_limit() {
        let c = cache(400, None);
        let obj = |b: u8| Bytes::from(vec![b; 100]);
        c.store("a", &obj(1));
        c.store("b", &obj(2));
        c.store("c", &obj(3));
        assert_eq!(c.read("a", 10..12).as_deref(), Some(&[1, 1][..]));
        c.store("d", &obj(4));
        c.store("e", &obj(5)); // evicts b, the least recently used
        assert!(c.whole("b").is_none());
        assert_eq!(c.whole("a").unwrap()[0], 1);
        assert_eq!(crate::lock(&c.mem).bytes, 400);
        c.store("big", &Bytes::from(vec![0; 101])); // over a quarter
        assert!(c.whole("big").is_none());
        assert!(
            c.want("big", 101).is_none(),
            "too big to download into memory"
        );
        let f = c.want("f", 100).unwrap();
        assert!(c.want("f", 100).is_none(), "already downloading");
        assert_eq!(memory_of(&c), 500, "the download counts");
        c.downloaded(f, Some(obj(6)));
        assert_eq!(c.read("f", 0..1).as_deref(), Some(&[6][..]));
        assert_eq!(crate::lock(&c.mem).pending, 0);
    }

    #[test]
    fn the_directory_outlives_the_process_and_keeps_its_limit() {
        let dir = std::env::temp_dir().join(format!("wick-objcache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let c = cache(0, Some((&dir, 250)));
            c.store("s3://b/x", &Bytes::from(vec![7; 100]));
            c.store("s3://b/y", &Bytes::from(vec![8; 100]));
            assert_eq!(c.read("s3://b/x", 98..100).as_deref(), Some(&[7, 7][..]));
        }
        // A new cache (a restart) reads the files; a third object evicts
        // the least recently used.
        let c = cache(0, Some((&dir, 250)));
        assert_eq!(c.whole("s3://b/y").unwrap().len(), 100);
        let z = c.want("s3://b/z", 100).unwrap();
        std::fs::write(z.file.as_ref().unwrap(), [9; 100]).unwrap();
        c.downloaded(z, Some(Bytes::from(vec![9; 100])));
        let failed = c.want("s3://b/w", 100).unwrap();
        std::fs::write(failed.file.as_ref().unwrap(), [1; 10]).unwrap();
        c.downloaded(failed, None);
        assert!(c.whole("s3://b/w").is_none());
        assert!(c.whole("s3://b/z").is_some());
        let on_disk: u64 = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(on_disk <= 250, "{on_disk} bytes on disk");
        assert_eq!(crate::lock(c.disk.as_ref().unwrap()).map.len(), 2);
        assert!(c.whole("s3://b/y").is_some(), "y was used last");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
