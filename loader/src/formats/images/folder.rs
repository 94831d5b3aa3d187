//! `root/<class>/<file>` datasets, as torchvision's `ImageFolder`.

use super::{is_image_path, labeled_key, read_labeled};
use crate::contract::{reads_through, Parts, Record, Source, Value};
use crate::error::{Error, Result};
use crate::formats::{the_one, DatasetKind, Format};
use std::path::{Path, PathBuf};

/// A dataset laid out as `root/<class>/<file>`, like torchvision's
/// `ImageFolder`.
///
/// - The class folders, sorted by name, give the label indices `0..n`.
/// - Files are found recursively inside each class folder, in torchvision's
///   order: folder by folder (folders sorted by path, as strings), each
///   folder's files sorted by name.
/// - Only image extensions (`jpg`, `jpeg`, `png`, `webp`, `bmp`, `gif`, `tif`,
///   `tiff`, in any case; a GIF gives its first frame, as in Pillow)
///   count; hidden files and folders (names starting with `.`) and other
///   files are ignored.
/// - A class folder with no image is an error, as in torchvision.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    samples: Vec<(PathBuf, u32)>,
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'))
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if !is_hidden(&path) {
            entries.push(path);
        }
    }
    entries.sort();
    Ok(entries)
}

/// Every image under class folder `dir`, in torchvision's order
/// (`sorted(os.walk(dir))`, then `sorted(files)`): folder by folder, the
/// folders sorted by their whole path as a string, each folder's files by
/// name. So `cat/z.jpeg` comes before `cat/sub/y.jpg`, and `cat/a b/`
/// before `cat/a/sub/` (a space sorts before `/`).
fn collect_images(dir: &Path, label: u32, out: &mut Vec<(PathBuf, u32)>) -> Result<()> {
    let mut folders = Vec::new();
    walk(dir, &mut folders)?;
    folders.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, mut files) in folders {
        files.sort_by_key(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()));
        out.extend(files.into_iter().map(|f| (f, label)));
    }
    Ok(())
}

/// Folder `dir` and every folder below it, each with its image files.
fn walk(dir: &Path, folders: &mut Vec<(String, Vec<PathBuf>)>) -> Result<()> {
    let mut files = Vec::new();
    for path in sorted_entries(dir)? {
        // `metadata` follows symlinks, as torchvision's `os.walk(followlinks=True)`.
        let meta = std::fs::metadata(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            walk(&path, folders)?;
        } else if meta.is_file() && is_image_path(&path) {
            files.push(path);
        }
    }
    folders.push((dir.to_string_lossy().into_owned(), files));
    Ok(())
}

impl ImageFolder {
    /// Lists `root`. Fails if `root` is not a folder, has no class folder, or
    /// a class folder has no image.
    ///
    /// `root` may be a URL (`s3://bucket/train/`, `gs://..`, `file://..`):
    /// the objects under it are listed, `<class>/` is the first name after
    /// the root, and each class's images are sorted by their whole name.
    pub fn new(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        if crate::storage::is_url(&root) {
            return Self::remote(root);
        }
        if !root.is_dir() {
            return Err(Error::Dataset {
                path: root,
                reason: "not a folder".into(),
                source: None,
            });
        }
        let mut classes = Vec::new();
        let mut samples = Vec::new();
        for path in sorted_entries(&root)? {
            if !path.is_dir() {
                continue;
            }
            let label = u32::try_from(classes.len()).map_err(|_| Error::Dataset {
                path: root.clone(),
                reason: "more than 2^32 classes".into(),
                source: None,
            })?;
            let before = samples.len();
            collect_images(&path, label, &mut samples)?;
            if samples.len() == before {
                return Err(Error::Dataset {
                    path,
                    reason: "class folder holds no image (jpg, jpeg, png, webp, bmp)".into(),
                    source: None,
                });
            }
            classes.push(
                path.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            );
        }
        if classes.is_empty() {
            return Err(Error::Dataset {
                path: root,
                reason: "no class folders: expected root/<class>/<image>".into(),
                source: None,
            });
        }
        Ok(Self {
            root,
            classes,
            samples,
        })
    }

