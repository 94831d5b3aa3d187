//! Indexing a WebDataset, TFRecord or Parquet dataset once (what `wick
//! index` runs): an index file beside each shard (a WebDataset shard's
//! `<shard>.wickidx`, an uncompressed TFRecord shard's `<shard>.idx`; a
//! Parquet file's footer is its own) and a manifest in their folder
//! (`wick-manifest.json`), so that every later open reads the manifest
//! instead of every shard's headers, and each rank loads the index of a
//! shard only when it reads the shard.

use crate::error::{Error, Result};
use crate::formats::shards::manifest::{self, IndexedWith, Listed, Manifest, MANIFEST_NAME};
use crate::formats::shards::tfrecord::{self, Compression};
use crate::formats::shards::webdataset::{self, indexed_with, sidecar_path, MANIFEST_FORMAT};
use crate::formats::shards::webdataset_index::ShardIndex;
use crate::formats::DatasetKind;
use crate::source::WebDatasetOptions;
use std::path::{Path, PathBuf};

/// What [`index`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indexed {
    /// The manifest's path (or URL).
    pub manifest: PathBuf,
    /// Shards indexed.
    pub shards: usize,
    /// Samples in them.
    pub records: u64,
    /// Bytes of the shards indexed (read whole, but for a Parquet file:
    /// its footer alone).
    pub shard_bytes: u64,
    /// Bytes of the index files written (the manifest included).
    pub index_bytes: u64,
}

/// Indexes the WebDataset or TFRecord shards or Parquet files at `path`
/// (a folder, a URL prefix, a brace pattern or one shard) with `opts`:
/// reads each shard's headers (a Parquet file's footer) once (local shards on every core, remote ones 16 at a time),
/// writes its index file beside it, then the manifest in the shards'
/// folder, last, so a manifest is there only when every index it lists
/// is. [`WebDataset::open_with`](crate::source::WebDataset::open_with)
/// with the same options, or
/// [`TfRecord::open_with`](crate::source::TfRecord::open_with), then
/// opens the shards without reading them. Running it again replaces both
/// (after the shards were rewritten, say).
///
/// TFRecord shards take only `opts.shard` (damage handling): their index
/// is the records' offsets, DALI's `.idx` (none for a compressed shard,
/// which is read in order: the manifest gives its count). Parquet files
/// take no option and get no index file: the manifest lists each file's
/// rows in each row group, and
/// [`Parquet::open_with`](crate::source::Parquet::open_with) (without a
/// row filter) reads the first file's footer and the others' when it
/// first reads them.
///
/// ```no_run
/// # fn main() -> candle_wick::Result<()> {
/// use candle_wick::source::WebDatasetOptions;
/// let done = candle_wick::write::index("s3://bucket/laion/".as_ref(), &WebDatasetOptions::default())?;
/// println!("{} shards, {} samples", done.shards, done.records);
/// # Ok(()) }
/// ```
pub fn index(path: &Path, opts: &WebDatasetOptions) -> Result<Indexed> {
    let found = crate::formats::detect(path)?;
    let parquet = cfg!(feature = "parquet") && found.kind == DatasetKind::Parquet;
    if !matches!(found.kind, DatasetKind::WebDataset | DatasetKind::TfRecord) && !parquet {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!(
                "holds {} ({}); wick index writes the manifest of WebDataset or TFRecord shards \
                 or Parquet files",
                found.kind.name(),
                found.why
            ),
            source: None,
        });
    }
    let dir = manifest::split(&found.paths[0]).0;
    if let Some(other) = found.paths.iter().find(|p| manifest::split(p).0 != dir) {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!(
                "its shards are in more than one folder ({} and {}): index each folder",
                dir.display(),
                manifest::split(other).0.display()
            ),
            source: None,
        });
    }
    let kind = found.kind;
    let listed = crate::formats::shards::open_each(&found.paths, |p| match kind {
        DatasetKind::TfRecord => index_tfrecord(p, opts),
        #[cfg(feature = "parquet")]
        DatasetKind::Parquet => crate::formats::parquet::listed(p),
        _ => index_one(p, opts),
    })
    .into_iter()
    .collect::<Result<Vec<_>>>()?;
    match kind {
        DatasetKind::TfRecord => write_tfrecord_manifest(&dir, listed),
        #[cfg(feature = "parquet")]
        DatasetKind::Parquet => write_parquet_manifest(&dir, listed),
        _ => write_manifest(&dir, opts, listed),
    }
}

