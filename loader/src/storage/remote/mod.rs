//! Objects in S3, GCS, Azure, HTTP servers and local files, through the
//! `object_store` crate, read from the loader's blocking worker threads.
//!
//! The async side stays here: one small tokio runtime on its own threads
//! (`wick-io`), made on first use, runs every request; callers block on
//! its result. One client per store (scheme and bucket or host) is kept
//! for the process, so its connections are reused. Credentials, regions
//! and endpoints come from the usual environment variables (`AWS_*` with
//! `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP`, `GOOGLE_*`, `AZURE_*`, read by
//! the store builders' `from_env`), then from options given with
//! [`configure`](super::configure).

use super::cache::{Download, ObjectCache};
use crate::error::{Error, Result};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub(crate) mod chunks;
mod runtime;
mod stores;
mod upload;

pub(crate) use runtime::block_on;
use runtime::runtime;
pub(crate) use stores::{configure, remote_error, store};
use stores::{split, store_for, Use};
pub(crate) use upload::upload;

/// A version of an object: its entity tag, else its modification time (a
/// server without tags).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Version {
    e_tag: Option<String>,
    modified: Option<chrono::DateTime<chrono::Utc>>,
}

impl Version {
    fn of(meta: &object_store::ObjectMeta) -> Self {
        Self {
            e_tag: meta.e_tag.clone(),
            modified: Some(meta.last_modified),
        }
    }

    /// `options` made conditional on this version: `If-Match` its tag (a
    /// strong one; a weak tag never matches), else `If-Unmodified-Since`.
    fn require(&self, options: GetOptions) -> GetOptions {
        match &self.e_tag {
            Some(tag) if !tag.starts_with("W/") => options.with_if_match(Some(tag.clone())),
            _ => GetOptions {
                if_unmodified_since: self.modified,
                ..options
            },
        }
    }

    /// The cache's name for the object at `url` of `size` bytes in this
    /// version.
    fn key(&self, url: &str, size: u64) -> String {
        let tag = match (&self.e_tag, &self.modified) {
            (Some(tag), _) => tag.clone(),
            (None, Some(t)) => t.timestamp_micros().to_string(),
            (None, None) => String::new(),
        };
        format!("{url}#{size}#{tag}")
    }
}

/// One object: its store, path, size, and the version its reads require:
/// the version its first read got (the bytes an index is built from) is
/// what every later read asks for (`If-Match`), and a response of another
/// version is refused too (a server that ignores the condition). Pinned
/// by the first read rather than the listing, since a listing and the
/// reads may come from different front ends (an S3 API behind a CDN or a
/// proxy) whose tags differ for the same bytes.
#[derive(Clone)]
pub(crate) struct Object {
    store: Arc<dyn ObjectStore>,
    /// Its store's `scheme://authority`, whose back-off its reads share.
    root: Arc<str>,
    path: ObjectPath,
    url: Arc<str>,
    len: u64,
    /// The version its first read got, shared by its clones.
    pinned: Arc<OnceLock<Version>>,
    /// Its name in the local cache: URL, size and the listed version.
    key: Arc<str>,
    /// The version its listing or HEAD gave.
    opened: Version,
}

// By hand: the store's own `Debug` may print credentials (object_store
// derives it for Azure's keys and SAS tokens).
impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("url", &self.url)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The error for a read of `url` refused because the object is not the
/// one its first read got.
fn changed(url: &str, source: crate::error::BoxError) -> Error {
    Error::Remote {
        url: url.to_string(),
        reason: "the object changed since it was opened or indexed (its entity tag or time \
                 differs): open the dataset again (after `wick index`, when it has a manifest)"
            .into(),
        transient: false,
        source,
    }
}

/// [`remote_error`], or [`changed`] for a failed precondition.
fn read_error(url: &str, what: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::Precondition { .. } => changed(url, Box::new(e)),
        e => remote_error(url, what, e),
    }
}

