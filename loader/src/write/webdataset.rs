//! WebDataset tar shards, readable by `webdataset.WebDataset`.

use super::{ShardSample, ShardWriter};
use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes WebDataset tar shards: per sample `<key>.<ext>` with the image
/// and `<key>.cls` with the label.
pub struct WebDatasetWriter<W: Write> {
    tar: tar::Builder<W>,
    /// The file, for errors (`<stream>` for a writer over any `W`).
    path: PathBuf,
    written: usize,
}

impl<W: Write> std::fmt::Debug for WebDatasetWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebDatasetWriter")
            .field("path", &self.path)
            .field("written", &self.written)
            .finish()
    }
}

impl WebDatasetWriter<BufWriter<File>> {
    /// Creates the file `path`.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let mut w = Self::new(super::create_file(path)?);
        w.path = path.to_path_buf();
        Ok(w)
    }
}

impl<W: Write> WebDatasetWriter<W> {
    /// Writes a tar archive to `out`.
    pub fn new(out: W) -> Self {
        Self {
            tar: tar::Builder::new(out),
            path: PathBuf::from("<stream>"),
            written: 0,
        }
    }

    fn member(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        self.tar
            .append_data(&mut header, name, data)
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Writes the end-of-archive blocks and returns the inner writer.
    pub fn into_inner(self) -> Result<W> {
        let path = self.path;
        self.tar
            .into_inner()
            .map_err(|source| Error::Io { path, source })
    }
}

impl<W: Write> ShardWriter for WebDatasetWriter<W> {
    fn write(&mut self, sample: ShardSample<'_>) -> Result<()> {
        let (key, ext) = (sample.key, sample.ext);
        self.member(&format!("{key}.{ext}"), sample.bytes)?;
        self.member(&format!("{key}.cls"), sample.label.to_string().as_bytes())?;
        self.written += 1;
        Ok(())
    }

    fn len(&self) -> usize {
        self.written
    }

    fn finish(self) -> Result<()> {
        self.into_inner().map(drop)
    }
}
