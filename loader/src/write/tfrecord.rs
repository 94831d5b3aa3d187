//! TFRecord shards of `tf.train.Example`s, readable by
//! `tf.data.TFRecordDataset`.

use super::{ShardSample, ShardWriter};
use crate::error::{Error, Result};
use crate::formats::shards::tfrecord::{example_bytes, masked_crc};
use crate::formats::shards::TfRecordOptions;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes TFRecord files: each record framed with its length and both
/// masked CRC32C checksums; samples become `tf.train.Example`s with
/// `image/encoded` and `image/class/label`.
#[derive(Debug)]
pub struct TfRecordWriter<W: Write> {
    out: W,
    /// The file, for errors (`<stream>` for a writer over any `W`).
    path: PathBuf,
    image_key: String,
    label_key: String,
    written: usize,
}

impl TfRecordWriter<BufWriter<File>> {
    /// Creates the file `path` (uncompressed).
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let mut w = Self::new(super::create_file(path)?);
        w.path = path.to_path_buf();
        Ok(w)
    }
}

impl<W: Write> TfRecordWriter<W> {
    /// Writes records to `out` (a compressing writer, a buffer), with the
    /// default feature keys.
    pub fn new(out: W) -> Self {
        let d = TfRecordOptions::default();
        Self {
            out,
            path: PathBuf::from("<stream>"),
            image_key: d.image_key,
            label_key: d.label_key,
            written: 0,
        }
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Writes one raw record (any bytes, framed).
    pub fn write_record(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let framed = (|| {
            self.out.write_all(&len)?;
            self.out.write_all(&masked_crc(&len).to_le_bytes())?;
            self.out.write_all(data)?;
            self.out.write_all(&masked_crc(data).to_le_bytes())
        })();
        framed.map_err(|e| self.io(e))?;
        self.written += 1;
        Ok(())
    }

    /// Flushes and returns the inner writer.
    pub fn into_inner(mut self) -> Result<W> {
        self.out.flush().map_err(|e| self.io(e))?;
        Ok(self.out)
    }
}

impl<W: Write> ShardWriter for TfRecordWriter<W> {
    fn write(&mut self, sample: ShardSample<'_>) -> Result<()> {
        let label = sample.label.into();
        let ex = example_bytes(sample.bytes, label, &self.image_key, &self.label_key);
        self.write_record(&ex)
    }

    fn len(&self) -> usize {
        self.written
    }

    fn finish(self) -> Result<()> {
        self.into_inner().map(drop)
    }
}
