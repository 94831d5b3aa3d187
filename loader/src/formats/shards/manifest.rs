//! A dataset's manifest (`wick-manifest.json`, written by `wick index` and
//! `wick convert` beside the shards): each shard's name, size, version,
//! record count and the checksum of its index sidecar, and the options the
//! sidecars were made with. Opening shards that a manifest lists reads the
//! manifest (one request for a folder of shards) and no shard byte; a
//! shard's sidecar is read when the shard is first read.

use crate::error::{Error, Result};
use crate::storage::{is_url, url_of};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The manifest's file name, in the shards' folder.
pub(crate) const MANIFEST_NAME: &str = "wick-manifest.json";
/// The layout this code reads and writes.
const VERSION: u32 = 1;
/// Largest manifest read (some 150 bytes a shard: a million shards).
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// What the sidecars were made with: opening with other options (another
/// label extension) indexes the shards anew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexedWith {
    pub(crate) image_exts: Vec<String>,
    pub(crate) label_ext: Option<String>,
    pub(crate) json_label_field: String,
}

/// One shard as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Listed {
    /// The shard's file name in the manifest's folder.
    pub(crate) name: String,
    /// Its size in bytes when it was indexed.
    pub(crate) size: u64,
    /// Its object version (entity tag) when it was indexed, for a shard in
    /// object storage that has one.
    #[serde(default)]
    pub(crate) version: Option<String>,
    /// Its samples.
    pub(crate) records: u64,
    /// Its sidecar's size and CRC-32C.
    pub(crate) index_bytes: u64,
    pub(crate) index_crc: u32,
    /// Damage the index pass left out (`(offset, reason)`), with
    /// `skip_damaged`.
    #[serde(default)]
    pub(crate) damage: Vec<(u64, String)>,
}

/// A dataset's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) wick_manifest: u32,
    pub(crate) format: String,
    pub(crate) options: IndexedWith,
    pub(crate) shards: Vec<Listed>,
}

impl Manifest {
    /// A manifest of `format` shards indexed with `options`.
    pub(crate) fn new(format: &str, options: IndexedWith, shards: Vec<Listed>) -> Self {
        Self {
            wick_manifest: VERSION,
            format: format.to_string(),
            options,
            shards,
        }
    }

    /// The manifest in folder (or URL prefix) `dir`, if there is one. A
    /// manifest that cannot be read or parsed is an error naming it.
    pub(crate) fn read(dir: &Path) -> Result<Option<Self>> {
        let path = join(dir, MANIFEST_NAME);
        let Some(bytes) = crate::storage::read_if_exists(&path, MAX_MANIFEST_BYTES)? else {
            return Ok(None);
        };
        let bad = |reason: String| Error::Dataset {
            path: path.clone(),
            reason,
            source: None,
        };
        let m: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a wick manifest: {e}")))?;
        if m.wick_manifest != VERSION {
            return Err(bad(format!(
                "a manifest of layout {}, which this wick does not read (it reads {VERSION}): \
                 run `wick index` again",
                m.wick_manifest
            )));
        }
        Ok(Some(m))
    }

    /// The manifest as the file's bytes.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a manifest serialises");
        out.push(b'\n');
        out
    }
}

/// `dir/name` for a folder or a URL prefix.
pub(crate) fn join(dir: &Path, name: &str) -> PathBuf {
    if is_url(dir) {
        PathBuf::from(format!("{}/{name}", url_of(dir).trim_end_matches('/')))
    } else {
        dir.join(name)
    }
}

/// The folder (or URL prefix) of a shard and its file name.
pub(crate) fn split(path: &Path) -> (PathBuf, String) {
    if is_url(path) {
        let url = url_of(path);
        let cut = url.rfind('/').unwrap_or(0);
        return (PathBuf::from(&url[..cut]), url[cut + 1..].to_string());
    }
    let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    (dir, name)
}

/// What the manifests beside `paths` say of each (`None` for a shard no
/// manifest of `format` made with `options` lists): each folder's manifest
/// read once.
pub(crate) fn lookup(
    paths: &[PathBuf],
    format: &str,
    options: &IndexedWith,
) -> Result<Vec<Option<(PathBuf, Listed)>>> {
    // Each folder's manifest path and its shards by name, when it has one.
    type Found = Option<(PathBuf, HashMap<String, Listed>)>;
    let mut folders: HashMap<PathBuf, Found> = HashMap::new();
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        if is_url(path) {
            // A URL refused (credentials in it) is refused before its
            // folder's manifest is asked for.
            crate::storage::check_url(path)?;
        }
        let (dir, name) = split(path);
        if !folders.contains_key(&dir) {
            let found = Manifest::read(&dir)?
                .filter(|m| m.format == format && m.options == *options)
                .map(|m| {
                    let by_name = m.shards.into_iter().map(|s| (s.name.clone(), s)).collect();
                    (join(&dir, MANIFEST_NAME), by_name)
                });
            folders.insert(dir.clone(), found);
        }
        let listed = folders[&dir]
            .as_ref()
            .and_then(|(manifest, by_name)| Some((manifest.clone(), by_name.get(&name)?.clone())));
        out.push(listed);
    }
    Ok(out)
}
