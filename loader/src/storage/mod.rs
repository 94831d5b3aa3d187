//! Where a source's bytes live: local files, or objects in S3, GCS, Azure,
//! on HTTP servers or behind `file://` URLs (feature `remote`, off by
//! default), read through the `object_store` crate.
//!
//! A source is opened from a path or a URL alike (`open_path("s3://bucket/train/")`,
//! `WebDataset::open(["https://host/shards/train-0000.tar"])`): a path
//! whose text starts with `scheme://` is a URL. Shards are read with ranged
//! requests where the format gives offsets (safetensors headers, a
//! TFRecord index, the tar headers a shard's index pass found), a sample
//! file with one GET. The index pass over a shard without an index reads
//! it front to back in 8 MiB requests.
//!
//! Credentials and endpoints come from the environment as the cloud tools
//! read them (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`,
//! ...) or from [`configure`]. Requests are retried by the store three
//! times within 20 s (a request times out after 30 s), then fail with
//! [`Error::Remote`](crate::Error::Remote) naming the URL; a network or
//! server failure is transient, so the loader's
//! [`retry`](crate::LoaderBuilder::retry) policy tries the sample again.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

#[cfg(feature = "remote")]
use bytes::Bytes;
#[cfg(not(feature = "remote"))]
type Bytes = Vec<u8>;

#[cfg(feature = "remote")]
mod cache;
pub(crate) mod local;
pub(crate) mod mmap;
#[cfg(feature = "remote")]
pub(crate) mod remote;
#[cfg(not(feature = "remote"))]
#[path = "remote_stub.rs"]
pub(crate) mod remote;
pub(crate) mod spans;

/// Bytes a sequential reader of a remote object asks for at once, at most.
const WINDOW: u64 = 8 << 20;

/// Bytes of a sequential reader's first window.
const FIRST_WINDOW: u64 = 1 << 20;

/// Sets object-store options for every URL under `prefix`
/// (`"s3://my-bucket"`, `"https://host"`; matched at a `/`, so
/// `"s3://data"` is not `"s3://data-public"`), over the environment's: the
/// keys are `object_store`'s configuration keys (`aws_endpoint`,
/// `aws_region`, `aws_access_key_id`, `aws_allow_http`,
/// `google_service_account`, `azure_storage_account_name`, `timeout`,
/// `read_timeout`, ...). Applies to stores made after the call. An
/// unknown key fails the first open of such a URL, naming it. `timeout`
/// bounds each ranged request (30 s by default); a whole object's download
/// (token files, Megatron's, the cache's) is bounded by progress instead:
/// `read_timeout` (30 s by default) without a byte fails it.
///
/// ```
/// candle_wick::storage::configure(
///     "s3://datasets",
///     [("aws_endpoint", "http://127.0.0.1:9000"), ("aws_allow_http", "true")],
/// );
/// ```
pub fn configure<K: Into<String>, V: Into<String>>(
    prefix: &str,
    options: impl IntoIterator<Item = (K, V)>,
) {
    let opts = options
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    remote::configure(prefix, opts);
}

/// A bounded local cache of remote objects, for the whole process (every
/// loader and source in it): whole objects kept in memory, within
/// `memory` bytes (least recently used first out; an object over a
/// quarter of it is not kept there), and optionally as files in a
/// directory, within their own limit, that a restarted run — or another
/// rank on the node given the same directory — reads instead of the store.
///
/// A shard read at random is read with ranged requests while a download
/// in the background (a few at once) fetches it whole; from then on its
/// reads are local. A sample file is kept from its GET. A shard is known by
/// its URL, size and entity tag (a rewritten shard is fetched anew), a
/// sample file by its URL alone: clear the directory after rewriting sample
/// files in place. The memory held counts in the loader's RAM budget.
///
/// ```
/// use candle_wick::storage::RemoteCache;
/// let cache = RemoteCache::memory(2 << 30).disk("/tmp/wick-cache", 200 << 30);
/// candle_wick::storage::set_cache(&cache)?;
/// # Ok::<(), candle_wick::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteCache {
    pub(crate) memory: u64,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) disk: u64,
}