impl Object {
    /// Opens `url`: its size and version from the listing that just named
    /// it, else from a HEAD request.
    pub(crate) fn open(url: &str) -> Result<Self> {
        let (store, path) = store(url)?;
        let (size, version) = match crate::sync::lock(listed()).remove(url) {
            Some(known) => known,
            None => {
                let (s, p) = (store.clone(), path.clone());
                let meta = block_on(async move { s.head(&p).await })?
                    .map_err(|e| remote_error(url, "cannot read the object's size", e))?;
                (meta.size, Version::of(&meta))
            }
        };
        Self::made(url, (store, path), size, version)
    }

    /// Opens `url` as a manifest lists it, sending nothing: `size` bytes,
    /// every read pinned from the first to the entity tag `e_tag`
    /// (`If-Match`), so an object rewritten since it was listed is refused
    /// by its store (and a response of another version by the loader).
    pub(crate) fn open_listed(url: &str, size: u64, e_tag: &str) -> Result<Self> {
        let version = Version {
            e_tag: Some(e_tag.to_string()),
            modified: None,
        };
        let o = Self::made(url, store(url)?, size, version.clone())?;
        let _ = o.pinned.set(version);
        Ok(o)
    }

    fn made(
        url: &str,
        (store, path): (Arc<dyn ObjectStore>, ObjectPath),
        size: u64,
        version: Version,
    ) -> Result<Self> {
        Ok(Self {
            store,
            root: split(url)?.0.into(),
            path,
            url: url.into(),
            len: size,
            key: version.key(url, size).into(),
            pinned: Arc::default(),
            opened: version,
        })
    }

    /// The object's size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// What the object is known by in caches: its URL, size and entity tag.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The object's entity tag: the one its reads are pinned to once it
    /// was read, else the one it was opened with. `None` for a server
    /// without tags.
    pub(crate) fn version(&self) -> Option<String> {
        self.pinned.get().unwrap_or(&self.opened).e_tag.clone()
    }

    /// `options` asking for the pinned version, once there is one.
    fn require(&self, options: GetOptions) -> GetOptions {
        match self.pinned.get() {
            Some(v) => v.require(options),
            None => options,
        }
    }

    /// Pins the version of a response (`meta`) if none is yet, else
    /// refuses one of another version.
    fn same_version(&self, meta: &object_store::ObjectMeta) -> Result<()> {
        let got = Version::of(meta);
        let pinned = self.pinned.get_or_init(|| got.clone());
        let other = match (&pinned.e_tag, &got.e_tag) {
            (Some(a), Some(b)) => a != b,
            (None, None) => pinned.modified != got.modified,
            _ => false,
        };
        if other {
            return Err(changed(
                &self.url,
                format!("{:?} then {:?}", pinned.e_tag, got.e_tag).into(),
            ));
        }
        Ok(())
    }

    /// Bytes `range` of the object: from the local cache, else one ranged
    /// GET of the version the open saw (and the whole object is fetched
    /// for the cache in the background, when one is set and fits it).
    pub(crate) fn get_range(&self, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.read_range(range, true)
    }

    /// [`Self::get_range`], starting the whole object's download for the
    /// cache only when `fill`: a reader going front to back (an index
    /// pass, a stream) reads every byte itself, and a download beside it
    /// would fetch the object twice.
    pub(crate) fn read_range(&self, range: std::ops::Range<u64>, fill: bool) -> Result<Bytes> {
        if let Some(cache) = super::cache::current() {
            if let Some(got) = cache.read(&self.key, self.len, range.clone()) {
                return Ok(got);
            }
            if let Some(download) = cache.want(&self.key, self.len).filter(|_| fill) {
                self.download(cache, download);
            }
        }
        self.fetch_range(range)
    }

    /// Bytes `range` of the object in one ranged GET of the version the
    /// open saw, past any cache.
    fn fetch_range(&self, range: std::ops::Range<u64>) -> Result<Bytes> {
        let (s, p) = (self.store.clone(), self.path.clone());
        let options = self.require(GetOptions::new().with_range(Some(range.clone())));
        backoff_wait(&self.root);
        let got = block_on(async move {
            let r = s.get_opts(&p, options).await?;
            let meta = r.meta.clone();
            r.bytes().await.map(|b| (meta, b))
        })?;
        backoff_note(&self.root, &got);
        let (meta, got) = got.map_err(|e| {
            read_error(
                &self.url,
                &format!("cannot read bytes {}..{}", range.start, range.end),
                e,
            )
        })?;
        self.same_version(&meta)?;
        if got.len() as u64 != range.end - range.start {
            return Err(Error::Remote {
                url: self.url.to_string(),
                reason: format!(
                    "asked for bytes {}..{}, got {} bytes (the object changed?)",
                    range.start,
                    range.end,
                    got.len()
                ),
                transient: false,
                source: "short read".into(),
            });
        }
        Ok(got)
    }
}

