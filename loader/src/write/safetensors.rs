//! Safetensors shards in either layout [`crate::source::SafetensorsShards`] reads.

use super::{ShardSample, ShardWriter};
use crate::error::{Error, Result};
use safetensors::tensor::{Dtype, TensorView};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes one safetensors shard: pre-resized pixels (`images` u8
/// `[N, h, w, 3]`) or encoded files (`encoded` + `offsets`), with `labels`.
///
/// The format puts every tensor's offsets in a header before the data, so
/// a shard is gathered in memory and written by [`ShardWriter::finish`]
/// (keep shards to a size that fits: `wick convert` writes 1,000 samples
/// per shard by default).
#[derive(Debug)]
pub struct SafetensorsWriter {
    path: PathBuf,
    file: BufWriter<File>,
    /// `Some((height, width))` for pre-resized pixels.
    pixels: Option<(usize, usize)>,
    data: Vec<u8>,
    offsets: Vec<i64>,
    labels: Vec<i64>,
}

impl SafetensorsWriter {
    /// Creates the file `path` for pre-resized RGB u8 images, all
    /// `height x width`.
    pub fn create_pixels(path: impl AsRef<Path>, height: usize, width: usize) -> Result<Self> {
        Self::create(path.as_ref(), Some((height, width)))
    }

    /// Creates the file `path` for encoded images (`encoded` + `offsets`).
    pub fn create_encoded(path: impl AsRef<Path>) -> Result<Self> {
        Self::create(path.as_ref(), None)
    }

    fn create(path: &Path, pixels: Option<(usize, usize)>) -> Result<Self> {
        Ok(Self {
            path: path.to_path_buf(),
            file: super::create_file(path)?,
            pixels,
            data: Vec::new(),
            offsets: vec![0],
            labels: Vec::new(),
        })
    }

    fn io(&self, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::Io {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        }
    }
}

impl ShardWriter for SafetensorsWriter {
    /// Adds a sample: the encoded file, or `height * width * 3` pixels.
    fn write(&mut self, sample: ShardSample<'_>) -> Result<()> {
        let bytes = sample.bytes;
        if let Some((h, w)) = self.pixels {
            if bytes.len() != h * w * 3 {
                return Err(Error::InvalidConfig(format!(
                    "{}: a {h}x{w} RGB sample has {} bytes, got {} ({:?})",
                    self.path.display(),
                    h * w * 3,
                    bytes.len(),
                    sample.key
                )));
            }
        }
        self.data.extend_from_slice(bytes);
        self.offsets.push(self.data.len() as i64);
        self.labels.push(sample.label.into());
        Ok(())
    }

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn finish(mut self) -> Result<()> {
        let n = self.labels.len();
        let le = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (labels, offsets) = (le(&self.labels), le(&self.offsets));
        let view = |dtype, shape, data| TensorView::new(dtype, shape, data).map_err(|e| self.io(e));
        let mut tensors = vec![("labels", view(Dtype::I64, vec![n], &labels)?)];
        match self.pixels {
            Some((h, w)) => {
                tensors.push(("images", view(Dtype::U8, vec![n, h, w, 3], &self.data)?))
            }
            None => {
                let len = self.data.len();
                tensors.push(("encoded", view(Dtype::U8, vec![len], &self.data)?));
                tensors.push(("offsets", view(Dtype::I64, vec![n + 1], &offsets)?));
            }
        }
        let bytes = safetensors::serialize(tensors, None).map_err(|e| self.io(e))?;
        let written = self.file.write_all(&bytes).and_then(|()| self.file.flush());
        written.map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }
}