impl RemoteCache {
    /// A cache of at most `bytes` in memory (0: none in memory).
    pub fn memory(bytes: u64) -> Self {
        Self {
            memory: bytes,
            ..Self::default()
        }
    }

    /// Also keeps objects as files in `dir` (made if missing), at most
    /// `bytes` of them.
    pub fn disk(mut self, dir: impl Into<PathBuf>, bytes: u64) -> Self {
        self.dir = Some(dir.into());
        self.disk = bytes;
        self
    }

    /// The memory limit in bytes.
    pub fn memory_limit(&self) -> u64 {
        self.memory
    }
}

/// Uses `cache` for the remote objects read from now on, in the whole
/// process (an equal cache keeps what is cached; `RemoteCache::default()`
/// turns caching off). Fails if the directory cannot be made. Without the
/// `remote` feature there is nothing to cache and it does nothing.
pub fn set_cache(cache: &RemoteCache) -> Result<()> {
    #[cfg(feature = "remote")]
    return cache::set(cache);
    #[cfg(not(feature = "remote"))]
    {
        let _ = cache;
        Ok(())
    }
}

/// Bytes the remote-object cache holds in memory now (downloads into it
/// in flight included).
pub(crate) fn cache_memory() -> u64 {
    #[cfg(feature = "remote")]
    return cache::memory();
    #[cfg(not(feature = "remote"))]
    0
}

/// Whether the remote-object cache in use keeps files in a directory
/// (shared by the node's processes).
pub(crate) fn cache_has_dir() -> bool {
    #[cfg(feature = "remote")]
    return cache::current().is_some_and(|c| c.has_dir());
    #[cfg(not(feature = "remote"))]
    false
}

/// The byte limit of the remote-object cache's directory, when the
/// loader's `config` (else the cache in use) keeps one.
pub(crate) fn cache_dir_limit(config: Option<&RemoteCache>) -> Option<u64> {
    #[cfg(feature = "remote")]
    if config.is_none() {
        return cache::current().and_then(|c| c.dir_limit());
    }
    config.filter(|c| c.dir.is_some()).map(|c| c.disk)
}

/// What the remote-object cache ([`set_cache`]) holds now: `(bytes in
/// memory, bytes of files in its directory)`, `(0, 0)` without one.
pub fn cached_bytes() -> (u64, u64) {
    #[cfg(feature = "remote")]
    return (cache::memory(), cache::disk());
    #[cfg(not(feature = "remote"))]
    (0, 0)
}

/// Whether `path` is a URL (`s3://..`, `https://..`, `file://..`) rather
/// than a local path.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| {
        s.split_once("://").is_some_and(|(scheme, _)| {
            scheme.len() > 1
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+')
        })
    })
}

/// The text of a URL path (checked by [`is_url`]).
pub(crate) fn url_of(path: &Path) -> &str {
    path.to_str().unwrap_or_default()
}

/// A shard or sample file, open for positioned reads.
#[derive(Debug, Clone)]
pub(crate) enum Blob {
    /// A local file (closed and reopened past the open-files budget).
    Local(local::LocalFile),
    /// An object in a store.
    Remote(remote::Object),
}

impl Blob {
    /// Opens `path` (a local path or a URL) and returns it with its size.
    pub(crate) fn open(path: &Path) -> Result<(Self, u64)> {
        if is_url(path) {
            let o = remote::Object::open(url_of(path))?;
            let len = o.len();
            return Ok((Blob::Remote(o), len));
        }
        let (file, len) = local::LocalFile::open(path)?;
        Ok((Blob::Local(file), len))
    }

