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
use object_store::{ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart};
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
    crate::lock(stores()).retain(|root, _| !root.starts_with(prefix) && !prefix.starts_with(root));
}

fn stores() -> &'static Mutex<HashMap<String, Arc<dyn ObjectStore>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// `scheme://authority` and the object path of `url`.
fn split(url: &str) -> Result<(String, &str, &str)> {
    let bad = |why: &str| Error::InvalidConfig(format!("{url:?} is not a storage URL: {why}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if scheme != "file" && authority.is_empty() {
        return Err(bad("no bucket or host"));
    }
    Ok((format!("{scheme}://{authority}"), scheme, path))
}

/// The store that holds `url`, and the object's path in it.
pub(crate) fn store(url: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    let (root, scheme, path) = split(url)?;
    crypto();
    let object = if scheme == "file" {
        ObjectPath::from_absolute_path(format!("/{path}"))
    } else {
        ObjectPath::from_url_path(path)
    }
    .map_err(|e| remote_error(url, "bad object path", object_store::Error::from(e)))?;
    if let Some(s) = crate::lock(stores()).get(&root) {
        return Ok((s.clone(), object));
    }
    let opts: Vec<(String, String)> = crate::lock(options())
        .iter()
        .filter(|(p, _)| url.starts_with(p.as_str()))
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
    let mut opts = opts;
    let mut defaults = vec![("timeout", "30s"), ("connect_timeout", "5s")];
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
    crate::lock(stores()).insert(root, made.clone());
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

/// One object: its store, path and size.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    url: Arc<str>,
    len: u64,
    /// Its name in the local cache: URL, size and entity tag.
    key: Arc<str>,
}

impl Object {
    /// Opens `url`: its size from the listing that just named it, else
    /// from a HEAD request.
    pub(crate) fn open(url: &str) -> Result<Self> {
        let (store, path) = store(url)?;
        let (size, tag) = match crate::lock(listed()).remove(url) {
            Some(known) => known,
            None => {
                let (s, p) = (store.clone(), path.clone());
                let meta = block_on(async move { s.head(&p).await })?
                    .map_err(|e| remote_error(url, "cannot read the object's size", e))?;
                (meta.size, meta.e_tag)
            }
        };
        let tag = tag.as_deref().unwrap_or_default();
        Ok(Self {
            store,
            path,
            url: url.into(),
            len: size,
            key: format!("{url}#{size}#{tag}").into(),
        })
    }

    /// The object's size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Bytes `range` of the object: from the local cache, else one ranged
    /// GET (and the whole object is fetched for the cache in the
    /// background, when one is set and fits it).
    pub(crate) fn get_range(&self, range: std::ops::Range<u64>) -> Result<Bytes> {
        if let Some(cache) = super::cache::current() {
            if let Some(got) = cache.read(&self.key, range.clone()) {
                return Ok(got);
            }
            if let Some(download) = cache.want(&self.key, self.len) {
                self.download(cache, download);
            }
        }
        let (s, p) = (self.store.clone(), self.path.clone());
        let r = range.clone();
        let got = block_on(async move { s.get_range(&p, r).await })?.map_err(|e| {
            remote_error(
                &self.url,
                &format!("cannot read bytes {}..{}", range.start, range.end),
                e,
            )
        })?;
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
        let (store, path, len) = (self.store.clone(), self.path.clone(), self.len);
        let fetch = async move {
            let file = download.file.clone();
            let got = fetch_whole(store, path, len, file, download.keep).await;
            // A failed download leaves the reads remote; they report errors.
            cache.downloaded(download, got.ok());
        };
        match runtime() {
            Ok(rt) => drop(rt.spawn(fetch)),
            Err(_) => drop(fetch),
        }
    }
}

/// The whole object, written to `file` as it comes; its bytes when they
/// are kept (`keep`).
async fn fetch_whole(
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    len: u64,
    file: Option<std::path::PathBuf>,
    keep: bool,
) -> std::result::Result<Bytes, Box<dyn std::error::Error + Send + Sync>> {
    use std::io::Write;
    let mut stream = store.get(&path).await?.into_stream();
    let mut out = file.map(std::fs::File::create).transpose()?;
    let mut kept = Vec::new();
    let mut got = 0u64;
    while let Some(chunk) = stream.try_next().await? {
        got += chunk.len() as u64;
        if got > len {
            return Err("the object grew while it was read".into());
        }
        if let Some(out) = &mut out {
            out.write_all(&chunk)?;
        }
        if keep {
            kept.extend_from_slice(&chunk);
        }
    }
    if got != len {
        return Err(format!("read {got} of {len} bytes").into());
    }
    if let Some(out) = out {
        out.sync_data()?;
    }
    Ok(kept.into())
}

/// The whole object `url` in one GET (or from the local cache), refused
/// before its body is read when the response says it is over `max` bytes:
/// `Err(size)` then.
pub(crate) fn get_whole(url: &str, max: u64) -> Result<std::result::Result<Bytes, u64>> {
    let cache = super::cache::current();
    if let Some(got) = cache.as_ref().and_then(|c| c.whole(url)) {
        if got.len() as u64 <= max {
            return Ok(Ok(got));
        }
    }
    let (store, path) = store(url)?;
    let got = block_on(async move {
        let got = store.get(&path).await?;
        if got.meta.size > max {
            return Ok(Err(got.meta.size));
        }
        got.bytes().await.map(Ok)
    })?
    .map_err(|e| remote_error(url, "cannot read the object", e))?;
    if let (Some(cache), Ok(bytes)) = (&cache, &got) {
        cache.store(url, bytes);
    }
    Ok(got)
}

/// The objects under `url` (a prefix: `s3://bucket/train/`), as URLs,
/// sorted. HTTP servers list nothing (object_store reads WebDAV listings
/// only): an error that says to name the objects.
pub(crate) fn list(url: &str) -> Result<Vec<String>> {
    let (root, scheme, _) = split(url)?;
    if scheme == "http" || scheme == "https" {
        return Err(Error::InvalidConfig(format!(
            "{url:?}: an HTTP server cannot be listed: name the objects (a file list of URLs, or \
             a shard pattern such as train-{{0000..0099}}.tar)"
        )));
    }
    let (store, prefix) = store(url)?;
    let p = prefix.clone();
    let metas: Vec<object_store::ObjectMeta> =
        block_on(async move { store.list(Some(&p)).try_collect().await })?
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
            seen.insert(url.clone(), (m.size, m.e_tag));
        }
        urls.push(url);
    }
    urls.sort();
    Ok(urls)
}

