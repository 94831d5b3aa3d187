//! Writing shards: one [`ShardWriter`] shape for every format (TFRecord,
//! WebDataset tar, safetensors, Parquet in the Hugging Face Hub's layout),
//! [`convert`], which writes any source as shards (what `wick convert`
//! runs), and [`index`], which writes a WebDataset's manifest and per-shard
//! indexes (what `wick index` runs).
//!
//! ```no_run
//! use candle_wick::write::{ShardSample, ShardWriter, TfRecordWriter};
//! # fn main() -> candle_wick::Result<()> {
//! let mut w = TfRecordWriter::create("train-00000-of-00001.tfrecord")?;
//! let jpeg = std::fs::read("cat.jpg").unwrap();
//! w.write(ShardSample { key: "cat", ext: "jpg", bytes: &jpeg, label: 3 })?;
//! w.finish()?;
//! # Ok(()) }
//! ```

mod convert;
mod index;
#[cfg(feature = "parquet")]
mod parquet;
mod safetensors;
mod tfrecord;
mod webdataset;

#[cfg(feature = "parquet")]
pub use self::parquet::ParquetWriter;
pub use self::safetensors::SafetensorsWriter;
pub use convert::{convert, ConvertOptions, ShardFormat};
pub use index::{index, index_part, Indexed};
pub use tfrecord::TfRecordWriter;
pub use webdataset::WebDatasetWriter;

use crate::error::{Error, Result};
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

/// Creates the shard file `path`, buffered; the error names it.
fn create_file(path: &Path) -> Result<BufWriter<File>> {
    let file = File::create(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(BufWriter::new(file))
}

/// One sample as a shard stores it.
#[derive(Debug, Clone, Copy)]
pub struct ShardSample<'a> {
    /// The sample's name: a WebDataset member's stem (`key.ext`); the other
    /// formats store no name.
    pub key: &'a str,
    /// The kind of `bytes` as a file extension (`jpg`, `png`, or `rgb` for
    /// raw pixels): WebDataset's member suffix.
    pub ext: &'a str,
    /// The encoded image, or raw RGB8 pixels for a pixel shard.
    pub bytes: &'a [u8],
    /// The class index.
    pub label: u32,
}

/// A writer of one shard, the same shape for every format: made by the
/// format's `create(path, ..)`, fed samples in order, then finished. Every
/// error names the shard file.
pub trait ShardWriter {
    /// Appends one sample.
    fn write(&mut self, sample: ShardSample<'_>) -> Result<()>;

    /// Samples written so far.
    fn len(&self) -> usize;

    /// Whether no sample was written.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Completes the shard: flushes it, with the format's closing bytes
    /// (the tar end blocks; the safetensors file is written only now).
    fn finish(self) -> Result<()>;
}
