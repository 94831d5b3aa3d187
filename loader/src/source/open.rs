//! Opening a dataset from its path, whatever its format: what `wick`, the
//! tests and the benches all need. [`detect`] says what kind of dataset a
//! path holds and why; [`open_path`] opens it.

use super::{
    is_image_path, shard_paths, FileList, ImageFolder, SafetensorsShards, Source, TfRecord,
    WebDataset,
};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The file names a TFRecord shard may have (uncompressed, gzip, zlib).
const TFRECORD: &[&str] = &[".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecord.zz"];

/// The kind of dataset [`detect`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DatasetKind {
    /// TFRecord shards ([`TfRecord`]).
    TfRecord,
    /// WebDataset tars ([`WebDataset`]).
    WebDataset,
    /// Safetensors shards ([`SafetensorsShards`]).
    Safetensors,
    /// Parquet files ([`Parquet`](super::Parquet)): `.parquet` files, or a
    /// Hugging Face dataset folder's `train` split.
    Parquet,
    /// Megatron indexed datasets, `prefix.bin` + `prefix.idx`
    /// ([`Megatron`](super::Megatron)): opened with a window length, so
    /// [`open_path`] refuses them.
    Megatron,
    /// Class folders of images ([`ImageFolder`]).
    ImageFolder,
    /// A list of files and labels ([`FileList`]).
    FileList,
}

impl DatasetKind {
    /// How the kind is named in messages.
    pub fn name(self) -> &'static str {
        match self {
            DatasetKind::TfRecord => "TFRecord shards",
            DatasetKind::WebDataset => "WebDataset shards (.tar)",
            DatasetKind::Safetensors => "safetensors shards",
            DatasetKind::Parquet => "Parquet files",
            DatasetKind::Megatron => "a Megatron indexed dataset (.bin + .idx)",
            DatasetKind::ImageFolder => "an image folder (class folders of images)",
            DatasetKind::FileList => "a file list",
        }
    }
}

/// What [`detect`] decided a path holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Detected {
    /// The kind of dataset.
    pub kind: DatasetKind,
    /// What is opened: the shard files (or Megatron prefixes) in order, or
    /// the one path of an image folder or file list.
    pub paths: Vec<PathBuf>,
    /// Why, in a sentence: what the path holds.
    pub why: String,
    /// Files of another kind that the dataset leaves out (shards of
    /// another format, images outside the class folders), sorted.
    pub strays: Vec<PathBuf>,
}

/// What a folder holds: its files of each kind, and the images outside
/// class folders (which an image folder leaves out).
#[derive(Debug, Default)]
struct Survey {
    kinds: Vec<(DatasetKind, Vec<PathBuf>)>,
    loose: Vec<PathBuf>,
}

/// What a folder holds, kind by kind. Images are counted inside class
/// folders (as [`ImageFolder`] reads them) and outside (which it leaves
/// out); `cap` stops the count of the former once it is reached.
fn survey_folder(dir: &Path, cap: usize) -> Result<Survey> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut kinds: Vec<(DatasetKind, Vec<PathBuf>)> = Vec::new();
    let mut loose_images = Vec::new();
    let mut class_images = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()).map_err(io))
        .collect::<Result<_>>()?;
    entries.sort();
    let hidden = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
    };
    let mut add = |kind: DatasetKind, path: PathBuf| match kinds.iter_mut().find(|k| k.0 == kind) {
        Some(k) => k.1.push(path),
        None => kinds.push((kind, vec![path])),
    };
    for path in entries.iter().filter(|p| !hidden(p)) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            count_images(path, cap, &mut class_images);
        } else if TFRECORD.iter().any(|s| name.ends_with(s)) {
            add(DatasetKind::TfRecord, path.clone());
        } else if name.ends_with(".tar") {
            add(DatasetKind::WebDataset, path.clone());
        } else if name.ends_with(".safetensors") {
            add(DatasetKind::Safetensors, path.clone());
        } else if name.ends_with(".parquet") {
            add(DatasetKind::Parquet, path.clone());
        } else if name.ends_with(".idx") && is_megatron_index(path) {
            add(DatasetKind::Megatron, path.with_extension(""));
        } else if is_image_path(path) {
            loose_images.push(path.clone());
        }
    }
    if !class_images.is_empty() {
        kinds.push((DatasetKind::ImageFolder, class_images));
    }
    Ok(Survey {
        kinds,
        loose: loose_images,
    })
}

