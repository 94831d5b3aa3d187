//! A dataset's manifest (`wick-manifest.json`, written by `wick index` and
//! `wick convert` beside the shards): each shard's name, size, version,
//! record count and the checksum of its index sidecar (a WebDataset
//! shard's `.wickidx`, an uncompressed TFRecord shard's `.idx`; a Parquet
//! file's rows in each row group, its footer being its index), and the
//! options the sidecars were made with. Opening shards that a manifest lists reads the
//! manifest (one request for a folder of shards) and no shard byte; a
//! shard's sidecar is read when the shard is first read.

use crate::error::{Error, Result};
use crate::storage::{is_url, url_of, Backing, Blob};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The manifest's file name, in the shards' folder.
pub(crate) const MANIFEST_NAME: &str = "wick-manifest.json";
/// The layout this code reads and writes.
const VERSION: u32 = 1;
/// Largest manifest read (some 150 bytes a shard: a million shards).
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// What the sidecars were made with: opening with other options (another
/// label extension) indexes the shards anew. A TFRecord index (record
/// offsets) depends on no option: its are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexedWith {
    #[serde(default)]
    pub(crate) image_exts: Vec<String>,
    #[serde(default)]
    pub(crate) label_ext: Option<String>,
    #[serde(default)]
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
    /// A Parquet file's rows in each of its row groups (its footer's
    /// counts; empty for other formats).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) row_groups: Vec<u64>,
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
        Self::read_at(&join(dir, MANIFEST_NAME))
    }

    /// The manifest (or part manifest) at `path`, as [`read`](Self::read).
    pub(crate) fn read_at(path: &Path) -> Result<Option<Self>> {
        let path = path.to_path_buf();
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
        m.check().map_err(bad)?;
        Ok(Some(m))
    }

    /// What no index pass writes: a shard named outside its folder, or
    /// more samples than its bytes can hold ([`most_records`]), so that a
    /// lying manifest is refused before any count of it is used.
    fn check(&self) -> std::result::Result<(), String> {
        let mut total: u64 = 0;
        for s in &self.shards {
            total = total
                .checked_add(s.records)
                .filter(|&t| usize::try_from(t).is_ok())
                .ok_or("lists more samples than this machine can count")?;
            let n = &s.name;
            if n.is_empty() || n.contains(['/', '\\']) || n == "." || n == ".." {
                return Err(format!(
                    "lists a shard named {n:?}, not a file in its folder"
                ));
            }
            let rows = s.row_groups.iter().try_fold(0u64, |a, &r| a.checked_add(r));
            if self.format == "parquet" && rows != Some(s.records) {
                return Err(format!(
                    "lists {} rows in {n}, and row groups that hold {rows:?}",
                    s.records
                ));
            }
            if s.records > most_records(&self.format, n, s.size) {
                return Err(format!(
                    "lists {} samples in {n}, which is {} bytes: more than it can hold",
                    s.records, s.size
                ));
            }
        }
        Ok(())
    }

    /// The manifest as the file's bytes.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a manifest serialises");
        out.push(b'\n');
        out
    }
}

/// The most records a shard of `format` named `name` can hold in `size`
/// bytes: a tar member takes at least 512 bytes (a WebDataset sample at
/// least one member); a TFRecord record at least its 16 bytes of framing,
/// which a compressed shard (`.gz`, `.zz`) holds in no less than a 1,032nd
/// of that (DEFLATE's largest ratio); a safetensors sample its label, a
/// byte at least.
fn most_records(format: &str, name: &str, size: u64) -> u64 {
    match format {
        "tfrecord"
            if [".gz", ".gzip", ".zz", ".zlib"]
                .iter()
                .any(|e| name.ends_with(e)) =>
        {
            size.saturating_mul(1032) / 16
        }
        "tfrecord" => size / 16,
        // Rows of a Parquet file take no least number of bytes (a run
        // of nulls is a few bytes): its row groups' counts are checked.
        "parquet" => u64::MAX,
        // A safetensors sample's label takes a byte at least.
        "safetensors" => size,
        _ => size / 512,
    }
}