    /// Opens `path` as a manifest lists it: an object with an entity tag
    /// is opened with no request (`size` bytes, its reads pinned to the
    /// tag, so a rewrite since is refused on the first read); anything
    /// else as [`Blob::open`] does. Returns it with its size.
    pub(crate) fn open_listed(path: &Path, size: u64, e_tag: Option<&str>) -> Result<(Self, u64)> {
        match e_tag {
            Some(tag) if is_url(path) => Ok((
                Blob::Remote(remote::Object::open_listed(url_of(path), size, tag)?),
                size,
            )),
            _ => Self::open(path),
        }
    }

    /// The object's entity tag, for a remote blob whose store gives one.
    pub(crate) fn version(&self) -> Option<String> {
        match self {
            Blob::Local(_) => None,
            Blob::Remote(o) => o.version(),
        }
    }

    /// Fills `buf` from `offset` (`path` names the blob in errors) without
    /// a shared cursor, so workers read one shard concurrently.
    pub(crate) fn read_exact_at(&self, path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
        match self {
            Blob::Local(file) => local::read_exact_at(&*file.file()?, path, offset, buf),
            Blob::Remote(o) => {
                if let Some(read) = spans::Spans::read(o, offset, buf) {
                    return read;
                }
                if let Some(read) = Sequential::read(o, path, offset, buf) {
                    return read;
                }
                let end = offset + buf.len() as u64;
                if end > o.len() {
                    return Err(crate::error::shard_error(
                        path,
                        offset,
                        format!("object ends inside a {}-byte record", buf.len()),
                    ));
                }
                buf.copy_from_slice(&o.get_range(offset..end)?);
                Ok(())
            }
        }
    }

    /// A sequential reader from the start (`Read + Seek`), for index
    /// passes and streams: a remote object is read in 8 MiB requests.
    pub(crate) fn reader(&self, path: &Path, len: u64) -> BlobReader {
        BlobReader {
            blob: self.clone(),
            path: path.to_path_buf(),
            len,
            pos: 0,
            window: (0, Bytes::new()),
            next: None,
            span: FIRST_WINDOW,
        }
    }
}

/// Most windowed readers a [`Sequential`] keeps (a shard read in a few
/// regions at once: a safetensors shard's images and its other tensors).
const SEQUENTIAL_READERS: usize = 4;

/// Windows over the remote objects one stream reads in order: inside
/// [`Sequential::run`], a positioned read of a remote blob on this thread
/// goes through a [`BlobReader`] of that object whose window (or the next
/// one, read ahead) holds it, so a shard streamed record by record costs a
/// request per 8 MiB, not one per record. Dropped with the stream.
#[derive(Debug, Default)]
pub(crate) struct Sequential {
    /// `(object URL, reader, last use)`.
    readers: Vec<(String, BlobReader, u64)>,
    tick: u64,
}

thread_local! {
    static SEQUENTIAL: std::cell::RefCell<Option<Sequential>> = const { std::cell::RefCell::new(None) };
}

impl Sequential {
    /// Runs `f` with this stream's windows in use on this thread.
    pub(crate) fn run<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let mine = std::mem::take(self);
        let outer = SEQUENTIAL.with(|s| s.borrow_mut().replace(mine));
        // Put back even if `f` panics (the stream reports the panic).
        struct Restore<'a>(&'a mut Sequential, Option<Sequential>);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                let mine =
                    SEQUENTIAL.with(|s| std::mem::replace(&mut *s.borrow_mut(), self.1.take()));
                *self.0 = mine.unwrap_or_default();
            }
        }
        let _restore = Restore(self, outer);
        f()
    }

    /// A read of `o` through the thread's windows, if a stream runs here.
    fn read(o: &remote::Object, path: &Path, offset: u64, buf: &mut [u8]) -> Option<Result<()>> {
        SEQUENTIAL.with(|s| {
            let mut s = s.borrow_mut();
            let seq = s.as_mut()?;
            seq.tick += 1;
            let url = url_of(path);
            let near = seq
                .readers
                .iter()
                .position(|(u, r, _)| u == url && r.covers(offset));
            let at = match near {
                Some(at) => at,
                None => {
                    if seq.readers.len() >= SEQUENTIAL_READERS {
                        let oldest = (0..seq.readers.len()).min_by_key(|&i| seq.readers[i].2)?;
                        seq.readers.swap_remove(oldest);
                    }
                    let reader = Blob::Remote(o.clone()).reader(path, o.len());
                    seq.readers.push((url.to_string(), reader, 0));
                    seq.readers.len() - 1
                }
            };
            let tick = seq.tick;
            let (_, reader, used) = &mut seq.readers[at];
            *used = tick;
            Some(reader.read_exact_at(offset, buf))
        })
    }
}

