//! Indexing a WebDataset, TFRecord, safetensors or Parquet dataset once
//! (what `wick index` runs): an index file beside each shard (a
//! WebDataset shard's `<shard>.wickidx`, an uncompressed TFRecord shard's
//! `<shard>.idx`; a safetensors shard's header and a Parquet file's
//! footer are their own) and a manifest in their folder
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
    /// its footer alone), those reused from the earlier manifest not
    /// counted.
    pub shard_bytes: u64,
    /// Shards the folder's earlier manifest listed that had not changed
    /// since: not read again, their listing and index file kept.
    pub reused: usize,
    /// Bytes of the index files written (the manifest included).
    pub index_bytes: u64,
    /// Part manifests ([`index_part`]) whose listings this manifest took
    /// in; removed once it was written.
    pub merged: usize,
}

/// Indexes the WebDataset, TFRecord or safetensors shards or Parquet files
/// at `path` (a folder, a URL prefix, a brace pattern or one shard) with
/// `opts`: reads each shard's headers (a Parquet file's footer) once (local
/// shards on every core, remote ones 16 at a time), writes its index file
/// beside it, then the manifest in the shards' folder, last, so a
/// manifest is there only when every index it lists is.
/// [`WebDataset::open_with`](crate::source::WebDataset::open_with) with
/// the same options, or
/// [`TfRecord::open_with`](crate::source::TfRecord::open_with), then
/// opens the shards without reading them.
///
/// Shards that the folder's manifest already lists, unchanged since (the
/// same size and version; a local shard, the same size and not modified
/// after the manifest was written) and with their index file there, are
/// not read again: indexing a folder again after shards were added reads
/// the new ones, and after shards were rewritten, those.
///
/// TFRecord shards take only `opts.shard` (damage handling): their index
/// is the records' offsets, DALI's `.idx` (none for a compressed shard,
/// which is read in order: the manifest gives its count). Parquet files
/// take no option and get no index file: the manifest lists each file's
/// rows in each row group, and
/// [`Parquet::open_with`](crate::source::Parquet::open_with) (without a
/// row filter) reads the first file's footer and the others' when it
/// first reads them. safetensors shards likewise take no option and get
/// no index file: the manifest lists each shard's count, and
/// [`SafetensorsShards::open`](crate::source::SafetensorsShards::open)
/// reads a shard's header when it first reads the shard.
///
/// ```no_run
/// # fn main() -> candle_wick::Result<()> {
/// use candle_wick::source::WebDatasetOptions;
/// let done = candle_wick::write::index("s3://bucket/laion/".as_ref(), &WebDatasetOptions::default())?;
/// println!("{} shards, {} samples", done.shards, done.records);
/// # Ok(()) }
/// ```
pub fn index(path: &Path, opts: &WebDatasetOptions) -> Result<Indexed> {
    crate::storage::one_listing(|| index_in(path, opts, None))
}

/// Indexes part `part` of `parts` of the shards at `path` (every
/// `parts`-th shard of the sorted listing, from the `part`-th: sizes
/// spread evenly), as [`index`] does, and writes their listing as a part
/// manifest (`wick-manifest.part-3-of-16.json`) beside the manifest:
/// `parts` machines, each running one part, read a dataset `parts` times
/// faster than one. [`index`] then writes the manifest reading no shard
/// a part manifest lists unchanged, reads those none lists (a part not
/// run, shards added since), and removes the part manifests. Opening
/// reads only the manifest: until it is written, the dataset opens as an
/// unindexed one.
///
/// ```no_run
/// # fn main() -> candle_wick::Result<()> {
/// use candle_wick::source::WebDatasetOptions;
/// let (data, opts) = ("s3://bucket/laion/".as_ref(), WebDatasetOptions::default());
/// // On machine k of 16:
/// # let k = 0;
/// candle_wick::write::index_part(data, &opts, k, 16)?;
/// // Then, on any one machine, once all 16 are done:
/// let done = candle_wick::write::index(data, &opts)?;
/// assert_eq!(done.merged, 16);
/// # Ok(()) }
/// ```
pub fn index_part(
    path: &Path,
    opts: &WebDatasetOptions,
    part: usize,
    parts: usize,
) -> Result<Indexed> {
    if part >= parts {
        return Err(Error::InvalidConfig(format!(
            "index part {part} of {parts}: parts are numbered from 0 to {}",
            parts.saturating_sub(1)
        )));
    }
    crate::storage::one_listing(|| index_in(path, opts, Some((part, parts))))
}

