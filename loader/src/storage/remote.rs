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
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Threads of the I/O runtime: requests wait on the network, not the CPU.
const IO_THREADS: usize = 2;

fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(IO_THREADS)
            .thread_name("wick-io")
            .enable_time()
            .enable_io()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::InvalidConfig(format!("cannot start the object-store I/O runtime: {e}")))
}

/// reqwest's rustls is built without a crypto provider (no C build of
/// aws-lc): installs ring's before the first client is made, unless the
/// program installed one (a program that wants rustls's post-quantum key
/// exchange installs aws-lc-rs's provider before the first remote read).
fn crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[allow(deprecated)] // ring's provider lacks post-quantum key exchange only
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Runs `f` on the I/O runtime and waits for it.
pub(crate) fn block_on<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T> {
    let rt = runtime()?;
    // From inside a runtime (a user's async code calling the loader),
    // `block_on` would panic: run the future on the I/O threads instead.
    let (tx, rx) = crossbeam_channel::bounded(1);
    rt.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .map_err(|_| Error::InvalidConfig("the object-store I/O runtime stopped".into()))
}

/// Options for the URLs under a prefix: `(prefix, [(key, value)])`.
type Prefixed = Vec<(String, Vec<(String, String)>)>;

/// Options given with [`configure`](super::configure), by URL prefix.
fn options() -> &'static Mutex<Prefixed> {
    static OPTS: OnceLock<Mutex<Prefixed>> = OnceLock::new();
    OPTS.get_or_init(Default::default)
}

pub(crate) fn configure(prefix: &str, opts: Vec<(String, String)>) {
    let mut all = crate::lock(options());
    all.retain(|(p, _)| p != prefix);
    all.push((prefix.to_string(), opts));
    // A store made before keeps its settings: forget it.
    crate::lock(stores()).retain(|(root, _), _| !under(root, prefix) && !under(prefix, root));
}

/// Whether `url` is `prefix` or under it at a path boundary:
/// `s3://data` holds `s3://data/x`, not `s3://data-public/x`.
fn under(url: &str, prefix: &str) -> bool {
    url.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'))
}

/// What a client is made for: ranged reads (every request bounded in
/// time, 30 s) or whole objects (bounded by progress: a read that waits
/// 30 s for a byte fails, a long transfer does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Use {
    Ranges,
    Whole,
}

/// The clients made, by store root and use.
type Stores = HashMap<(String, Use), Arc<dyn ObjectStore>>;

fn stores() -> &'static Mutex<Stores> {
    static STORES: OnceLock<Mutex<Stores>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// `scheme://authority` and the object path of `url`.