/// Reads a blob front to back (seeking allowed), in windows for a remote one.
#[derive(Debug)]
pub(crate) struct BlobReader {
    blob: Blob,
    path: PathBuf,
    len: u64,
    pos: u64,
    /// `(start, bytes)` of the last window read (remote only).
    window: (u64, Bytes),
    /// The next window, `start..end`, being read while this one is used
    /// (remote only).
    next: Option<(u64, u64, remote::Pending)>,
    /// Bytes of the next window: from [`FIRST_WINDOW`], doubled each
    /// window up to [`WINDOW`], so a stream's first bytes come soon.
    span: u64,
}

impl BlobReader {
    /// Fills `buf` from `offset`, through the window for a remote blob.
    pub(crate) fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let Blob::Remote(_) = &self.blob else {
            return self.blob.read_exact_at(&self.path, offset, buf);
        };
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let n = self.fill(at)?;
            if n == 0 {
                return Err(crate::error::shard_error(
                    &self.path,
                    offset,
                    format!("object ends inside a {}-byte record", buf.len()),
                ));
            }
            let (start, win) = &self.window;
            let from = (at - start) as usize;
            let take = (win.len() - from).min(buf.len() - done);
            buf[done..done + take].copy_from_slice(&win[from..from + take]);
            done += take;
        }
        Ok(())
    }

    /// Whether a read at `offset` is in the window or the one read ahead.
    fn covers(&self, offset: u64) -> bool {
        let start = self.window.0;
        offset >= start && offset < start + self.window.1.len() as u64 + WINDOW
    }

    /// Makes the window hold `at` (remote); the bytes available from it.
    fn fill(&mut self, at: u64) -> Result<usize> {
        let (start, win) = &self.window;
        if at >= *start && at < start + win.len() as u64 {
            return Ok((start + win.len() as u64 - at) as usize);
        }
        if at >= self.len {
            return Ok(0);
        }
        let Blob::Remote(o) = &self.blob else {
            return Ok(0);
        };
        // The window read ahead, if it holds `at` (an index pass seeks
        // over a member's data, so the next read seldom starts exactly at
        // the window's end); else a new window from `at`, the one read
        // ahead dropped (a seek past it or back).
        let (start, window) = match self.next.take() {
            Some(next) if at >= next.0 && at < next.1 => (next.0, next.2.wait()?),
            _ => {
                let end = (at + self.span).min(self.len);
                (at, o.read_range(at..end, false)?)
            }
        };
        self.span = (self.span * 2).min(WINDOW);
        let end = start + window.len() as u64;
        self.window = (start, window);
        if end <= at {
            return Ok(0);
        }
        if end < self.len {
            // Read ahead: the next window comes while this one is used.
            let next_end = (end + self.span).min(self.len);
            self.next = Some((end, next_end, o.start_range(end..next_end, false)));
        }
        Ok((end - at) as usize)
    }
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let n = match &self.blob {
            Blob::Local(file) => {
                let file = file.file().map_err(std::io::Error::other)?;
                #[cfg(unix)]
                let n = std::os::unix::fs::FileExt::read_at(&*file, buf, self.pos)?;
                #[cfg(windows)]
                let n = std::os::windows::fs::FileExt::seek_read(&*file, buf, self.pos)?;
                n
            }
            Blob::Remote(_) => {
                let avail = self.fill(self.pos).map_err(std::io::Error::other)?;
                let n = avail.min(buf.len());
                let from = (self.pos - self.window.0) as usize;
                buf[..n].copy_from_slice(&self.window.1[from..from + n]);
                n
            }
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for BlobReader {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        Ok(self.pos)
    }
}