/// The shard at `path` as `manifest` lists it (`listed`): opened with its
/// listed size and version (an object with a version with no request, its
/// reads asking for that version, so a rewritten one is refused by its
/// store on the first read), and an error naming it, saying to index
/// again, when its size or version is not the listed one.
pub(crate) fn open_listed(path: &Path, manifest: &Path, listed: &Listed) -> Result<(Blob, u64)> {
    let (blob, len) = Blob::open_listed(path, listed.size, listed.version.as_deref())?;
    if len != listed.size {
        let what = format!("the shard is {len} bytes, not {}", listed.size);
        return Err(changed(path, manifest, &what));
    }
    if let (Some(was), Some(now)) = (&listed.version, blob.version()) {
        if *was != now {
            let what = format!("the shard's version is {now}, not {was}");
            return Err(changed(path, manifest, &what));
        }
    }
    Ok((blob, len))
}

/// Shard `path`'s sidecar (`sidecar`, its index file) as `manifest` lists
/// it, mapped (a remote one from the cache directory, fetched once a
/// node, with no HEAD): an error naming the sidecar when its size or
/// checksum (`checksum` of its bytes) is not the listed one.
pub(crate) fn map_sidecar(
    sidecar: &Path,
    manifest: &Path,
    listed: &Listed,
    checksum: fn(&[u8]) -> u32,
) -> Result<Backing> {
    let tag = format!("crc32c-{:08x}", listed.index_crc);
    let known = Some((listed.index_bytes, tag.as_str()));
    let backing = crate::storage::map_backed(sidecar, known)?;
    let map = backing.bytes();
    if map.len() as u64 != listed.index_bytes || checksum(map) != listed.index_crc {
        let what = "the shard's index is not the one the manifest lists";
        return Err(changed(sidecar, manifest, what));
    }
    Ok(backing)
}

/// The error of a shard (or its sidecar) at `path` that is not as
/// `manifest` lists it: `what`, and that it changed since.
pub(crate) fn changed(path: &Path, manifest: &Path, what: &str) -> Error {
    let again = format!(
        "it changed since {} was written: run `wick index` on its folder again",
        crate::error::redact(&manifest.to_string_lossy())
    );
    crate::error::shard_error(path, 0, format!("{what}: {again}"))
}

/// A shard's file and index: made at open when the shard was indexed
/// then, else loaded once, on its first read, from what its manifest
/// lists of it.
#[derive(Debug)]
pub(crate) struct Lazy<T> {
    value: OnceLock<T>,
    /// Held while the value is loaded, so it is loaded once.
    loading: Mutex<()>,
    /// The manifest that lists the shard, and what it says of it.
    listed: Option<(PathBuf, Listed)>,
}

impl<T> Lazy<T> {
    /// `value`, made at open, or (`None`) one to load from `listed`.
    pub(crate) fn new(value: Option<T>, listed: Option<(PathBuf, Listed)>) -> Self {
        let lazy = Self {
            value: OnceLock::new(),
            loading: Mutex::new(()),
            listed,
        };
        if let Some(v) = value {
            let _ = lazy.value.set(v);
        }
        lazy
    }

    /// The value, if it is made.
    pub(crate) fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// The manifest that lists the shard, and what it says of it.
    pub(crate) fn listed(&self) -> Option<&(PathBuf, Listed)> {
        self.listed.as_ref()
    }