/// [`index`] or, with `part`, [`index_part`].
fn index_in(
    path: &Path,
    opts: &WebDatasetOptions,
    part: Option<(usize, usize)>,
) -> Result<Indexed> {
    let mut found = crate::formats::detect_listing(path)?;
    let parquet = cfg!(feature = "parquet") && found.kind == DatasetKind::Parquet;
    let sharded = matches!(
        found.kind,
        DatasetKind::WebDataset | DatasetKind::TfRecord | DatasetKind::Safetensors
    );
    if !sharded && !parquet {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!(
                "holds {} ({}); wick index writes the manifest of WebDataset, TFRecord or \
                 safetensors shards or Parquet files",
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
    if let Some((part, parts)) = part {
        found.paths = found.paths.into_iter().skip(part).step_by(parts).collect();
    }
    let kind = found.kind;
    let earlier = Earlier::read(&dir, kind, opts);
    let listed = crate::formats::shards::open_each(&found.paths, |p| {
        if let Some(l) = earlier.unchanged(p, kind)? {
            return Ok((l, true));
        }
        let l = match kind {
            DatasetKind::TfRecord => index_tfrecord(p, opts),
            DatasetKind::Safetensors => crate::formats::shards::safetensors::listed(p),
            #[cfg(feature = "parquet")]
            DatasetKind::Parquet => crate::formats::parquet::listed(p),
            _ => index_one(p, opts),
        };
        l.map(|l| (l, false))
    })
    .into_iter()
    .collect::<Result<Vec<_>>>()?;
    let reused = listed.iter().filter(|(_, again)| *again).count();
    let shard_bytes = listed
        .iter()
        .filter(|(_, again)| !again)
        .map(|(l, _)| l.size)
        .sum();
    let listed = listed.into_iter().map(|(l, _)| l).collect();
    let name = part.map_or(MANIFEST_NAME.to_string(), |(k, n)| {
        manifest::part_name(k, n)
    });
    let (format, options) = made_as(kind, opts);
    let done = put_manifest(
        &manifest::join(&dir, &name),
        Manifest::new(format, options, listed),
    )?;
    // The parts are in the manifest now: a later pass reads it.
    let merged = if part.is_none() {
        earlier.parts.len()
    } else {
        0
    };
    if part.is_none() {
        earlier.parts.iter().try_for_each(|p| remove(p))?;
    }
    Ok(Indexed {
        reused,
        shard_bytes,
        merged,
        ..done
    })
}

/// Removes the file or object `path`.
fn remove(path: &Path) -> Result<()> {
    if crate::storage::is_url(path) {
        return crate::storage::delete(path);
    }
    std::fs::remove_file(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// What the manifest a folder held before this index pass lists, and its
/// part manifests ([`index_part`]), for the shards that have not changed
/// since (so that indexing again, after shards were added, reads only the
/// new ones).
struct Earlier {
    /// Their shards by name, each with when the manifest listing it was
    /// written (for local shards, which have no version).
    listed: std::collections::HashMap<String, (Listed, Option<std::time::SystemTime>)>,
    /// The part manifests found.
    parts: Vec<PathBuf>,
    /// Whether damage may be listed (`skip_damaged`).
    damage: bool,
}

impl Earlier {
    /// The manifest in `dir`, when it is one of `kind`'s shards made with
    /// `opts`.
    fn read(dir: &Path, kind: DatasetKind, opts: &WebDatasetOptions) -> Self {
        let (format, options) = made_as(kind, opts);
        let parts = manifest::parts_in(dir);
        let mut listed = std::collections::HashMap::new();
        // The parts first, the manifest last: where both list a shard, the
        // manifest's listing stands (its own time vouches for it).
        for path in parts.iter().chain([&manifest::join(dir, MANIFEST_NAME)]) {
            // A manifest that cannot be read (damaged, or a lying one) is
            // one this pass replaces: nothing of it is kept.
            let m = Manifest::read_at(path).ok().flatten();
            let Some(m) = m.filter(|m| m.format == format && m.options == options) else {
                continue;
            };
            // A local shard is unchanged when not modified after the
            // manifest that lists it was written.
            let written = match crate::storage::is_url(path) {
                true => None,
                false => std::fs::metadata(path).and_then(|m| m.modified()).ok(),
            };
            listed.extend(m.shards.into_iter().map(|s| (s.name.clone(), (s, written))));
        }
        Self {
            listed,
            parts,
            damage: opts.shard.skip_damaged,
        }
    }

    /// What the earlier manifest lists of shard `path`, when the shard
    /// has not changed since and its index file is still there: the same
    /// size and version (an object in a store that gives none, or one
    /// whose version changed, is indexed again), or, for a local shard,
    /// the same size and a modification before the manifest was written;
    /// and its index file (a Parquet file has none) the listed size.
    fn unchanged(&self, path: &Path, kind: DatasetKind) -> Result<Option<Listed>> {
        let name = manifest::split(path).1;
        let Some((l, written)) = self.listed.get(&name) else {
            return Ok(None);
        };
        if !l.damage.is_empty() && !self.damage {
            return Ok(None);
        }
        let (blob, len) = crate::storage::Blob::open(path)?;
        let same = len == l.size
            && match (blob.version(), &l.version) {
                (Some(now), Some(then)) => now == *then,
                (None, None) if !crate::storage::is_url(path) => {
                    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
                    matches!((modified, written), (Some(m), Some(w)) if m < *w)
                }
                _ => false,
            };
        let sidecar = match kind {
            DatasetKind::TfRecord if l.index_bytes > 0 => Some(tfrecord::index_path(path)),
            DatasetKind::WebDataset => Some(sidecar_path(path)),
            _ => None,
        };
        let indexed = match &sidecar {
            Some(s) => crate::storage::Blob::open(s).is_ok_and(|(_, n)| n == l.index_bytes),
            None => true,
        };
        Ok((same && indexed).then(|| l.clone()))
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
            let text = tfrecord::index_text(&c.offsets);
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

/// The manifest's format for `kind`'s shards and the options their
/// index files are made with (`opts`: a WebDataset's; none for the
/// others).
fn made_as(kind: DatasetKind, opts: &WebDatasetOptions) -> (&'static str, IndexedWith) {
    match kind {
        DatasetKind::TfRecord => (tfrecord::MANIFEST_FORMAT, IndexedWith::default()),
        DatasetKind::Safetensors => (
            crate::formats::shards::safetensors::MANIFEST_FORMAT,
            IndexedWith::default(),
        ),
        #[cfg(feature = "parquet")]
        DatasetKind::Parquet => (
            crate::formats::parquet::MANIFEST_FORMAT,
            IndexedWith::default(),
        ),
        _ => (MANIFEST_FORMAT, indexed_with(opts)),
    }
}

/// Writes the manifest of `kind`'s shards `listed` (indexed with `opts`)
/// in `dir`.
pub(crate) fn write_manifest(
    dir: &Path,
    kind: DatasetKind,
    opts: &WebDatasetOptions,
    listed: Vec<Listed>,
) -> Result<Indexed> {
    let (format, options) = made_as(kind, opts);
    put_manifest(
        &manifest::join(dir, MANIFEST_NAME),
        Manifest::new(format, options, listed),
    )
}

/// Writes manifest `m` as `path` (last, after the index files it lists).
fn put_manifest(path: &Path, m: Manifest) -> Result<Indexed> {
    let listed = &m.shards;
    let shards = listed.len();
    let records = listed.iter().map(|l| l.records).sum();
    let shard_bytes = listed.iter().map(|l| l.size).sum();
    let mut index_bytes: u64 = listed.iter().map(|l| l.index_bytes).sum();
    let bytes = m.to_bytes();
    index_bytes += bytes.len() as u64;
    put(path, &bytes)?;
    Ok(Indexed {
        manifest: path.to_path_buf(),
        shards,
        records,
        shard_bytes,
        index_bytes,
        reused: 0,
        merged: 0,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Source;
    use crate::source::TfRecord;
    use std::time::{Duration, SystemTime};

    /// `n` records of `len` bytes as the TFRecord shard `path`, modified
    /// an hour ago (before any manifest written after it).
    fn shard(path: &Path, n: usize, len: usize) {
        let mut w = crate::write::TfRecordWriter::create(path).unwrap();
        (0..n).for_each(|i| w.write_record(&vec![i as u8; len]).unwrap());
        w.into_inner().unwrap();
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
    }

    /// Indexing a folder again reads only the shards added or changed
    /// since its manifest, and those whose index file is gone; the others
    /// keep their listing. The manifest lists every shard, with the counts
    /// a first index gives.
    #[test]
    fn indexing_again_reads_only_new_and_changed_shards() {
        let dir = tempfile::tempdir().unwrap();
        let p = |k: usize| dir.path().join(format!("s-{k}.tfrecord"));
        (0..3).for_each(|k| shard(&p(k), 4, 10));
        let opts = WebDatasetOptions::default();
        let first = index(dir.path(), &opts).unwrap();
        assert_eq!((first.shards, first.records, first.reused), (3, 12, 0));

        shard(&p(3), 5, 10);
        let again = index(dir.path(), &opts).unwrap();
        assert_eq!((again.shards, again.records, again.reused), (4, 17, 3));
        assert_eq!(again.shard_bytes, std::fs::metadata(p(3)).unwrap().len());

        // Shard 0 rewritten (now, after the manifest), shard 1's index
        // file gone: both read again.
        let mut w = crate::write::TfRecordWriter::create(p(0)).unwrap();
        (0..6).for_each(|i| w.write_record(&[i; 10]).unwrap());
        w.into_inner().unwrap();
        std::fs::remove_file(tfrecord::index_path(&p(1))).unwrap();
        let third = index(dir.path(), &opts).unwrap();
        assert_eq!((third.shards, third.records, third.reused), (4, 19, 2));
        assert!(tfrecord::index_path(&p(1)).exists());
        let t = TfRecord::open((0..4).map(p)).unwrap();
        assert_eq!(t.len(), 19);
        // Every shard as a fresh pass lists it.
        let m = Manifest::read(dir.path()).unwrap().unwrap();
        std::fs::remove_file(dir.path().join(MANIFEST_NAME)).unwrap();
        index(dir.path(), &opts).unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap().unwrap(), m);
        // A damaged manifest keeps nothing: every shard is read again.
        std::fs::write(dir.path().join(MANIFEST_NAME), b"{\"wick_manifest\": 1").unwrap();
        let fresh = index(dir.path(), &opts).unwrap();
        assert_eq!((fresh.reused, fresh.records), (0, 19));
        assert_eq!(Manifest::read(dir.path()).unwrap().unwrap(), m);
    }

    /// An index split in parts reads each shard once: each part its own
    /// shards, into a part manifest; the pass after them none of those,
    /// the shards no part listed (added since) alone, and writes the
    /// manifest a single pass writes, the parts removed.
    #[test]
    fn an_index_split_in_parts_reads_each_shard_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = |k: usize| dir.path().join(format!("s-{k}.tfrecord"));
        (0..5).for_each(|k| shard(&p(k), k + 1, 10));
        let opts = WebDatasetOptions::default();
        let size = |ks: &[usize]| -> u64 {
            ks.iter()
                .map(|&k| std::fs::metadata(p(k)).unwrap().len())
                .sum()
        };
        let a = index_part(dir.path(), &opts, 0, 2).unwrap();
        let b = index_part(dir.path(), &opts, 1, 2).unwrap();
        assert_eq!(
            (a.shards, a.records, a.shard_bytes),
            (3, 9, size(&[0, 2, 4]))
        );
        assert_eq!((b.shards, b.records, b.shard_bytes), (2, 6, size(&[1, 3])));
        assert_eq!(
            a.manifest,
            dir.path().join("wick-manifest.part-0-of-2.json")
        );
        assert!(!dir.path().join(MANIFEST_NAME).exists());
        let e = index_part(dir.path(), &opts, 2, 2).unwrap_err().to_string();
        assert!(e.contains("part 2 of 2"), "{e}");

        shard(&p(5), 2, 10);
        let done = index(dir.path(), &opts).unwrap();
        assert_eq!((done.shards, done.records), (6, 17));
        assert_eq!((done.reused, done.merged), (5, 2));
        assert_eq!(done.shard_bytes, size(&[5]));
        assert!(manifest::parts_in(dir.path()).is_empty());
        let m = Manifest::read(dir.path()).unwrap().unwrap();
        std::fs::remove_file(dir.path().join(MANIFEST_NAME)).unwrap();
        assert_eq!(index(dir.path(), &opts).unwrap().reused, 0);
        assert_eq!(Manifest::read(dir.path()).unwrap().unwrap(), m);
    }

    /// Indexing a URL prefix again lists it, rather than taking the
    /// shards its manifest lists: a shard added since is indexed.
    #[cfg(feature = "remote")]
    #[test]
    fn indexing_a_prefix_again_finds_the_shards_added_since() {
        let dir = tempfile::tempdir().unwrap();
        let p = |k: usize| dir.path().join(format!("s-{k}.tfrecord"));
        (0..3).for_each(|k| shard(&p(k), 4, 10));
        let url = PathBuf::from(format!("file://{}/", dir.path().display()));
        let opts = WebDatasetOptions::default();
        let first = index(&url, &opts).unwrap();
        assert_eq!((first.shards, first.records, first.reused), (3, 12, 0));
        shard(&p(3), 5, 10);
        let again = index(&url, &opts).unwrap();
        assert_eq!((again.shards, again.records, again.reused), (4, 17, 3));
        let half = index_part(&url, &opts, 1, 2).unwrap();
        assert_eq!((half.shards, half.reused), (2, 2));
        let merged = index(&url, &opts).unwrap();
        assert_eq!((merged.shards, merged.reused, merged.merged), (4, 4, 1));
        assert!(manifest::parts_in(&url).is_empty());
    }
}