/// Reads a whole sample file or object into `bytes` (its capacity reused),
/// at most `max` bytes; the error names it.
pub(crate) fn read_whole(path: &Path, bytes: Vec<u8>, max: u64) -> Result<Vec<u8>> {
    if !is_url(path) {
        return local::read_file_into(path, bytes);
    }
    // One GET (no HEAD first): a sample file is one request.
    let got = match remote::get_whole(url_of(path), max)? {
        Ok(got) => got,
        Err(len) => {
            return Err(Error::Dataset {
                path: path.to_path_buf(),
                reason: format!("sample object is {len} bytes, over the {max}-byte limit"),
                source: None,
            })
        }
    };
    let mut bytes = bytes;
    bytes.clear();
    bytes.extend_from_slice(&got);
    if bytes.is_empty() {
        return Err(Error::EmptyFile {
            key: path.display().to_string(),
        });
    }
    Ok(bytes)
}

/// Checks that the URL `url` names an object this build can read, sending
/// nothing: an error naming it (credentials redacted) otherwise.
pub(crate) fn check_url(url: &Path) -> Result<()> {
    remote::check(url_of(url))
}

/// The file or object at `path` whole, read past the remote cache's
/// memory (an object rewritten in place is never read stale; with a cache
/// directory its bytes cross the network once a node, each process asking
/// whether it changed), or `None` when there is none; over `max` bytes is
/// an error naming it.
pub(crate) fn read_if_exists(path: &Path, max: u64) -> Result<Option<Vec<u8>>> {
    let too_big = |len: u64| Error::Dataset {
        path: path.to_path_buf(),
        reason: format!("is {len} bytes, over the {max}-byte limit"),
        source: None,
    };
    if is_url(path) {
        return match remote::get_if_exists(url_of(path), max)? {
            None => Ok(None),
            Some(Ok(bytes)) => Ok(Some(bytes.to_vec())),
            Some(Err(len)) => Err(too_big(len)),
        };
    }
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if len > max {
        return Err(too_big(len));
    }
    std::fs::read(path).map(Some).map_err(io)
}

/// The object at `url` whole, as an open local file (for a format read as
/// a local file: memory-mapped token files): the remote cache directory's
/// file ([`RemoteCache::disk`], fetched into it when missing, reused
/// after a restart), else a temporary file already deleted.
pub(crate) fn local_copy(url: &Path) -> Result<File> {
    remote::local_copy(url_of(url))
}

/// The open file, its size and its mapping. A URL's object is fetched
/// whole to a local file first (the remote cache's directory, when it has
/// one, keeps it for later runs; else a temporary file, deleted once
/// mapped: the mapping keeps its pages) and mapped from there.
///
/// `known`: the object's size and a tag naming its bytes (a checksum), as
/// a manifest gives them: fetched with no HEAD, cached under them.
pub(crate) fn map_file(
    path: &Path,
    known: Option<(u64, &str)>,
) -> Result<(File, u64, memmap2::Mmap)> {
    let (file, bytes) = if is_url(path) {
        let file = match known {
            Some((size, tag)) => remote::local_copy_known(url_of(path), size, tag)?,
            None => local_copy(path)?,
        };
        let bytes = file
            .metadata()
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        (file, bytes)
    } else {
        local::open_shard(path)?
    };
    let map = map_open(path, &file)?;
    Ok((file, bytes, map))
}