/// Indexes shard `path` and writes its index file beside it (an object
/// beside an object); returns what the manifest lists of it.
pub(crate) fn index_one(path: &Path, opts: &WebDatasetOptions) -> Result<Listed> {
    let s = webdataset::scan(path, opts)?;
    let bytes = s.index.as_bytes();
    put(&sidecar_path(path), bytes)?;
    Ok(Listed {
        name: manifest::split(path).1,
        size: s.len,
        version: s.blob.version(),
        records: s.index.len() as u64,
        index_bytes: bytes.len() as u64,
        index_crc: ShardIndex::checksum(bytes),
        damage: s.damage.into_iter().map(|d| (d.offset, d.reason)).collect(),
        row_groups: Vec::new(),
    })
}

/// Indexes TFRecord shard `path` (damage handled as `opts.shard` says)
/// and, uncompressed, writes its `.idx` beside it; returns what the
/// manifest lists of it.
pub(crate) fn index_tfrecord(path: &Path, opts: &WebDatasetOptions) -> Result<Listed> {
    let c = tfrecord::count(path, Compression::Auto, &opts.shard)?;
    let (index_bytes, index_crc) = match c.compressed || c.count == 0 {
        true => (0, 0),
        false => {
            let text = tfrecord::index_text(&c.records);
            put(&tfrecord::index_path(path), &text)?;
            (text.len() as u64, crc32c::crc32c(&text))
        }
    };
    Ok(Listed {
        name: manifest::split(path).1,
        size: c.len,
        version: c.blob.version(),
        records: c.count as u64,
        index_bytes,
        index_crc,
        damage: c.damage.into_iter().map(|d| (d.offset, d.reason)).collect(),
        row_groups: Vec::new(),
    })
}

/// Writes the manifest of TFRecord shards `listed` in `dir`.
pub(crate) fn write_tfrecord_manifest(dir: &Path, listed: Vec<Listed>) -> Result<Indexed> {
    let m = Manifest::new(tfrecord::MANIFEST_FORMAT, IndexedWith::default(), listed);
    put_manifest(dir, m)
}

/// Writes the manifest of Parquet files `listed` in `dir`.
#[cfg(feature = "parquet")]
pub(crate) fn write_parquet_manifest(dir: &Path, listed: Vec<Listed>) -> Result<Indexed> {
    let format = crate::formats::parquet::MANIFEST_FORMAT;
    put_manifest(dir, Manifest::new(format, IndexedWith::default(), listed))
}

/// Writes the manifest of `listed` (shards indexed with `opts`) in `dir`.
pub(crate) fn write_manifest(
    dir: &Path,
    opts: &WebDatasetOptions,
    listed: Vec<Listed>,
) -> Result<Indexed> {
    put_manifest(
        dir,
        Manifest::new(MANIFEST_FORMAT, indexed_with(opts), listed),
    )
}

/// Writes manifest `m` in `dir` (last, after the index files it lists).
fn put_manifest(dir: &Path, m: Manifest) -> Result<Indexed> {
    let listed = &m.shards;
    let shards = listed.len();
    let records = listed.iter().map(|l| l.records).sum();
    let shard_bytes = listed.iter().map(|l| l.size).sum();
    let mut index_bytes: u64 = listed.iter().map(|l| l.index_bytes).sum();
    let bytes = m.to_bytes();
    index_bytes += bytes.len() as u64;
    let path = manifest::join(dir, MANIFEST_NAME);
    put(&path, &bytes)?;
    Ok(Indexed {
        manifest: path,
        shards,
        records,
        shard_bytes,
        index_bytes,
    })
}

/// Writes `bytes` as the local file `path` (a temporary file renamed over
/// it, so a reader never sees half of it) or as the object at a URL (one
/// upload from a temporary file).
fn put(path: &Path, bytes: &[u8]) -> Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let unique = format!("wick-{}-{n}.part", std::process::id());
    let remote = crate::storage::is_url(path);
    let temp = if remote {
        std::env::temp_dir().join(unique)
    } else {
        let mut t = path.as_os_str().to_owned();
        t.push(format!(".{unique}"));
        PathBuf::from(t)
    };
    let io = |source| Error::Io {
        path: temp.clone(),
        source,
    };
    std::fs::write(&temp, bytes).map_err(io)?;
    let done = if remote {
        crate::storage::upload(&temp, path)
    } else {
        std::fs::rename(&temp, path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    if remote || done.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    done
}