/// Adds the images under class folder `dir` to `out`, up to `cap` in all.
fn count_images(dir: &Path, cap: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if out.len() >= cap {
            return;
        }
        let path = entry.path();
        let hidden = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        // Links to folders are not followed (a loop cannot trap the count).
        match entry.file_type() {
            Ok(t) if t.is_dir() => count_images(&path, cap, out),
            Ok(_) if is_image_path(&path) => out.push(path),
            _ => {}
        }
    }
}

/// The train split of the Hugging Face dataset at `path` (a folder or a
/// URL prefix in one of the Hub's layouts), if it is one.
#[cfg(feature = "parquet")]
fn hub_train(path: &Path) -> Option<Detected> {
    let found = super::hub_files(path, "train", &super::HubOptions::default()).ok()?;
    Some(Detected {
        kind: DatasetKind::Parquet,
        paths: found.files,
        why: format!(
            "a Hugging Face dataset ({:?} layout): its train split",
            found.layout
        ),
        strays: Vec::new(),
    })
}

/// Whether `path` starts with a Megatron index's magic.
fn is_megatron_index(path: &Path) -> bool {
    let mut magic = [0u8; 9];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == b"MMIDIDX\0\0")
}

/// Says what kind of dataset `path` holds and why, and which files of
/// another kind it leaves out:
///
/// - a file: by its name (TFRecord, `.tar`, `.safetensors`, a Megatron
///   `.idx` or `.bin`), else a file list; a Megatron prefix (`PREFIX` of
///   `PREFIX.idx`);
/// - a URL: shards by their names under it (Parquet files in a Hugging
///   Face dataset's layout: its train split), else a file list (`.csv`,
///   `.tsv`, `.txt`) or an image folder;
/// - a folder: the kind with the most files: shard files of each format
///   and Megatron prefixes directly in it, images in its class folders.
///   The files of the other kinds are strays, left out and listed. When
///   the runner-up holds at least a quarter as many files, the folder is
///   two datasets rather than one with strays, and that is an error
///   naming both (open the one meant with its own type).
pub fn detect(path: impl AsRef<Path>) -> Result<Detected> {
    let path = path.as_ref();
    let one = |kind, why: String| Detected {
        kind,
        paths: vec![path.to_path_buf()],
        why,
        strays: Vec::new(),
    };
    let has = |suffixes: &[&str]| shard_paths(path, suffixes).ok();
    if crate::storage::is_url(path) || path.is_file() {
        for (kind, suffixes) in [
            (DatasetKind::TfRecord, TFRECORD),
            (DatasetKind::WebDataset, &[".tar"][..]),
            (DatasetKind::Safetensors, &[".safetensors"][..]),
            (DatasetKind::Parquet, &[".parquet"][..]),
        ] {
            if let Some(paths) = has(suffixes) {
                #[cfg(feature = "parquet")]
                if kind == DatasetKind::Parquet && paths.len() > 1 {
                    // A Hugging Face dataset under a URL: its train split,
                    // not every split's files.
                    if let Some(found) = hub_train(path) {
                        return Ok(found);
                    }
                }
                let why = format!("{} file(s) named *{}", paths.len(), suffixes[0]);
                return Ok(Detected {
                    paths,
                    ..one(kind, why)
                });
            }
        }
        let name = path.to_string_lossy().to_ascii_lowercase();
        #[cfg(feature = "parquet")]
        if crate::storage::is_url(path) {
            // A Hugging Face dataset's prefix holds its Parquet files in
            // folders (data/, {config}/{split}/).
            if let Some(found) = hub_train(path) {
                return Ok(found);
            }
        }
        let megatron = (name.ends_with(".idx") || name.ends_with(".bin"))
            && (crate::storage::is_url(path) || is_megatron_index(&path.with_extension("idx")));
        if megatron {
            let why = "a .bin / .idx file: a Megatron indexed dataset's".to_string();
            return Ok(Detected {
                paths: vec![path.with_extension("")],
                ..one(DatasetKind::Megatron, why)
            });
        }
        let list = [".csv", ".tsv", ".txt"].iter().any(|s| name.ends_with(s));
        if crate::storage::is_url(path) && !list {
            // Megatron datasets under a URL: its prefix, or a folder of
            // them (each PREFIX.idx listed).
            let url = crate::storage::url_of(path)
                .trim_end_matches('/')
                .to_string();
            if crate::storage::Blob::open(Path::new(&format!("{url}.idx"))).is_ok() {
                return Ok(one(
                    DatasetKind::Megatron,
                    "a prefix of a Megatron indexed dataset (PREFIX.idx, PREFIX.bin)".into(),
                ));
            }
            if let Some(idx) = has(&[".idx"]) {
                let paths: Vec<PathBuf> = idx.iter().map(|p| p.with_extension("")).collect();
                let why = format!("{} Megatron indexed dataset(s) (*.idx)", paths.len());
                return Ok(Detected {
                    paths,
                    ..one(DatasetKind::Megatron, why)
                });
            }
        }
        return Ok(if path.is_file() || list {
            one(
                DatasetKind::FileList,
                "a file that is not a shard: a file list".into(),
            )
        } else {
            one(
                DatasetKind::ImageFolder,
                "a URL prefix with no shard under it: an image folder".into(),
            )
        });
    }
    if !path.is_dir() {
        // A Megatron prefix, as Megatron's data paths name a dataset.
        let mut idx = path.as_os_str().to_owned();
        idx.push(".idx");
        if is_megatron_index(Path::new(&idx)) {
            return Ok(one(
                DatasetKind::Megatron,
                "a prefix of a Megatron indexed dataset (PREFIX.idx, PREFIX.bin)".into(),
            ));
        }
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: "no such file or folder".into(),
            source: None,
        });
    }
    // Shard files first: with none, the folder is an image folder, and
    // its images are not counted (ImageFolder walks them anyway).
    let Survey {
        kinds: shards,
        loose,
    } = survey_folder(path, 0)?;
    let most_shards = shards.iter().map(|k| k.1.len()).max().unwrap_or(0);
    #[cfg(feature = "parquet")]
    if most_shards == 0 {
        // A Hugging Face dataset's folder.
        if let Some(found) = hub_train(path) {
            return Ok(found);
        }
    }
    if most_shards == 0 {
        return Ok(Detected {
            strays: loose,
            ..one(
                DatasetKind::ImageFolder,
                "no shard file: an image folder".into(),
            )
        });
    }
    // Images count up to four times the shards: enough to tell.
    let Survey { mut kinds, loose } = survey_folder(path, 4 * most_shards + 1)?;
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1.len()));
    let (kind, found) = kinds.remove(0);
    if let Some((other, o)) = kinds.first() {
        if 4 * o.len() >= found.len() {
            return Err(Error::Dataset {
                path: path.to_path_buf(),
                reason: format!(
                    "the folder holds two datasets: {} files of {} and {} of {}; open the \
                     one meant with its own type (or move the other away)",
                    found.len(),
                    kind.name(),
                    o.len(),
                    other.name()
                ),
                source: None,
            });
        }
    }
    let count = |n: usize| {
        if kind == DatasetKind::ImageFolder && n > 4 * most_shards {
            format!("more than {}", 4 * most_shards)
        } else {
            n.to_string()
        }
    };
    let mut strays: Vec<PathBuf> = kinds.into_iter().flat_map(|k| k.1).collect();
    strays.extend(loose);
    strays.sort();
    let mut why = format!("{} files of {}", count(found.len()), kind.name());
    if !strays.is_empty() {
        why.push_str(&format!(", and {} of another kind left out", strays.len()));
    }
    let paths = match kind {
        DatasetKind::ImageFolder => vec![path.to_path_buf()],
        _ => found,
    };
    Ok(Detected {
        kind,
        paths,
        why,
        strays,
    })
}

