//! Opening a dataset from its path, whatever its format: what `wick`, the
//! tests and the benches all need.

use super::{shard_paths, FileList, ImageFolder, SafetensorsShards, Source, TfRecord, WebDataset};
use crate::error::Result;
use std::path::Path;

/// The file names a TFRecord shard may have (uncompressed, gzip, zlib).
const TFRECORD: &[&str] = &[".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecord.zz"];

/// Opens the dataset at `path` by what it holds: TFRecord shards
/// (`.tfrecord`, `.tfrecords`, `.tfrecord.gz`, `.tfrecord.zz`), WebDataset
/// tars (`.tar`) or safetensors shards (`.safetensors`), each a file or a
/// folder of them (the first kind found, in that order); otherwise a folder
/// is an [`ImageFolder`] and a file a [`FileList`]. Default options each.
///
/// ```no_run
/// # fn main() -> candle_wick::Result<()> {
/// let source = candle_wick::open_path("data/train")?;
/// let loader = candle_wick::Loader::builder(source).build()?;
/// # Ok(()) }
/// ```
pub fn open_path(path: impl AsRef<Path>) -> Result<Box<dyn Source>> {
    let path = path.as_ref();
    let has = |suffixes: &[&str]| shard_paths(path, suffixes).ok();
    if let Some(p) = has(TFRECORD) {
        return Ok(Box::new(TfRecord::open(p)?));
    }
    if let Some(p) = has(&[".tar"]) {
        return Ok(Box::new(WebDataset::open(p)?));
    }
    if let Some(p) = has(&[".safetensors"]) {
        return Ok(Box::new(SafetensorsShards::open(p)?));
    }
    if crate::storage::is_url(path) {
        let url = crate::storage::url_of(path).to_ascii_lowercase();
        let list = [".csv", ".tsv", ".txt"].iter().any(|s| url.ends_with(s));
        return Ok(if list {
            Box::new(FileList::new(path)?)
        } else {
            Box::new(ImageFolder::new(path)?)
        });
    }
    Ok(if path.is_dir() {
        Box::new(ImageFolder::new(path)?)
    } else {
        Box::new(FileList::new(path)?)
    })
}