    /// The value, made by `load(manifest, listed)` on the first call (one
    /// thread loads it, the others wait); a load that fails is an error,
    /// and the next call tries again.
    pub(crate) fn load(&self, load: impl FnOnce(&Path, &Listed) -> Result<T>) -> Result<&T> {
        if let Some(v) = self.value.get() {
            return Ok(v);
        }
        let _one = crate::sync::lock(&self.loading);
        if let Some(v) = self.value.get() {
            return Ok(v);
        }
        let (manifest, listed) = self
            .listed
            .as_ref()
            .expect("a shard not indexed at open is listed");
        let v = load(manifest, listed)?;
        Ok(self.value.get_or_init(|| v))
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

/// The name of part `part` of `parts` of a manifest written by index
/// passes split across machines (`wick-manifest.part-3-of-16.json`).
pub(crate) fn part_name(part: usize, parts: usize) -> String {
    format!("{PART_PREFIX}{part}-of-{parts}.json")
}

const PART_PREFIX: &str = "wick-manifest.part-";

/// The part manifests in folder (or URL prefix) `dir`, sorted (a local
/// folder that cannot be read, or a store that cannot list, has none).
pub(crate) fn parts_in(dir: &Path) -> Vec<PathBuf> {
    let is_part = |name: &str| name.starts_with(PART_PREFIX) && name.ends_with(".json");
    let mut found: Vec<PathBuf> = if is_url(dir) {
        crate::storage::list_urls(url_of(dir), &[".json"])
            .unwrap_or_default()
            .into_iter()
            .filter(|p| is_part(&split(p).1))
            .collect()
    } else {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| is_part(&split(p).1))
            .collect()
    };
    found.sort();
    found
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
            let manifest = join(&dir, MANIFEST_NAME);
            let found = Manifest::read(&dir)?
                .filter(|m| m.format == format && made_with(m, options, &manifest))
                .map(|m| {
                    let by_name = m.shards.into_iter().map(|s| (s.name.clone(), s)).collect();
                    (manifest, by_name)
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

/// The paths of `paths` that no manifest lists (`listed`, from
/// [`lookup`]), in order.
pub(crate) fn unlisted(paths: &[PathBuf], listed: &[Option<(PathBuf, Listed)>]) -> Vec<PathBuf> {
    let none = paths.iter().zip(listed).filter(|(_, l)| l.is_none());
    none.map(|(p, _)| p.clone()).collect()
}

/// Whether manifest `m` (at `path`) was made with `options`; when not,
/// one line on standard error (once a process) says so, since its shards
/// are then indexed anew.
fn made_with(m: &Manifest, options: &IndexedWith, path: &Path) -> bool {
    if m.options == *options {
        return true;
    }
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "wick: {} was made with other options ({:?}) than this open's ({:?}): its shards \
             are indexed anew; `wick index` with these options writes one for them",
            crate::error::redact(&path.to_string_lossy()),
            m.options,
            options
        );
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str, size: u64, records: u64) -> Listed {
        Listed {
            name: name.into(),
            size,
            version: None,
            records,
            index_bytes: 100,
            index_crc: 0,
            damage: Vec::new(),
            row_groups: Vec::new(),
        }
    }

    /// A manifest reads back as written; one naming a shard outside its
    /// folder, or more samples than a shard's bytes can hold, is an error
    /// naming the manifest.
    #[test]
    fn a_manifest_reads_back_and_a_lying_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let options = IndexedWith {
            image_exts: vec!["jpg".into()],
            label_ext: Some("cls".into()),
            json_label_field: "label".into(),
        };
        assert_eq!(Manifest::read(dir.path()).unwrap(), None);
        let write = |shards: Vec<Listed>| {
            let m = Manifest::new("webdataset", options.clone(), shards);
            std::fs::write(dir.path().join(MANIFEST_NAME), m.to_bytes()).unwrap();
            m
        };
        let m = write(vec![listed("s-0.tar", 10_240, 20)]);
        assert_eq!(Manifest::read(dir.path()).unwrap(), Some(m));
        for (shard, why) in [
            (listed("../s-0.tar", 10_240, 20), "not a file in its folder"),
            (listed("s-0.tar", 10_240, 21), "more than it can hold"),
            (listed("s-0.tar", 10_240, u64::MAX), "more than it can hold"),
        ] {
            write(vec![shard]);
            let e = Manifest::read(dir.path()).unwrap_err().to_string();
            assert!(e.contains(MANIFEST_NAME) && e.contains(why), "{e}");
        }
        // Looked up with the options it was made with, a shard is listed;
        // with others (no label), it is not.
        let m = write(vec![listed("s-0.tar", 10_240, 20)]);
        let shard = [dir.path().join("s-0.tar")];
        let found = lookup(&shard, "webdataset", &options).unwrap();
        assert_eq!(found[0].as_ref().map(|f| &f.1), Some(&m.shards[0]));
        let other = IndexedWith {
            label_ext: None,
            ..options.clone()
        };
        assert_eq!(lookup(&shard, "webdataset", &other).unwrap(), [None]);
        std::fs::write(dir.path().join(MANIFEST_NAME), b"{\"wick_manifest\": 1").unwrap();
        let e = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a wick manifest"), "{e}");
    }
}