/// Maps the open `file` (named `path` in errors) read-only.
fn map_open(path: &Path, file: &File) -> Result<memmap2::Mmap> {
    // SAFETY: the map is read-only and every access is bounds-checked
    // against its length. That is sound only while no one writes the file
    // in place, which this module cannot enforce (a concurrent write
    // changes bytes behind `&[u8]`): the callers' docs state the contract. A
    // remote object's copy, or a file the node's processes share through
    // the cache directory, is a file no writer has open (the cache renames
    // a finished, synced file into place, or it is a deleted temporary).
    // A truncation is SIGBUS on the next read of a lost page, which the
    // mapping's guard (storage/mmap.rs) turns into zeros and an error on Linux.
    unsafe { memmap2::Mmap::map(file) }.map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Bytes read in place: a mapped file, or this process's own copy.
#[derive(Debug)]
pub(crate) enum Backing {
    /// Bytes in this process's memory.
    Heap(Vec<u8>),
    /// A mapped file, read-only and shared with every process that maps
    /// it (a node's ranks, through a local file or the node's cache
    /// directory), guarded against a truncation while it is read (the
    /// guard goes before the mapping).
    Mapped(mmap::Guard, memmap2::Mmap),
}

impl Backing {
    /// `map`, guarded against a cut while mapped when a guard is free
    /// (4,096 at once, token files included), else copied into memory.
    fn of(map: memmap2::Mmap) -> Self {
        match mmap::Guard::try_new(&map) {
            Some(guard) => Backing::Mapped(guard, map),
            None => Backing::Heap(map.to_vec()),
        }
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Heap(b) => b,
            Backing::Mapped(_, map) => map,
        }
    }

    /// Whether the mapped file was cut short while mapped: what was read
    /// from it since is zeros, not the file.
    pub(crate) fn damaged(&self) -> bool {
        matches!(self, Backing::Mapped(guard, _) if guard.damaged())
    }
}

/// [`map_file`] read in place ([`Backing`]).
pub(crate) fn map_backed(path: &Path, known: Option<(u64, &str)>) -> Result<Backing> {
    let (_file, _bytes, map) = map_file(path, known)?;
    Ok(Backing::of(map))
}

/// A file that one process of the node makes for all of them, in the
/// remote cache's directory ([`node_file`]).
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub(crate) enum NodeFile {
    /// Made by a process of the node (this one, earlier, or another):
    /// mapped.
    Ready(Backing),
    /// This process holds the file's lock (until the lock drops): it
    /// makes the file and [`node_publish`]es it.
    Mine(File),
    /// Another process holds the lock (only when not waiting).
    Busy,
    /// No cache directory (or no `flock`): each process makes its own.
    Alone,
}

/// The file the node's processes share under `key` (see
/// [`NodeFile`]): there already; else this process's to make, its lock
/// taken; else, while another process makes it, [`NodeFile::Busy`], or
/// when `wait` the file once that process publishes it (or the lock,
/// when it ended without). The lock is the kernel's, released when its
/// holder ends: a process that dies making the file holds no one up, and
/// one started late finds the file made.
pub(crate) fn node_file(key: &str, wait: bool) -> Result<NodeFile> {
    #[cfg(feature = "remote")]
    if let Some(cache) = cache::current() {
        use cache::Claim;
        let Some(claim) = cache.claim(key, wait) else {
            return Ok(NodeFile::Alone);
        };
        return Ok(match claim {
            Claim::Ready(file) => {
                let path = cache.path_of(key).unwrap_or_default();
                NodeFile::Ready(Backing::of(map_open(&path, &file)?))
            }
            Claim::Mine(lock) => NodeFile::Mine(lock),
            Claim::Busy => NodeFile::Busy,
        });
    }
    let _ = (key, wait);
    Ok(NodeFile::Alone)
}

/// Writes `bytes` as the node's file `key`, for the process holding its
/// lock ([`NodeFile::Mine`]).
pub(crate) fn node_publish(key: &str, bytes: &[u8]) -> Result<()> {
    #[cfg(feature = "remote")]
    if let Some(cache) = cache::current() {
        return cache.publish(key, bytes);
    }
    let _ = (key, bytes);
    Ok(())
}