/// A store's shared back-off: after a request failed for a reason that may
/// pass (a 503 SlowDown, a timeout: the store's own retries spent), every
/// ranged read of that store waits before it starts, 50 ms doubling to
/// 5 s, until one succeeds. Each read backing off on its own would raise
/// the rate just when the store asks for less.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    until: Option<std::time::Instant>,
}

fn backoffs() -> &'static Mutex<HashMap<String, Backoff>> {
    static B: OnceLock<Mutex<HashMap<String, Backoff>>> = OnceLock::new();
    B.get_or_init(Default::default)
}

/// Waits out the back-off of the store `root`, if it has one.
fn backoff_wait(root: &str) {
    let until = crate::sync::lock(backoffs())
        .get(root)
        .and_then(|b| b.until);
    if let Some(wait) = until.and_then(|u| u.checked_duration_since(std::time::Instant::now())) {
        std::thread::sleep(wait);
    }
}

/// Notes how a request to the store `root` went.
fn backoff_note<T>(root: &str, got: &std::result::Result<T, object_store::Error>) {
    use object_store::Error as E;
    let mut all = crate::sync::lock(backoffs());
    match got {
        Ok(_) => {
            all.remove(root);
        }
        // Answers about the object, not the store's load.
        Err(E::NotFound { .. } | E::Precondition { .. } | E::NotModified { .. }) => {}
        Err(E::PermissionDenied { .. } | E::Unauthenticated { .. }) => {}
        Err(_) => {
            let b = all.entry(root.to_string()).or_default();
            b.failures = b.failures.saturating_add(1);
            let wait = Duration::from_millis(50 << (b.failures - 1).min(7)).min(BACKOFF_MOST);
            b.until = Some(std::time::Instant::now() + wait);
        }
    }
}

/// The longest a store's shared back-off makes a read wait.
const BACKOFF_MOST: Duration = Duration::from_secs(5);

/// A ranged read under way ([`Object::start_range`]).
#[derive(Debug)]
pub(crate) struct Pending(crossbeam_channel::Receiver<Result<Bytes>>);

impl Pending {
    /// Waits for the bytes.
    pub(crate) fn wait(self) -> Result<Bytes> {
        self.0
            .recv()
            .map_err(|_| Error::InvalidConfig("the object-store I/O runtime stopped".into()))?
    }
}