fn split(url: &str) -> Result<(String, &str, &str)> {
    let bad = |why: &str| {
        let shown = crate::error::redact(url);
        Error::InvalidConfig(format!("{shown:?} is not a storage URL: {why}"))
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if scheme != "file" && authority.is_empty() {
        return Err(bad("no bucket or host"));
    }
    // Neither would be sent (object_store takes neither from a URL), and
    // both would be printed wherever the URL is: refused, the message
    // showing the URL without them.
    if authority.contains('@') {
        return Err(bad(
            "a user or password in the URL is not sent: give credentials with \
             storage::configure or the environment (AWS_*, GOOGLE_*, AZURE_*)",
        ));
    }
    if path.contains('?') || path.contains('#') {
        return Err(bad(
            "a query string (a presigned or SAS URL) is not read: give credentials with \
             storage::configure or the environment",
        ));
    }
    Ok((format!("{scheme}://{authority}"), scheme, path))
}

/// The store that holds `url`, and the object's path in it.
pub(crate) fn store(url: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    store_for(url, Use::Ranges)
}

/// [`store`] with a client made for `purpose`.
fn store_for(url: &str, purpose: Use) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    let (root, scheme, path) = split(url)?;
    crypto();
    let object = if scheme == "file" {
        ObjectPath::from_absolute_path(format!("/{path}"))
    } else {
        ObjectPath::from_url_path(path)
    }
    .map_err(|e| remote_error(url, "bad object path", object_store::Error::from(e)))?;
    if let Some(s) = crate::lock(stores()).get(&(root.clone(), purpose)) {
        return Ok((s.clone(), object));
    }
    let opts: Vec<(String, String)> = crate::lock(options())
        .iter()
        .filter(|(p, _)| under(url, p))
        .flat_map(|(_, o)| o.clone())
        .collect();
    // Bounded: a paused server surfaces as an error the loader's own
    // `retry(n)` policy sees (transient), not a minutes-long hang.
    let retry = RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    // Bounded requests, set as options so the environment's other client
    // settings (`AWS_ALLOW_HTTP`, proxies) stay; given options come after.
    // A whole object's transfer takes what its size and the link make
    // it: bounded by progress (30 s without a byte fails), and its total
    // time bounded only far above any real transfer, each part resumed
    // from where it stopped (`fetch_whole`).
    let mut opts = opts;
    if purpose == Use::Whole {
        // A total time given for requests is not one for transfers.
        opts.retain(|(k, _)| k != "timeout");
    }
    let mut defaults = match purpose {
        Use::Ranges => vec![("timeout", "30s"), ("connect_timeout", "5s")],
        Use::Whole => vec![
            ("timeout", "6h"),
            ("read_timeout", "30s"),
            ("connect_timeout", "5s"),
        ],
    };
    if scheme == "http" {
        defaults.push(("allow_http", "true"));
    }
    opts.splice(
        0..0,
        defaults
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    // The cloud builders share these methods but no trait: one macro.
    macro_rules! build {
        ($builder:expr) => {{
            let mut b = $builder.with_url(root.clone()).with_retry(retry);
            for (k, v) in &opts {
                b = b.with_config(k.parse().map_err(|e| option_error(url, k, e))?, v);
            }
            b.build().map(|s| Arc::new(s) as _)
        }};
    }
    let made: std::result::Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
        "s3" | "s3a" => build!(object_store::aws::AmazonS3Builder::from_env()),
        "gs" => build!(object_store::gcp::GoogleCloudStorageBuilder::from_env()),
        "az" | "azure" | "abfs" | "abfss" => {
            build!(object_store::azure::MicrosoftAzureBuilder::from_env())
        }
        "http" | "https" => build!(object_store::http::HttpBuilder::new()),
        "file" => Ok(Arc::new(object_store::local::LocalFileSystem::new()) as _),
        other => {
            return Err(Error::InvalidConfig(format!(
                "{url:?}: no store for {other}:// (s3, gs, az, http, https and file are read)"
            )))
        }
    };
    let made = made.map_err(|e| remote_error(url, "cannot set up the object store", e))?;
    crate::lock(stores()).insert((root, purpose), made.clone());
    Ok((made, object))
}

/// The error for a failed request on `url`: transient unless the store
/// says the object is missing, access is denied or the request is bad.
pub(crate) fn remote_error(url: &str, what: &str, e: object_store::Error) -> Error {
    use object_store::Error as E;
    let (reason, transient) = match &e {
        E::NotFound { .. } => ("not found (no such object or bucket)".to_string(), false),
        E::PermissionDenied { .. } => ("permission denied".to_string(), false),
        E::Unauthenticated { .. } => (
            "not authenticated (check the credentials in the environment)".to_string(),
            false,
        ),
        E::InvalidPath { .. } | E::NotSupported { .. } | E::UnknownConfigurationKey { .. } => {
            (what.to_string(), false)
        }
        _ => (what.to_string(), true),
    };
    Error::Remote {
        url: url.to_string(),
        reason,
        transient,
        source: Box::new(e),
    }
}