/// [`map_file`] of a file read a range at a time (a token file): a
/// remote object of more than two chunks (32 MiB each) is mapped from a
/// local copy that ranged GETs fill as reads reach it, shared by the
/// node's processes through the remote cache's directory
/// (`remote/chunks.rs`): call [`Chunks::ensure`] on a range before reading
/// it. Anything else is mapped as [`map_file`] maps it, with no `Chunks`.
pub(crate) fn map_by_range(
    path: &Path,
) -> Result<(File, u64, memmap2::Mmap, Option<std::sync::Arc<Chunks>>)> {
    #[cfg(feature = "remote")]
    if is_url(path) {
        if let Some((file, chunks)) = Chunks::open(url_of(path))? {
            let size = chunks.size();
            let len = usize::try_from(size).map_err(|_| Error::Dataset {
                path: path.to_path_buf(),
                reason: format!("{size} bytes cannot be mapped on this machine"),
                source: None,
            })?;
            // SAFETY: as in `map_file`: read-only, every access
            // bounds-checked against the map's length (the object's
            // bytes; the chunk marks after them are not mapped). The file
            // is written in place only where no reader reads: a chunk is
            // read only after `ensure` finds it written, and it is not
            // written again.
            let map =
                unsafe { memmap2::MmapOptions::new().len(len).map(&file) }.map_err(|source| {
                    Error::Io {
                        path: path.to_path_buf(),
                        source,
                    }
                })?;
            return Ok((file, size, map, Some(chunks)));
        }
    }
    let (file, bytes, map) = map_file(path, None)?;
    Ok((file, bytes, map, None))
}

/// Sets the bytes of a chunk that [`map_by_range`] fetches (tests: small
/// objects read in chunks). Process-wide.
#[doc(hidden)]
pub fn __set_chunk_bytes(bytes: u64) {
    remote::chunks::set_chunk_bytes(bytes);
}

/// Writes the local file `local` as the object at `url` (one PUT, or a
/// multipart upload for a large file); the error names the URL.
pub(crate) fn upload(local: &Path, url: &Path) -> Result<()> {
    remote::upload(local, url_of(url))
}

/// Deletes the object at `url`; the error names it.
pub(crate) fn delete(url: &Path) -> Result<()> {
    remote::delete(url_of(url))
}

/// Every object under the URL prefix `url`, as URLs, sorted; the sizes
/// and versions of those ending with one of `opened` kept for their opens.
pub(crate) fn list_all(url: &str, opened: &[&str]) -> Result<Vec<String>> {
    remote::list(url, true, &|u| opened.iter().any(|s| u.ends_with(s)))
}

/// Runs `f` with each URL prefix listed at most once on this thread.
pub(crate) use remote::chunks::Chunks;
pub(crate) use remote::one_listing;

/// The objects a URL names: itself when its name ends with one of
/// `suffixes`; a brace pattern's expansion (`train-{0000..0099}.tar`, as
/// WebDataset writes shard lists); else every object under it (a prefix)
/// whose name ends with one of them, directly in it as a local folder's
/// files are (not in its subfolders: `train/` and `val/` under one prefix
/// stay apart), sorted. An error when none does.
pub(crate) fn list_urls(url: &str, suffixes: &[&str]) -> Result<Vec<PathBuf>> {
    let ends = |u: &str| suffixes.iter().any(|s| u.ends_with(s));
    let urls: Vec<String> = if let Some(expanded) = expand_braces(url)? {
        expanded.into_iter().filter(|u| ends(u)).collect()
    } else if ends(url) {
        vec![url.to_string()]
    } else {
        let prefix = url.trim_end_matches('/');
        remote::list(prefix, false, &ends)?
            .into_iter()
            .filter(|u| ends(u))
            .collect()
    };
    if urls.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "no object under {url:?} ends with {}",
            suffixes.join(" or ")
        )));
    }
    Ok(urls.into_iter().map(PathBuf::from).collect())
}