impl Object {
    /// Starts reading bytes `range` (as [`Self::read_range`]) on an I/O
    /// thread, to wait for later.
    pub(crate) fn start_range(&self, range: std::ops::Range<u64>, fill: bool) -> Pending {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let me = self.clone();
        match runtime() {
            Ok(rt) => {
                // `get_range` blocks (on this runtime): off its workers.
                drop(rt.spawn_blocking(move || {
                    let _ = tx.send(me.read_range(range, fill));
                }));
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
        Pending(rx)
    }

    /// Fetches the whole object into the cache, on the I/O runtime.
    fn download(&self, cache: Arc<ObjectCache>, download: Download) {
        let me = self.clone();
        let fetch = async move {
            let got = me.fetch_whole(download.file.clone(), download.keep).await;
            // A failed download leaves the reads remote; they report errors.
            cache.downloaded(download, got.ok());
        };
        match runtime() {
            Ok(rt) => drop(rt.spawn(fetch)),
            Err(_) => drop(fetch),
        }
    }

    /// The whole object (the version the open saw), written to `file` (a
    /// new file: never one another process writes) as it comes, and its
    /// bytes when they are kept (`keep`): [`fetch_span`](Self::fetch_span)
    /// of all of it.
    async fn fetch_whole(&self, file: Option<std::path::PathBuf>, keep: bool) -> Result<Bytes> {
        self.fetch_span(0..self.len, file, keep).await
    }

    /// Bytes `span` of the object (the version the open saw), written to
    /// `file` (a new file: never one another process writes) as they come,
    /// and returned when they are kept (`keep`). Bounded by progress, not
    /// time: a body cut off or stalled after bytes came is asked for again
    /// from where it stopped; a request that brings no byte fails, naming
    /// the URL. The file is synced to disk before this returns.
    pub(crate) async fn fetch_span(
        &self,
        span: std::ops::Range<u64>,
        file: Option<std::path::PathBuf>,
        keep: bool,
    ) -> Result<Bytes> {
        use std::io::Write;
        let url = self.url.to_string();
        let (store, path) = store_for(&url, Use::Whole)?;
        let io = |dest: &std::path::Path| {
            let dest = dest.to_path_buf();
            move |source| Error::Io { path: dest, source }
        };
        // File work runs off the I/O threads, which every request shares.
        let mut out = match &file {
            Some(dest) => {
                let d = dest.clone();
                let opened = tokio::task::spawn_blocking(move || {
                    std::fs::File::options()
                        .write(true)
                        .create_new(true)
                        .open(d)
                })
                .await
                .map_err(|e| Error::InvalidConfig(format!("a file writer stopped: {e}")))?;
                Some(opened.map_err(io(dest))?)
            }
            None => None,
        };
        let mut kept = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut got = span.start;
        while got < span.end {
            let before = got;
            let options = self.require(GetOptions::new().with_range(Some(got..span.end)));
            let attempt: std::result::Result<(), object_store::Error> = async {
                let response = store.get_opts(&path, options).await?;
                self.same_version(&response.meta).map_err(|e| {
                    object_store::Error::Precondition {
                        path: path.to_string(),
                        source: Box::new(e),
                    }
                })?;
                let mut stream = response.into_stream();
                while let Some(chunk) = stream.try_next().await? {
                    got += chunk.len() as u64;
                    if got > span.end {
                        return Err(object_store::Error::Generic {
                            store: "wick",
                            source: "the object grew while it was read".into(),
                        });
                    }
                    if keep {
                        kept.extend_from_slice(&chunk);
                    }
                    if out.is_some() {
                        pending.extend_from_slice(&chunk);
                        if pending.len() >= WRITE_AT {
                            let (f, buf) = (out.take(), std::mem::take(&mut pending));
                            let (f, buf, wrote) = write_off_thread(f, buf).await;
                            (out, pending) = (f, buf);
                            wrote.map_err(|e| object_store::Error::Generic {
                                store: "wick",
                                source: Box::new(e),
                            })?;
                        }
                    }
                }
                Ok(())
            }
            .await;
            match attempt {
                Ok(()) if got < span.end => {
                    return Err(Error::Remote {
                        url,
                        reason: format!(
                            "read {} of {} bytes (the object changed?)",
                            got - span.start,
                            span.end - span.start
                        ),
                        transient: false,
                        source: "short body".into(),
                    })
                }
                Ok(()) => {}
                // Bytes came before it stopped: go on from there.
                Err(e)
                    if got > before && !matches!(e, object_store::Error::Precondition { .. }) =>
                {
                    continue
                }
                Err(e) => return Err(read_error(&url, "cannot download the object", e)),
            }
        }
        if let Some(f) = out {
            let dest = file.clone().unwrap_or_default();
            tokio::task::spawn_blocking(move || {
                let mut f = f;
                f.write_all(&pending)?;
                f.sync_data()
            })
            .await
            .map_err(|e| Error::InvalidConfig(format!("a file writer stopped: {e}")))?
            .map_err(io(&dest))?;
        }
        Ok(kept.into())
    }
}

/// Bytes gathered before a download writes them to its file.
const WRITE_AT: usize = 4 << 20;

/// Writes `buf` to `file` on a blocking thread, and gives both back
/// (`buf` emptied).
async fn write_off_thread(
    file: Option<std::fs::File>,
    buf: Vec<u8>,
) -> (Option<std::fs::File>, Vec<u8>, std::io::Result<()>) {
    use std::io::Write;
    let done = tokio::task::spawn_blocking(move || {
        let mut file = file;
        let mut buf = buf;
        let wrote = match &mut file {
            Some(f) => f.write_all(&buf),
            None => Ok(()),
        };
        buf.clear();
        (file, buf, wrote)
    })
    .await;
    done.unwrap_or_else(|e| (None, Vec::new(), Err(std::io::Error::other(e.to_string()))))
}

/// The whole object `url` in one GET (or from the local cache), refused
/// before its body is read when the response says it is over `max` bytes:
/// `Err(size)` then. When a listing just named the object, it is cached
/// under the size and version the listing gave (a rewrite with another is
/// fetched anew), else under its URL alone.
pub(crate) fn get_whole(url: &str, max: u64) -> Result<std::result::Result<Bytes, u64>> {
    let cache = super::cache::current();
    let seen = crate::sync::lock(listed()).get(url).cloned();
    let key = seen
        .as_ref()
        .map_or_else(|| url.to_string(), |(size, v)| v.key(url, *size));
    let len = seen.as_ref().map(|(size, _)| *size);
    if let Some(got) = cache.as_ref().and_then(|c| c.whole(&key, len)) {
        if got.len() as u64 <= max {
            return Ok(Ok(got));
        }
    }
    let (store, path) = store(url)?;
    let got = block_on(async move {
        let got = store.get_opts(&path, GetOptions::new()).await?;
        if got.meta.size > max {
            return Ok(Err(got.meta.size));
        }
        got.bytes().await.map(Ok)
    })?
    .map_err(|e| read_error(url, "cannot read the object", e))?;
    if let (Some(cache), Ok(bytes)) = (&cache, &got) {
        cache.store(&key, bytes);
    }
    Ok(got)
}

/// Checks that `url` names an object this build reads (a store it knows,
/// no credentials or query string in it), sending nothing.
pub(crate) fn check(url: &str) -> Result<()> {
    split(url).map(drop)
}

/// The whole object `url` in one GET, past the memory cache (a file that
/// is rewritten in place: a dataset's manifest), its bytes fetched once a
/// node where there is a cache directory ([`get_shared`]): `None` when
/// there is no such object (or the store will not say), `Some(Err(size))`
/// when it is over `max` bytes.
///
/// Inside [`one_listing`], an object is fetched at most once (a dataset's
/// detection reads its manifest, then its open reads it again).
pub(crate) fn get_if_exists(
    url: &str,
    max: u64,
) -> Result<Option<std::result::Result<Bytes, u64>>> {
    let memo = FETCHED.with(|m| m.borrow().as_ref().and_then(|m| m.get(url).cloned()));
    if let Some(got) = memo {
        return Ok(got);
    }
    let got = get_shared(url, max)?;
    FETCHED.with(|m| {
        if let Some(m) = m.borrow_mut().as_mut() {
            m.insert(url.to_string(), got.clone());
        }
    });
    Ok(got)
}

/// What [`get_unless`] found.
enum Got {
    /// No such object (or the store will not say).
    Missing,
    /// The object, over the limit: its size.
    TooBig(u64),
    /// The object has the entity tag asked about: not sent.
    Same,
    /// The object, with its entity tag when the store gives one.
    New(Bytes, Option<String>),
}

/// The whole object `url` in one GET, unless its entity tag is `tag`.
fn get_unless(url: &str, max: u64, tag: Option<&str>) -> Result<Got> {
    let (store, path) = store(url)?;
    let opts = GetOptions {
        if_none_match: tag.map(str::to_string),
        ..GetOptions::new()
    };
    block_on(async move {
        let got = match store.get_opts(&path, opts).await {
            Err(object_store::Error::NotModified { .. }) => return Ok(Got::Same),
            // S3 answers a missing key with 403 to a caller that may not
            // list the bucket: absent too.
            Err(object_store::Error::NotFound { .. })
            | Err(object_store::Error::PermissionDenied { .. }) => return Ok(Got::Missing),
            got => got?,
        };
        if got.meta.size > max {
            return Ok(Got::TooBig(got.meta.size));
        }
        let tag = got.meta.e_tag.clone();
        got.bytes().await.map(|b| Got::New(b, tag))
    })?
    .map_err(|e| read_error(url, "cannot read the object", e))
}

/// Leads a node's copy of an object read whole past the cache (a
/// manifest, a TFRecord `.idx`): its entity tag's length (4 bytes, little
/// endian) and tag, then the object.
const NODE_COPY: &[u8; 8] = b"wickget1";

/// The whole object `url` (as [`get_if_exists`] gives it), shared by the
/// node's processes through the cache directory, when there is one: the
/// first process to take the object's lock GETs it and keeps a copy with
/// its entity tag; the others, and later runs, send a GET that asks for
/// the object only if its tag changed (`If-None-Match`), and the store
/// answers an unchanged one with no body. Each process still asks (an
/// object rewritten in place is never read stale), but the object's bytes
/// cross the network once a node. An object the store gives no tag, and
/// every object without a cache directory, is read whole by each process.
fn get_shared(url: &str, max: u64) -> Result<Option<std::result::Result<Bytes, u64>>> {
    use super::NodeFile;
    let key = format!("get {url}");
    let (held, lock) = match super::node_file(&key, true)? {
        NodeFile::Ready(copy) => (parse_copy(copy.bytes()), None),
        NodeFile::Mine(lock) => (None, Some(lock)),
        NodeFile::Busy | NodeFile::Alone => (None, None),
    };
    let got = get_unless(url, max, held.as_ref().map(|h| h.0.as_str()))?;
    Ok(match got {
        Got::Missing => None,
        Got::TooBig(len) => Some(Err(len)),
        Got::Same => match held {
            Some((_, bytes)) => Some(Ok(bytes)),
            // "Not modified" to a GET that named no tag: no store says it.
            None => {
                return Err(Error::Dataset {
                    path: url.into(),
                    reason: "the store answered a plain GET with \"not modified\"".into(),
                    source: None,
                })
            }
        },
        Got::New(bytes, tag) => {
            if let Some(tag) = tag.filter(|t| u32::try_from(t.len()).is_ok()) {
                let mut copy = Vec::with_capacity(12 + tag.len() + bytes.len());
                copy.extend_from_slice(NODE_COPY);
                copy.extend_from_slice(&(tag.len() as u32).to_le_bytes());
                copy.extend_from_slice(tag.as_bytes());
                copy.extend_from_slice(&bytes);
                // A copy not written is fetched again by the next process.
                let _ = super::node_publish(&key, &copy);
            }
            drop(lock);
            Some(Ok(bytes))
        }
    })
}

/// The entity tag and object of a node's copy ([`NODE_COPY`]); `None` for
/// a file that is not one (read again whole).
fn parse_copy(copy: &[u8]) -> Option<(String, Bytes)> {
    let rest = copy.strip_prefix(NODE_COPY.as_slice())?;
    let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let tag = std::str::from_utf8(rest.get(4..4 + len)?).ok()?;
    Some((tag.to_string(), Bytes::copy_from_slice(&rest[4 + len..])))
}

/// The objects under `url` (a prefix: `s3://bucket/train/`), as URLs,
/// sorted: every object under it (`deep`), or only those directly in it,
/// as a local folder's files are (`s3://b/train` then lists neither
/// `train/val/x` nor `train-old/x`). HTTP servers list nothing
/// (object_store reads WebDAV listings only): an error that says to name
/// the objects.
///
/// The size and version of each object `keep` accepts are kept for the
/// open that follows (it then sends no HEAD), whatever the listing's
/// length; the others' are not (an image folder's files, read with GETs).
/// Inside [`one_listing`], a prefix is listed once however often asked.
pub(crate) fn list(url: &str, deep: bool, keep: &dyn Fn(&str) -> bool) -> Result<Vec<String>> {
    let (root, scheme, _) = split(url)?;
    if scheme == "http" || scheme == "https" {
        return Err(Error::InvalidConfig(format!(
            "{url:?}: an HTTP server cannot be listed: name the objects (a file list of URLs, or \
             a shard pattern such as train-{{0000..0099}}.tar)"
        )));
    }
    let memo_key = (url.to_string(), deep);
    let memo = LISTINGS.with(|m| m.borrow().as_ref().and_then(|m| m.get(&memo_key).cloned()));
    let objects = match memo {
        Some(objects) => objects,
        None => {
            let objects = shared_listing(url, deep, || {
                let (store, prefix) = store(url)?;
                let p = prefix.clone();
                let metas: Vec<object_store::ObjectMeta> = block_on(async move {
                    if deep {
                        store.list(Some(&p)).try_collect().await
                    } else {
                        store.list_with_delimiter(Some(&p)).await.map(|l| l.objects)
                    }
                })?
                .map_err(|e| remote_error(url, "cannot list the objects", e))?;
                #[cfg(test)]
                tests::LISTED_PREFIXES.with(|n| n.set(n.get() + 1));
                let mut objects: Vec<Listed> = metas
                    .iter()
                    .map(|m| {
                        let url = match scheme {
                            "file" => format!("file:///{}", m.location),
                            _ => format!("{root}/{}", m.location),
                        };
                        (url, m.size, Version::of(m))
                    })
                    .collect();
                objects.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(objects)
            })?;
            let objects = Arc::new(objects);
            LISTINGS.with(|m| {
                if let Some(m) = m.borrow_mut().as_mut() {
                    m.insert(memo_key, objects.clone());
                }
            });
            objects
        }
    };
    let mut seen = crate::sync::lock(listed());
    let mut urls = Vec::with_capacity(objects.len());
    for (url, size, version) in objects.iter() {
        // What the listing says stands in for a HEAD at the open that follows.
        if keep(url) {
            seen.insert(url.clone(), (*size, version.clone()));
        }
        urls.push(url.clone());
    }
    Ok(urls)
}

/// An object a listing gives: its URL, size and version.
type Listed = (String, u64, Version);

/// Listings by `(prefix, deep)`, while [`one_listing`] runs on this thread.
type Listings = HashMap<(String, bool), Arc<Vec<Listed>>>;

/// The listing of `url` (`deep` or not) that `list` makes, shared by the
/// processes of one launch on this node (the ranks a launcher started
/// here, [`launch_on_node`]) through the cache directory: the first to
/// take the listing's lock lists the prefix and keeps the listing there;
/// the others take it, so a node's ranks make one listing, not one each,
/// and agree on it. Outside a launch of several ranks on the node, or
/// without a cache directory, each process lists (a process run again
/// lists again: a later launch sees the objects added since).
fn shared_listing(
    url: &str,
    deep: bool,
    list: impl FnOnce() -> Result<Vec<Listed>>,
) -> Result<Vec<Listed>> {
    use super::NodeFile;
    let Some(launch) = launch_on_node() else {
        return list();
    };
    let key = format!("list {url} {deep} {launch}");
    match super::node_file(&key, true)? {
        NodeFile::Ready(copy) => match parse_listing(copy.bytes()) {
            Some(objects) => Ok(objects),
            None => list(),
        },
        NodeFile::Mine(lock) => {
            let objects = list()?;
            let rows: Vec<(&str, u64, Option<&str>, Option<String>)> = objects
                .iter()
                .map(|(u, n, v)| {
                    let modified = v.modified.map(|m| m.to_rfc3339());
                    (u.as_str(), *n, v.e_tag.as_deref(), modified)
                })
                .collect();
            if let Ok(bytes) = serde_json::to_vec(&rows) {
                // A listing not kept is made again by the next process.
                let _ = super::node_publish(&key, &bytes);
            }
            drop(lock);
            Ok(objects)
        }
        NodeFile::Busy | NodeFile::Alone => list(),
    }
}

/// A listing [`shared_listing`] kept; `None` for a file that is not one.
fn parse_listing(bytes: &[u8]) -> Option<Vec<Listed>> {
    type Row = (String, u64, Option<String>, Option<String>);
    let rows: Vec<Row> = serde_json::from_slice(bytes).ok()?;
    rows.into_iter()
        .map(|(url, size, e_tag, modified)| {
            let modified = match modified {
                Some(m) => Some(
                    chrono::DateTime::parse_from_rfc3339(&m)
                        .ok()?
                        .with_timezone(&chrono::Utc),
                ),
                None => None,
            };
            Some((url, size, Version { e_tag, modified }))
        })
        .collect()
}

/// Which launch of several ranks on this node this process belongs to:
/// its parent process (torchrun's agent, `mpirun` or its daemon,
/// `slurmstepd`: one a launch and node) with the time it started, when
/// the launcher says the node runs more than one rank of the job
/// (`LOCAL_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_SIZE`, `MPI_LOCALNRANKS`,
/// `SLURM_NTASKS_PER_NODE`). `None` otherwise, and off Linux.
fn launch_on_node() -> Option<String> {
    let env = |k: &str| std::env::var(k).ok();
    if crate::tune::local_ranks(&env) < 2 {
        return None;
    }
    #[cfg(target_os = "linux")]
    {
        let parent = std::os::unix::process::parent_id();
        let stat = std::fs::read_to_string(format!("/proc/{parent}/stat")).ok()?;
        // Field 22, the start time: the 20th after the name's ")".
        let after = &stat[stat.rfind(')')? + 1..];
        let started = after.split_whitespace().nth(19)?;
        Some(format!("{parent}@{started}"))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Objects [`get_if_exists`] fetched, by URL.
type Fetched = HashMap<String, Option<std::result::Result<Bytes, u64>>>;

thread_local! {
    static LISTINGS: std::cell::RefCell<Option<Listings>> = const { std::cell::RefCell::new(None) };
    static FETCHED: std::cell::RefCell<Option<Fetched>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with each prefix listed at most once on this thread (a
/// dataset's detection probes one suffix after another, then opens what
/// it found, over one listing), and each manifest fetched at most once.
pub(crate) fn one_listing<T>(f: impl FnOnce() -> T) -> T {
    let outer = LISTINGS.with(|m| m.borrow().is_some());
    if outer {
        return f();
    }
    LISTINGS.with(|m| *m.borrow_mut() = Some(HashMap::new()));
    FETCHED.with(|m| *m.borrow_mut() = Some(HashMap::new()));
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            LISTINGS.with(|m| *m.borrow_mut() = None);
            FETCHED.with(|m| *m.borrow_mut() = None);
        }
    }
    let _clear = Clear;
    f()
}

/// An object's size and version, by URL.
type Metas = HashMap<String, (u64, Version)>;

/// Sizes and versions from listings, by URL, until an open takes them.
fn listed() -> &'static Mutex<Metas> {
    static LISTED: OnceLock<Mutex<Metas>> = OnceLock::new();
    LISTED.get_or_init(Default::default)
}

/// Deletes the object `url`.
pub(crate) fn delete(url: &str) -> Result<()> {
    let (store, path) = store(url)?;
    block_on(async move { store.delete(&path).await })?
        .map_err(|e| remote_error(url, "cannot delete the object", e))
}

/// The object `url` whole as an open local file, to map or read as a
/// local file: the remote cache's file when it has a directory (fetched
/// into it when missing or deleted by another process), else a temporary
/// file, deleted once open.
pub(crate) fn local_copy(url: &str) -> Result<std::fs::File> {
    copy_of(Object::open(url)?)
}

/// [`local_copy`] of an object whose size a manifest gives, with no HEAD:
/// cached under its URL, size and `tag` (what names its bytes: their
/// checksum), so a rewritten object is fetched anew.
pub(crate) fn local_copy_known(url: &str, size: u64, tag: &str) -> Result<std::fs::File> {
    let mut o = Object::made(url, store(url)?, size, Version::default())?;
    o.key = format!("{url}#{size}#{tag}").into();
    copy_of(o)
}

/// The object `o` whole, as an open local file (see [`local_copy`]).
fn copy_of(o: Object) -> Result<std::fs::File> {
    let fetch = |dest: &std::path::Path| -> Result<()> {
        let (me, dest) = (o.clone(), dest.to_path_buf());
        block_on(async move { me.fetch_whole(Some(dest), false).await.map(drop) })?
    };
    if let Some(cache) = super::cache::current() {
        if let Some(file) = cache.file(&o.key, o.len, fetch) {
            return file;
        }
    }
    let tmp = std::env::temp_dir().join(format!("wick-object-{:016x}", rand::random::<u64>()));
    let opened = fetch(&tmp).and_then(|()| {
        std::fs::File::open(&tmp).map_err(|source| Error::Io {
            path: tmp.clone(),
            source,
        })
    });
    let _ = std::fs::remove_file(&tmp);
    opened
}

#[cfg(test)]
mod tests;