fn option_error(url: &str, key: &str, e: object_store::Error) -> Error {
    remote_error(url, &format!("unknown object-store option {key:?}"), e)
}

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
        reason: "the object changed since it was opened (its entity tag or time differs): \
                 open the dataset again"
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
        let root: Arc<str> = split(url)?.0.into();
        let (size, version) = match crate::lock(listed()).remove(url) {
            Some(known) => known,
            None => {
                let (s, p) = (store.clone(), path.clone());
                let meta = block_on(async move { s.head(&p).await })?
                    .map_err(|e| remote_error(url, "cannot read the object's size", e))?;
                (meta.size, Version::of(&meta))
            }
        };
        Ok(Self {
            store,
            root,
            path,
            url: url.into(),
            len: size,
            key: version.key(url, size).into(),
            pinned: Arc::default(),
        })
    }

    /// The object's size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
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
        if let Some(cache) = super::cache::current() {
            if let Some(got) = cache.read(&self.key, self.len, range.clone()) {
                return Ok(got);
            }
            if let Some(download) = cache.want(&self.key, self.len) {
                self.download(cache, download);
            }
        }
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
    let until = crate::lock(backoffs()).get(root).and_then(|b| b.until);
    if let Some(wait) = until.and_then(|u| u.checked_duration_since(std::time::Instant::now())) {
        std::thread::sleep(wait);
    }
}

