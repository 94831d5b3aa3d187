//! Datasets of one file a sample: an image folder (class subfolders, or
//! images with masks) and a file list (CSV/TSV), and what they share: which
//! files are images, and reading, keying and checksumming labelled files.

pub(crate) mod folder;
pub(crate) mod list;

pub use folder::{ImageFolder, ImageMaskFolders};
pub use list::FileList;

use crate::contract::{check_index, Record};
use crate::error::Result;
use crate::storage::local::MAX_FILE_BYTES;
use std::path::{Path, PathBuf};

/// File extensions (lower case) that the file-backed sources treat as images.
pub(crate) const IMAGE_EXTENSIONS: &[&str] =
    &["jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"];

/// Whether `path` has one of [`IMAGE_EXTENSIONS`], matched case-insensitively.
pub(crate) fn is_image_path(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// Record `index` of a list of labelled files (the path is the key), its
/// bytes read into `bytes`.
pub(crate) fn read_labeled(
    samples: &[(PathBuf, u32)],
    index: usize,
    bytes: Vec<u8>,
) -> Result<Record> {
    check_index(index, samples.len())?;
    let (path, label) = &samples[index];
    Ok(Record::encoded(
        path.display().to_string(),
        crate::storage::read_whole(path, bytes, MAX_FILE_BYTES)?,
        *label,
    ))
}

/// The key of file `index` of a list of labelled files.
pub(crate) fn labeled_key(samples: &[(PathBuf, u32)], index: usize) -> String {
    samples
        .get(index)
        .map_or_else(|| format!("#{index}"), |(p, _)| p.display().to_string())
}

/// A checksum of labelled samples: each path relative to `root` (the
/// full path when it is not under it) and its label, in order.
pub(crate) fn labeled_digest(samples: &[(PathBuf, u32)], root: &Path) -> u32 {
    samples.iter().fold(0, |crc, (path, label)| {
        let rel = path.strip_prefix(root).unwrap_or(path);
        let crc = crc32c::crc32c_append(crc, rel.as_os_str().as_encoded_bytes());
        crc32c::crc32c_append(crc, &label.to_le_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_extensions_match_case_insensitively() {
        assert!(is_image_path(Path::new("a/b.JPG")));
        assert!(is_image_path(Path::new("a/b.jpeg")));
        assert!(is_image_path(Path::new("b.Png")));
        assert!(!is_image_path(Path::new("b.txt")));
        assert!(!is_image_path(Path::new("jpg")));
    }
}