    /// An image folder in object storage: every object under `root`,
    /// grouped by the first name after it (the class).
    fn remote(root: PathBuf) -> Result<Self> {
        let url = crate::storage::url_of(&root)
            .trim_end_matches('/')
            .to_string();
        let mut by_class: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
        for object in crate::storage::list_all(&url, &[])? {
            let Some(rest) = object.strip_prefix(url.as_str()) else {
                continue;
            };
            let rest = rest.trim_start_matches('/');
            let Some((class, name)) = rest.split_once('/') else {
                continue; // beside the class folders, as a local file there
            };
            let hidden = class.starts_with('.') || name.split('/').any(|n| n.starts_with('.'));
            let path = PathBuf::from(&object);
            if !hidden && is_image_path(&path) {
                by_class.entry(class.to_string()).or_default().push(path);
            }
        }
        if by_class.is_empty() {
            return Err(Error::Dataset {
                path: root,
                reason: "no images under <class>/ prefixes: expected root/<class>/<image>".into(),
                source: None,
            });
        }
        let mut samples = Vec::new();
        let mut classes = Vec::new();
        for (label, (class, mut files)) in by_class.into_iter().enumerate() {
            files.sort();
            samples.extend(files.into_iter().map(|f| (f, label as u32)));
            classes.push(class);
        }
        Ok(Self {
            root,
            classes,
            samples,
        })
    }

    /// The class names, sorted; a label is an index into this list.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The folder this dataset was listed from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every sample's path and label, in index order.
    pub fn samples(&self) -> &[(PathBuf, u32)] {
        &self.samples
    }
}

/// Image folders in the format table: found by their class folders, not
/// by a file name.
pub(crate) const FORMAT: Format = Format::single(
    DatasetKind::ImageFolder,
    "an image folder (class folders of images)",
    &[],
    |paths| {
        Ok(Box::new(ImageFolder::new(the_one(
            paths,
            "an image folder",
        )?)?))
    },
);

impl Source for ImageFolder {
    fn wants_read_ahead(&self) -> bool {
        crate::storage::is_url(&self.root)
    }

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn read(&self, index: usize) -> Result<Record> {
        read_labeled(&self.samples, index, Vec::new())
    }

    fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
        read_labeled(&self.samples, index, bytes)
    }

    fn key(&self, index: usize) -> String {
        labeled_key(&self.samples, index)
    }

    fn digest(&self) -> u32 {
        super::labeled_digest(&self.samples, &self.root)
    }
}

/// Segmentation datasets as two trees: `images/<path>.<jpg|png|...>` and
/// its label map `masks/<path>.png` (Pascal VOC's `JPEGImages` beside
/// `SegmentationClass`, ADE20K's `images` beside `annotations`). A record's
/// bytes are the image; its part `mask` holds the mask's bytes, read when a
/// map asks for it ([`Parts`]). Every image must have its mask: one
/// missing is an error naming both paths when the dataset is opened.
#[derive(Debug, Clone)]
pub struct ImageMaskFolders {
    /// `(image, mask)` pairs, sorted by the image's path.
    samples: Vec<(PathBuf, u32)>,
    masks: Vec<PathBuf>,
}

impl ImageMaskFolders {
    /// Pairs every image under `images` with the `.png` of the same
    /// relative path under `masks`.
    pub fn new(images: impl AsRef<Path>, masks: impl AsRef<Path>) -> Result<Self> {
        let (images, masks_root) = (images.as_ref(), masks.as_ref());
        let mut samples = Vec::new();
        collect_images(images, 0, &mut samples)?;
        if samples.is_empty() {
            return Err(Error::Dataset {
                path: images.to_path_buf(),
                reason: "no images".into(),
                source: None,
            });
        }
        let mut masks = Vec::with_capacity(samples.len());
        for (image, _) in &samples {
            let rel = image.strip_prefix(images).unwrap_or(image);
            let mask = masks_root.join(rel).with_extension("png");
            if !mask.is_file() {
                return Err(Error::Dataset {
                    path: image.clone(),
                    reason: format!("no mask {} for this image", mask.display()),
                    source: None,
                });
            }
            masks.push(mask);
        }
        Ok(Self { samples, masks })
    }
}