/// Notes how a request to the store `root` went.
fn backoff_note<T>(root: &str, got: &std::result::Result<T, object_store::Error>) {
    use object_store::Error as E;
    let mut all = crate::lock(backoffs());
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
    /// Starts reading bytes `range` (as [`Self::get_range`]) on an I/O
    /// thread, to wait for later.
    pub(crate) fn start_range(&self, range: std::ops::Range<u64>) -> Pending {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let me = self.clone();
        match runtime() {
            Ok(rt) => {
                // `get_range` blocks (on this runtime): off its workers.
                drop(rt.spawn_blocking(move || {
                    let _ = tx.send(me.get_range(range));
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
    /// bytes when they are kept (`keep`). Bounded by progress, not time: a
    /// body cut off or stalled after bytes came is asked for again from
    /// where it stopped; a request that brings no byte fails, naming the
    /// URL. The file is synced to disk before this returns.
    async fn fetch_whole(&self, file: Option<std::path::PathBuf>, keep: bool) -> Result<Bytes> {
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
        let mut got = 0u64;
        while got < self.len {
            let before = got;
            let options = self.require(GetOptions::new().with_range(Some(got..self.len)));
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
                    if got > self.len {
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
                Ok(()) if got < self.len => {
                    return Err(Error::Remote {
                        url,
                        reason: format!("read {got} of {} bytes (the object changed?)", self.len),
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
    let seen = crate::lock(listed()).get(url).cloned();
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

/// The objects under `url` (a prefix: `s3://bucket/train/`), as URLs,
/// sorted: every object under it (`deep`), or only those directly in it,
/// as a local folder's files are (`s3://b/train` then lists neither
/// `train/val/x` nor `train-old/x`). HTTP servers list nothing
/// (object_store reads WebDAV listings only): an error that says to name
/// the objects.
pub(crate) fn list(url: &str, deep: bool) -> Result<Vec<String>> {
    let (root, scheme, _) = split(url)?;
    if scheme == "http" || scheme == "https" {
        return Err(Error::InvalidConfig(format!(
            "{url:?}: an HTTP server cannot be listed: name the objects (a file list of URLs, or \
             a shard pattern such as train-{{0000..0099}}.tar)"
        )));
    }
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
    let mut urls: Vec<String> = Vec::with_capacity(metas.len());
    let mut seen = crate::lock(listed());
    // Kept for the opens that follow a listing of shards; a huge listing
    // (an image folder's files, read with GETs) is not kept.
    let keep = metas.len() <= 100_000;
    for m in metas {
        let url = match scheme {
            "file" => format!("file:///{}", m.location),
            _ => format!("{root}/{}", m.location),
        };
        // What the listing says stands in for a HEAD at the open that follows.
        if keep {
            seen.insert(url.clone(), (m.size, Version::of(&m)));
        }
        urls.push(url);
    }
    urls.sort();
    Ok(urls)
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

/// Bytes over which an upload goes in parts (S3 multipart and the like).
const ONE_PUT: u64 = 32 << 20;

/// Writes the local file `local` as the object `url`: one PUT, or a
/// multipart upload of 16 MiB parts (4 in flight) for a larger file.
pub(crate) fn upload(local: &std::path::Path, url: &str) -> Result<()> {
    upload_in(local, url, (ONE_PUT, 16 << 20))
}

/// File work of an upload, run off the I/O threads: bytes read, and the
/// file to read on from.
type FileJob = Box<dyn FnOnce() -> std::io::Result<(Vec<u8>, Option<std::fs::File>)> + Send>;

/// [`upload`] with the one-PUT limit and the part size given. A failed
/// multipart upload is aborted, so no parts are left behind (and billed).
fn upload_in(local: &std::path::Path, url: &str, (one_put, part): (u64, usize)) -> Result<()> {
    let (store, path) = store(url)?;
    let (local, owned_url) = (local.to_path_buf(), url.to_string());
    block_on(async move {
        let io = |source| Error::Io {
            path: local.clone(),
            source,
        };
        let failed = |e| remote_error(&owned_url, "cannot write the object", e);
        // File reads run off the I/O threads, which every request shares.
        let blocking = |f: FileJob| async move {
            tokio::task::spawn_blocking(f)
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
        };
        let len = std::fs::metadata(&local).map_err(io)?.len();
        if len <= one_put {
            let l = local.clone();
            let (bytes, _) = blocking(Box::new(move || Ok((std::fs::read(l)?, None))))
                .await
                .map_err(io)?;
            store.put(&path, bytes.into()).await.map_err(failed)?;
            return Ok(());
        }
        let parts = store.put_multipart(&path).await.map_err(failed)?;
        let mut w = WriteMultipart::new_with_chunk_size(parts, part);
        let mut file = Some(std::fs::File::open(&local).map_err(io)?);
        let size = part.div_ceil(2);
        let written: Result<()> = async {
            loop {
                let mut f = file.take();
                let (buf, f) = blocking(Box::new(move || {
                    let mut buf = vec![0; size];
                    let n = match &mut f {
                        Some(f) => std::io::Read::read(f, &mut buf)?,
                        None => 0,
                    };
                    buf.truncate(n);
                    Ok((buf, f))
                }))
                .await
                .map_err(io)?;
                file = f;
                if buf.is_empty() {
                    return Ok(());
                }
                w.wait_for_capacity(4).await.map_err(failed)?;
                w.write(&buf);
            }
        }
        .await;
        match written {
            Ok(()) => w.finish().await.map_err(failed).map(drop),
            Err(e) => {
                let _ = w.abort().await;
                Err(e)
            }
        }
    })?
}

/// The object `url` whole as an open local file, to map or read as a
/// local file: the remote cache's file when it has a directory (fetched
/// into it when missing or deleted by another process), else a temporary
/// file, deleted once open.
pub(crate) fn local_copy(url: &str) -> Result<std::fs::File> {
    let o = Object::open(url)?;
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
mod tests {
    /// `configure("s3://data", ..)` is for that bucket, not
    /// `s3://data-public`.
    #[test]
    fn options_apply_under_their_prefix_at_a_boundary() {
        use super::under;
        assert!(under("s3://data/x.tar", "s3://data"));
        assert!(under("s3://data", "s3://data"));
        assert!(under("s3://data/train/x", "s3://data/"));
        assert!(!under("s3://data-public/x.tar", "s3://data"));
        assert!(!under("s3://datasets/x", "s3://data"));
        assert!(under("https://host/a/b", "https://host/a"));
        assert!(!under("https://host/ab", "https://host/a"));
    }

    /// A listing's entity tag may not be the reads' (an S3 API listed, its
    /// objects served by a proxy or CDN: the bench's nginx in front of
    /// s3rver): the first read's version is the one later reads require,
    /// and a rewrite after it is refused.
    #[test]
    fn reads_require_the_version_their_first_read_got() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.bin");
        std::fs::write(&path, [1u8; 4096]).unwrap();
        let url = format!("file://{}", path.display());
        let listed_as = super::Version {
            e_tag: Some("\"a-tag-another-server-gave\"".into()),
            modified: None,
        };
        crate::lock(super::listed()).insert(url.clone(), (4096, listed_as));
        let o = super::Object::open(&url).unwrap();
        assert_eq!(o.get_range(0..10).unwrap().len(), 10);
        assert_eq!(o.get_range(100..200).unwrap().len(), 100);
        std::fs::write(&path, [2u8; 4096]).unwrap();
        let e = o.get_range(0..10).unwrap_err();
        assert!(e.to_string().contains("changed"), "{e}");
    }

    /// After a transient failure every read of the store waits, the wait
    /// doubling with each failure up to 5 s; a success ends it; answers
    /// about the object (not found, changed) do not count.
    #[test]
    fn a_store_backs_off_for_all_its_reads_after_a_failure() {
        use super::{backoff_note, backoffs, BACKOFF_MOST};
        let root = "s3://backoff-test";
        let failed = || -> Result<(), object_store::Error> {
            Err(object_store::Error::Generic {
                store: "S3",
                source: "503 SlowDown".into(),
            })
        };
        let wait = || {
            let b = crate::lock(backoffs());
            b.get(root)
                .and_then(|b| b.until)
                .map(|u| u.saturating_duration_since(std::time::Instant::now()))
        };
        backoff_note(root, &failed());
        let first = wait().expect("a back-off");
        backoff_note(root, &failed());
        let second = wait().expect("a back-off");
        assert!(second > first, "{second:?} after {first:?}");
        for _ in 0..20 {
            backoff_note(root, &failed());
        }
        assert!(wait().unwrap() <= BACKOFF_MOST);
        let not_found = Err::<(), _>(object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        });
        backoff_note(root, &not_found);
        assert!(wait().is_some(), "a missing object is not the store's load");
        backoff_note(root, &Ok::<(), object_store::Error>(()));
        assert_eq!(wait(), None);
    }

    /// The store's `Debug` prints an Azure SAS token (object_store derives
    /// it); an object's does not.
    #[test]
    fn an_object_prints_no_credentials() {
        super::configure(
            "az://wickdebug",
            vec![
                ("azure_storage_account_name".into(), "acct".into()),
                (
                    "azure_storage_sas_key".into(),
                    "sv=2024-01-01&sig=TOPSECRETSIGNATURE".into(),
                ),
            ],
        );
        let (store, path) = super::store("az://wickdebug/x.parquet").unwrap();
        assert!(format!("{store:?}").contains("TOPSECRET"), "the probe");
        let o = super::Object {
            store,
            root: "az://wickdebug".into(),
            path,
            url: "az://wickdebug/x.parquet".into(),
            len: 1,
            pinned: Default::default(),
            key: "k".into(),
        };
        let shown = format!("{o:?} {:?}", crate::storage::Blob::Remote(o.clone()));
        assert!(!shown.contains("TOPSECRET"), "{shown}");
        assert!(shown.contains("az://wickdebug/x.parquet"), "{shown}");
    }

    /// An upload in one PUT and in parts (small limits here) writes the
    /// file's bytes, and an upload to a bad URL names it.
    #[test]
    fn uploads_write_the_file_whole_and_in_parts() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("shard.bin");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
        std::fs::write(&local, &data).unwrap();
        for (name, limits) in [("one", (1 << 20, 1 << 20)), ("parts", (1000, 7000))] {
            let url = format!("file://{}/up/{name}.bin", dir.path().display());
            super::upload_in(&local, &url, limits).unwrap();
            let got = std::fs::read(dir.path().join("up").join(format!("{name}.bin"))).unwrap();
            assert!(got == data, "{name}");
        }
        let err = super::upload(&local, "nope://x/y").unwrap_err();
        assert!(err.to_string().contains("nope://x/y"), "{err}");
    }
}