/// `a{000..002}b` as `a000b a001b a002b` (zero padding kept); `None`
/// without a brace range; an error for a malformed one.
pub(crate) fn expand_braces(s: &str) -> Result<Option<Vec<String>>> {
    let Some(open) = s.find('{') else {
        return Ok(None);
    };
    let bad = || Error::InvalidConfig(format!("{s:?}: a brace range is {{first..last}}, digits"));
    let close = s[open..].find('}').ok_or_else(bad)? + open;
    let (a, b) = s[open + 1..close].split_once("..").ok_or_else(bad)?;
    let (first, last): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if last < first || last - first > 1_000_000 {
        return Err(bad());
    }
    let width = a.len();
    let mut out = Vec::new();
    for n in first..=last {
        let one = format!("{}{n:0width$}{}", &s[..open], &s[close + 1..]);
        match expand_braces(&one)? {
            Some(more) => out.extend(more),
            None => out.push(one),
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_brace_ranges() {
        assert!(is_url(Path::new("s3://b/k")) && is_url(Path::new("file:///tmp/x")));
        assert!(!is_url(Path::new("/data/train")) && !is_url(Path::new("C:\\data")));
        assert_eq!(
            expand_braces("s3://b/t-{08..10}.tar").unwrap().unwrap(),
            ["s3://b/t-08.tar", "s3://b/t-09.tar", "s3://b/t-10.tar"]
        );
        assert_eq!(expand_braces("s3://b/t.tar").unwrap(), None);
        assert!(expand_braces("t-{3..1}.tar").is_err());
        assert!(expand_braces("t-{a..b}.tar").is_err());
    }

    #[test]
    fn a_remote_blob_reads_like_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.bin");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let url = PathBuf::from(format!("file://{}", path.display()));
        if cfg!(not(feature = "remote")) {
            assert!(Blob::open(&url).is_err());
            return;
        }
        let (blob, len) = Blob::open(&url).unwrap();
        assert_eq!(len, data.len() as u64);
        let mut buf = vec![0; 1000];
        blob.read_exact_at(&url, 500, &mut buf).unwrap();
        assert_eq!(buf, data[500..1500]);
        let mut r = blob.reader(&url, len);
        r.seek(SeekFrom::Start(99_000)).unwrap();
        let mut tail = Vec::new();
        r.read_to_end(&mut tail).unwrap();
        assert_eq!(tail, data[99_000..]);
        let err = blob.read_exact_at(&url, 99_990, &mut buf).unwrap_err();
        assert!(err.to_string().contains("ends inside"), "{err}");
        let missing = PathBuf::from(format!("file://{}/nope", dir.path().display()));
        let err = crate::error::error_chain(&Blob::open(&missing).unwrap_err());
        assert!(err.contains("nope") && err.contains("not found"), "{err}");
        let listed = list_urls(&format!("file://{}", dir.path().display()), &[".bin"]).unwrap();
        assert_eq!(listed, [url]);
    }

    /// Over several windows, each read ahead while the one before is
    /// used: front to back, across window edges, and after seeks into a
    /// window read ahead, past it and back.
    #[cfg(feature = "remote")]
    #[test]
    fn a_reader_reads_ahead_across_windows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.bin");
        let n = 2 * WINDOW as usize + 12_345;
        let data: Vec<u8> = (0..n as u64).map(|i| (i * 31 % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let url = PathBuf::from(format!("file://{}", path.display()));
        let (blob, len) = Blob::open(&url).unwrap();
        let mut r = blob.reader(&url, len);
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        assert!(all == data, "front to back");
        let w = WINDOW as usize;
        for (at, n) in [
            (w - 10, 20),
            (w + 5, 100),
            (2 * w + 12_000, 345),
            (3, 7),
            (w - 1, w + 2),
        ] {
            let mut buf = vec![0; n];
            r.read_exact_at(at as u64, &mut buf).unwrap();
            assert!(buf == data[at..at + n], "{n} bytes at {at}");
        }
        r.seek(SeekFrom::Start(w as u64 + 1)).unwrap();
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(rest == data[w + 1..], "after a seek");
    }
}