/// Opens the dataset at `path` as [`detect`] says, leaving its strays out:
/// TFRecord shards (`.tfrecord`, `.tfrecords`, `.tfrecord.gz`,
/// `.tfrecord.zz`), WebDataset tars (`.tar`), safetensors shards
/// (`.safetensors`) or Parquet files (`.parquet`), each a file, a folder
/// of them or a URL; a Hugging Face dataset folder's train split; a folder of
/// class folders as an [`ImageFolder`]; another file as a [`FileList`].
/// Default options each. A Megatron dataset needs a window length: open
/// it with [`Megatron::open`](super::Megatron::open).
///
/// ```no_run
/// # fn main() -> candle_wick::Result<()> {
/// let found = candle_wick::source::detect("data/train")?;
/// println!("{}: {}", found.kind.name(), found.why);
/// let source = candle_wick::open_path("data/train")?;
/// let loader = candle_wick::Loader::builder(source).build()?;
/// # Ok(()) }
/// ```
pub fn open_path(path: impl AsRef<Path>) -> Result<Box<dyn Source>> {
    let path = path.as_ref();
    let found = detect(path)?;
    Ok(match found.kind {
        DatasetKind::TfRecord => Box::new(TfRecord::open(found.paths)?),
        DatasetKind::WebDataset => Box::new(WebDataset::open(found.paths)?),
        DatasetKind::Safetensors => Box::new(SafetensorsShards::open(found.paths)?),
        #[cfg(feature = "parquet")]
        DatasetKind::Parquet => Box::new(super::Parquet::open(found.paths)?),
        #[cfg(not(feature = "parquet"))]
        DatasetKind::Parquet => {
            return Err(Error::InvalidConfig(format!(
                "{} holds Parquet files: enable the `parquet` feature (on by default)",
                path.display()
            )))
        }
        DatasetKind::ImageFolder => Box::new(ImageFolder::new(path)?),
        DatasetKind::FileList => Box::new(FileList::new(path)?),
        DatasetKind::Megatron => {
            return Err(Error::InvalidConfig(format!(
                "{} holds {}: open it with Megatron::open(prefixes, seq_len, windows), which \
                 needs the window length",
                path.display(),
                DatasetKind::Megatron.name()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    #[test]
    fn a_folder_is_the_kind_with_the_most_files_and_lists_its_strays() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for i in 0..12 {
            touch(&d.join(format!("cat/{i}.jpg")));
        }
        touch(&d.join("dog/sub/1.png"));
        touch(&d.join("stray.tar"));
        touch(&d.join("preview.jpg"));
        touch(&d.join("README.md"));
        let found = detect(d).unwrap();
        assert_eq!(found.kind, DatasetKind::ImageFolder);
        assert_eq!(found.strays, [d.join("preview.jpg"), d.join("stray.tar")]);
        assert!(found.why.contains("2 of another kind"), "{}", found.why);

        // Two datasets of a size (11 shards, 13 images): an error naming both.
        for i in 0..10 {
            touch(&d.join(format!("shard-{i}.tar")));
        }
        let e = detect(d).unwrap_err().to_string();
        assert!(
            e.contains("two datasets") && e.contains("WebDataset"),
            "{e}"
        );
        assert!(e.contains("image folder"), "{e}");

        // Shards outnumbering the images four to one: the images are strays.
        for i in 10..60 {
            touch(&d.join(format!("shard-{i}.tar")));
        }
        touch(&d.join("s-0.tfrecord"));
        let found = detect(d).unwrap();
        assert_eq!(found.kind, DatasetKind::WebDataset);
        assert_eq!(found.paths.len(), 61);
        assert_eq!(
            found.strays.len(),
            13 + 1 + 1,
            "class images, the loose one, the TFRecord"
        );
    }

    #[test]
    fn no_shard_is_an_image_folder_and_megatron_needs_a_window() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        touch(&d.join("a/1.jpg"));
        assert_eq!(detect(d).unwrap().kind, DatasetKind::ImageFolder);
        std::fs::remove_dir_all(d.join("a")).unwrap();
        std::fs::write(d.join("c.idx"), b"MMIDIDX\0\0rest").unwrap();
        touch(&d.join("c.bin"));
        let found = detect(d).unwrap();
        assert_eq!(found.kind, DatasetKind::Megatron);
        assert_eq!(found.paths, [d.join("c")]);
        let e = open_path(d).unwrap_err().to_string();
        assert!(e.contains("Megatron::open"), "{e}");
        // A prefix names the dataset as Megatron's data paths do.
        let found = detect(d.join("c")).unwrap();
        assert_eq!(found.kind, DatasetKind::Megatron);
        assert_eq!(found.paths, [d.join("c")]);
        let e = detect(d.join("nothing")).unwrap_err().to_string();
        assert!(e.contains("no such file"), "{e}");
    }
}
