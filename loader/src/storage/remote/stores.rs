//! Which client serves a URL: one object-store client per store (scheme
//! and bucket or host) and purpose, made from the environment and the
//! options given with `configure` for the longest matching prefix, and
//! the errors that name the URL.

use super::runtime::crypto;
use crate::error::{Error, Result};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, RetryConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Options for the URLs under a prefix: `(prefix, [(key, value)])`.
pub(super) type Prefixed = Vec<(String, Vec<(String, String)>)>;

/// Options given with [`configure`](super::configure), by URL prefix.
pub(super) fn options() -> &'static Mutex<Prefixed> {
    static OPTS: OnceLock<Mutex<Prefixed>> = OnceLock::new();
    OPTS.get_or_init(Default::default)
}

pub(crate) fn configure(prefix: &str, opts: Vec<(String, String)>) {
    let mut all = crate::sync::lock(options());
    all.retain(|(p, _)| p != prefix);
    all.push((prefix.to_string(), opts));
    // A store made before keeps its settings: forget it.
    crate::sync::lock(stores()).retain(|(root, _), _| !under(root, prefix) && !under(prefix, root));
}

/// Whether `url` is `prefix` or under it at a path boundary:
/// `s3://data` holds `s3://data/x`, not `s3://data-public/x`.
pub(super) fn under(url: &str, prefix: &str) -> bool {
    url.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'))
}

/// What a client is made for: ranged reads (every request bounded in
/// time, 30 s) or whole objects (bounded by progress: a read that waits
/// 30 s for a byte fails, a long transfer does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Use {
    Ranges,
    Whole,
}

/// The clients made, by store root and use.
pub(super) type Stores = HashMap<(String, Use), Arc<dyn ObjectStore>>;

pub(super) fn stores() -> &'static Mutex<Stores> {
    static STORES: OnceLock<Mutex<Stores>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// `scheme://authority` and the object path of `url`.
pub(super) fn split(url: &str) -> Result<(String, &str, &str)> {
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
pub(super) fn store_for(url: &str, purpose: Use) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    let (root, scheme, path) = split(url)?;
    crypto();
    let object = if scheme == "file" {
        ObjectPath::from_absolute_path(format!("/{path}"))
    } else {
        ObjectPath::from_url_path(path)
    }
    .map_err(|e| remote_error(url, "bad object path", object_store::Error::from(e)))?;
    if let Some(s) = crate::sync::lock(stores()).get(&(root.clone(), purpose)) {
        return Ok((s.clone(), object));
    }
    let opts: Vec<(String, String)> = crate::sync::lock(options())
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
    crate::sync::lock(stores()).insert((root, purpose), made.clone());
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

pub(super) fn option_error(url: &str, key: &str, e: object_store::Error) -> Error {
    remote_error(url, &format!("unknown object-store option {key:?}"), e)
}