/// An object's size and entity tag, by URL.
type Metas = HashMap<String, (u64, Option<String>)>;

/// Sizes and entity tags from listings, by URL, until an open takes them.
fn listed() -> &'static Mutex<Metas> {
    static LISTED: OnceLock<Mutex<Metas>> = OnceLock::new();
    LISTED.get_or_init(Default::default)
}

/// Bytes over which an upload goes in parts (S3 multipart and the like).
const ONE_PUT: u64 = 32 << 20;

/// Writes the local file `local` as the object `url`: one PUT, or a
/// multipart upload of 16 MiB parts (4 in flight) for a larger file.
pub(crate) fn upload(local: &std::path::Path, url: &str) -> Result<()> {
    upload_in(local, url, (ONE_PUT, 16 << 20))
}

/// [`upload`] with the one-PUT limit and the part size given.
fn upload_in(local: &std::path::Path, url: &str, (one_put, part): (u64, usize)) -> Result<()> {
    let (store, path) = store(url)?;
    let (local, owned_url) = (local.to_path_buf(), url.to_string());
    block_on(async move {
        let io = |source| Error::Io {
            path: local.clone(),
            source,
        };
        let failed = |e| remote_error(&owned_url, "cannot write the object", e);
        let len = std::fs::metadata(&local).map_err(io)?.len();
        if len <= one_put {
            let bytes = std::fs::read(&local).map_err(io)?;
            store.put(&path, bytes.into()).await.map_err(failed)?;
            return Ok(());
        }
        let parts = store.put_multipart(&path).await.map_err(failed)?;
        let mut w = WriteMultipart::new_with_chunk_size(parts, part);
        let mut file = std::fs::File::open(&local).map_err(io)?;
        let mut buf = vec![0; part.div_ceil(2)];
        loop {
            let n = std::io::Read::read(&mut file, &mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            w.wait_for_capacity(4).await.map_err(failed)?;
            w.write(&buf[..n]);
        }
        w.finish().await.map_err(failed)?;
        Ok(())
    })?
}

/// A local file holding the object `url` whole, to map or read as a local
/// file: the remote cache's file when it has a directory (fetched into it
/// when missing), else a new temporary file (`true`: the caller deletes
/// it).
pub(crate) fn local_copy(url: &str) -> Result<(std::path::PathBuf, bool)> {
    let o = Object::open(url)?;
    let fetch = |dest: &std::path::Path| -> Result<()> {
        let (store, path, dest) = (o.store.clone(), o.path.clone(), dest.to_path_buf());
        block_on(fetch_whole(store, path, o.len, Some(dest), false))?
            .map(drop)
            .map_err(|source| Error::Remote {
                url: url.to_string(),
                reason: "cannot download the object".into(),
                transient: true,
                source,
            })
    };
    if let Some(cache) = super::cache::current() {
        if let Some(file) = cache.file(&o.key, o.len, fetch) {
            return file.map(|f| (f, false));
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = std::env::temp_dir().join(format!("wick-object-{}-{nanos}", std::process::id()));
    match fetch(&tmp) {
        Ok(()) => Ok((tmp, true)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
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