impl Source for ImageMaskFolders {
    fn len(&self) -> usize {
        self.samples.len()
    }

    reads_through!(read_reusing);

    fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
        read_labeled(&self.samples, index, bytes)
    }

    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let record = self.read_reusing(index, bytes)?;
        if !parts.wants("mask") {
            return Ok(record);
        }
        let mask = crate::storage::read_whole(
            &self.masks[index],
            Vec::new(),
            crate::storage::local::MAX_FILE_BYTES,
        )?;
        Ok(record.with_part("mask", Value::Bytes(mask)))
    }

    fn key(&self, index: usize) -> String {
        labeled_key(&self.samples, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_classes_sorted_and_skips_hidden_and_non_images() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for (class, files) in [
            ("dog", &["b.JPG", "a.png", ".hidden.jpg", "notes.txt"][..]),
            (
                "cat",
                &[
                    "z.jpeg",
                    "sub/y.jpg",
                    "a/sub/w.jpg",
                    "a b/v.jpg",
                    "a-b/u.jpg",
                    "a/t.jpg",
                ][..],
            ),
            (".git", &["x.jpg"][..]),
        ] {
            for f in files {
                let p = r.join(class).join(f);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, b"x").unwrap();
            }
        }
        std::fs::write(r.join("README.jpg"), b"x").unwrap();
        let ds = ImageFolder::new(r).unwrap();
        assert_eq!(ds.classes(), ["cat", "dog"]);
        let names: Vec<_> = ds
            .samples()
            .iter()
            .map(|(p, l)| (p.strip_prefix(r).unwrap().to_path_buf(), *l))
            .collect();
        // torchvision's order: `sorted(os.walk(cat))` sorts folders as
        // strings (cat < cat/a < "cat/a b" < cat/a-b < cat/a/sub < cat/sub),
        // then each folder's files by name.
        assert_eq!(
            names,
            [
                (PathBuf::from("cat/z.jpeg"), 0),
                (PathBuf::from("cat/a/t.jpg"), 0),
                (PathBuf::from("cat/a b/v.jpg"), 0),
                (PathBuf::from("cat/a-b/u.jpg"), 0),
                (PathBuf::from("cat/a/sub/w.jpg"), 0),
                (PathBuf::from("cat/sub/y.jpg"), 0),
                (PathBuf::from("dog/a.png"), 1),
                (PathBuf::from("dog/b.JPG"), 1),
            ]
        );
    }

    #[test]
    fn read_reusing_fills_the_given_buffer() {
        let dir = tempfile::tempdir().unwrap();
        for (f, body) in [("a.jpg", &b"first file"[..]), ("b.jpg", b"2nd")] {
            std::fs::create_dir_all(dir.path().join("c")).unwrap();
            std::fs::write(dir.path().join("c").join(f), body).unwrap();
        }
        // Through `Arc<dyn Source>`, as the loader holds it.
        let src: std::sync::Arc<dyn Source> =
            std::sync::Arc::new(ImageFolder::new(dir.path()).unwrap());
        let buf = Vec::with_capacity(64);
        let ptr = buf.as_ptr();
        let a = src.read_reusing(0, buf).unwrap();
        assert_eq!(a.bytes, b"first file");
        assert_eq!(a.bytes.as_ptr(), ptr, "the buffer was replaced");
        let b = src.read_reusing(1, a.bytes).unwrap();
        assert_eq!(b.bytes, b"2nd");
        assert_eq!(b.bytes.as_ptr(), ptr, "the buffer was replaced");
        assert_eq!(b.key, src.read(1).unwrap().key);
    }

    #[test]
    fn empty_class_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("empty")).unwrap();
        let err = ImageFolder::new(dir.path()).unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
    }
}
