//! Every on-disk format, one family a folder: files of one sample each
//! (`images/`), shards (`shards/`), tokens (`tokens/`) and Parquet tables
//! (`parquet/`), and opening a dataset from its path whatever its format:
//! [`detect`] says what kind of dataset a path holds and why; [`open_path`]
//! opens it. What the public API shows of them is re-exported by
//! [`crate::source`].

pub(crate) mod hf_cache;
pub(crate) mod images;
#[cfg(feature = "parquet")]
pub(crate) mod parquet;
pub(crate) mod shards;
pub(crate) mod tokens;

use crate::contract::Source;
use crate::error::{Error, Result};
use crate::storage::local::shard_paths;
use images::is_image_path;
use std::path::{Path, PathBuf};

/// One on-disk format: how its files are named (or what they start with),
/// and how they are opened. [`detect`], [`open_path`], [`DatasetKind`]'s
/// methods (which `wick inspect` uses) and `wick convert`'s check of its
/// destination read this table; nothing else names a format's files.
///
/// A new format is its reader file ending with its `FORMAT`, a row in
/// [`FORMATS`] and a [`DatasetKind`] variant (with a `pub use` of the
/// reader in `source/`); a writer adds its file in `write/` and an arm in
/// `write::ShardFormat` and in the `wick convert` options.
pub(crate) struct Format {
    /// The kind of dataset, as the public API names it.
    pub(crate) kind: DatasetKind,
    /// How the kind is named in messages.
    pub(crate) name: &'static str,
    /// Endings of the format's files, the usual one first. Empty for an
    /// image folder, found by its class folders.
    pub(crate) suffixes: &'static [&'static str],
    /// Endings of the files that go with each of them (a TFRecord shard's
    /// index, a Megatron dataset's `.bin`).
    pub(crate) companions: &'static [&'static str],
    /// What a file of the format starts with, when its name alone does not
    /// tell (a Megatron index).
    pub(crate) magic: Option<&'static [u8]>,
    /// Files of the format in a folder make a dataset of them (shards):
    /// `false` for a file list, which is one file named by the user.
    pub(crate) sharded: bool,
    /// The dataset is named by its files' common prefix, without the
    /// ending (a Megatron dataset's `PREFIX`).
    pub(crate) prefix: bool,
    /// Opens what [`detect`] found ([`Detected::paths`]) with the format's
    /// default options.
    pub(crate) open: Open,
    /// A more lenient way to open the files when `open` fails, for a
    /// survey of what they hold, and what it gives up.
    pub(crate) lenient: Option<(Open, &'static str)>,
}

/// How a format opens what [`detect`] found.
pub(crate) type Open = fn(&[PathBuf]) -> Result<Box<dyn Source>>;

impl Format {
    /// A sharded format named by its files' endings alone, opened by
    /// `open`: what most rows are (a row with more says so with `..`).
    pub(crate) const fn shards(
        kind: DatasetKind,
        name: &'static str,
        suffixes: &'static [&'static str],
        open: Open,
    ) -> Self {
        Self {
            kind,
            name,
            suffixes,
            companions: &[],
            magic: None,
            sharded: true,
            prefix: false,
            open,
            lenient: None,
        }
    }

    /// A format whose dataset is one path (a folder, a list), opened by
    /// `open` from [`the_one`] path.
    pub(crate) const fn single(
        kind: DatasetKind,
        name: &'static str,
        suffixes: &'static [&'static str],
        open: Open,
    ) -> Self {
        Self {
            sharded: false,
            ..Self::shards(kind, name, suffixes, open)
        }
    }
}

/// The one path of a dataset that is one folder or file (`what` names it
/// in the error when there are several).
pub(crate) fn the_one<'a>(paths: &'a [PathBuf], what: &str) -> Result<&'a Path> {
    match paths {
        [one] => Ok(one),
        _ => Err(Error::InvalidConfig(format!(
            "{what} is one path, not {paths:?}"
        ))),
    }
}

#[cfg(feature = "parquet")]
use parquet::FORMAT as PARQUET;

/// Parquet files without the `parquet` feature: found, and refused with
/// the feature to turn on.
#[cfg(not(feature = "parquet"))]
const PARQUET: Format = Format {
    kind: DatasetKind::Parquet,
    name: "Parquet files",
    suffixes: &[".parquet"],
    companions: &[],
    magic: None,
    sharded: true,
    prefix: false,
    open: |paths| {
        Err(Error::InvalidConfig(format!(
            "{} holds Parquet files: enable the `parquet` feature",
            paths
                .first()
                .map_or(String::new(), |p| p.display().to_string())
        )))
    },
    lenient: None,
};

/// Every format, in the order [`detect`] tries them on a file or a URL.
pub(crate) static FORMATS: &[Format] = &[
    shards::tfrecord::FORMAT,
    shards::webdataset::FORMAT,
    shards::safetensors::FORMAT,
    PARQUET,
    tokens::megatron::FORMAT,
    images::folder::FORMAT,
    images::list::FORMAT,
];

/// The table's row for `kind`.
pub(crate) fn format(kind: DatasetKind) -> &'static Format {
    FORMATS
        .iter()
        .find(|f| f.kind == kind)
        .expect("every DatasetKind has a row in FORMATS")
}

/// Whether the file `path` ends in one of `f`'s suffixes (and starts with
/// its magic, when it has one).
fn is_of(f: &Format, path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    f.suffixes.iter().any(|s| name.ends_with(s)) && f.magic.is_none_or(|m| starts_with(path, m))
}

/// Whether the file `path` starts with `magic`.
fn starts_with(path: &Path, magic: &[u8]) -> bool {
    let mut head = vec![0u8; magic.len()];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| head == magic)
}

/// The kind of dataset [`detect`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DatasetKind {
    /// TFRecord shards ([`TfRecord`](crate::source::TfRecord)).
    TfRecord,
    /// WebDataset tars ([`WebDataset`](crate::source::WebDataset)).
    WebDataset,
    /// Safetensors shards ([`SafetensorsShards`](crate::source::SafetensorsShards)).
    Safetensors,
    /// Parquet files ([`Parquet`](crate::source::Parquet)): `.parquet` files, or a
    /// Hugging Face dataset folder's `train` split.
    Parquet,
    /// Megatron indexed datasets, `prefix.bin` + `prefix.idx`
    /// ([`Megatron`](crate::source::Megatron)): opened with a window length, so
    /// [`open_path`] refuses them.
    Megatron,
    /// Class folders of images ([`ImageFolder`](crate::source::ImageFolder)).
    ImageFolder,
    /// A list of files and labels ([`FileList`](crate::source::FileList)).
    FileList,
}

impl DatasetKind {
    /// How the kind is named in messages.
    pub fn name(self) -> &'static str {
        format(self).name
    }

    /// The kind of a local file that belongs to a sharded dataset, by its
    /// name (and, for a Megatron index, its first bytes): a TFRecord,
    /// WebDataset or safetensors shard, a Parquet file, a Megatron `.idx`
    /// (whose dataset is the path without `.idx`). `None` for any other
    /// file (an image, a list, a Megatron `.bin`).
    pub fn of_file(path: &Path) -> Option<DatasetKind> {
        FORMATS
            .iter()
            .find(|f| f.sharded && is_of(f, path))
            .map(|f| f.kind)
    }

    /// Opens what [`detect`] found, [`Detected::paths`], as this kind with
    /// its default options ([`open_path`] is `detect` then this). A
    /// Megatron dataset is an error saying how to open it (it needs a
    /// window length).
    pub fn open(self, paths: &[PathBuf]) -> Result<Box<dyn Source>> {
        (format(self).open)(paths)
    }

    /// [`open`](Self::open), or, when that fails, as leniently as the
    /// format allows, for a survey of what the files hold (`wick inspect`):
    /// WebDataset shards without labels. The source, and what the lenient
    /// way gave up (`Some("labels")`) when it was taken.
    pub fn open_lenient(
        self,
        paths: &[PathBuf],
    ) -> Result<(Box<dyn Source>, Option<&'static str>)> {
        let f = format(self);
        match (f.open)(paths) {
            Ok(source) => Ok((source, None)),
            Err(e) => match f.lenient {
                Some((open, gives_up)) => match open(paths) {
                    Ok(source) => Ok((source, Some(gives_up))),
                    Err(_) => Err(e),
                },
                None => Err(e),
            },
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
/// folders (as [`ImageFolder`](crate::source::ImageFolder) reads them) and outside (which it leaves
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
        if path.is_dir() {
            count_images(path, cap, &mut class_images);
        } else if let Some(f) = FORMATS.iter().find(|f| f.sharded && is_of(f, path)) {
            let name = match f.prefix {
                true => path.with_extension(""),
                false => path.clone(),
            };
            add(f.kind, name);
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
    let found = parquet::hub_files(path, "train", &parquet::HubOptions::default()).ok()?;
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

/// The file `path` with `suffix` appended (`PREFIX` + `.idx`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
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
    // One listing of a URL prefix for every suffix probed.
    crate::storage::one_listing(|| detect_in(path.as_ref(), true))
}

/// [`detect`], with a URL prefix's shards listed even when a manifest
/// lists them (what `wick index` reads, to find the shards added since).
pub(crate) fn detect_listing(path: &Path) -> Result<Detected> {
    detect_in(path, false)
}

fn detect_in(path: &Path, by_manifest: bool) -> Result<Detected> {
    let one = |kind, why: String| Detected {
        kind,
        paths: vec![path.to_path_buf()],
        why,
        strays: Vec::new(),
    };
    let has = |suffixes: &[&str]| shard_paths(path, suffixes).ok();
    let megatron = format(DatasetKind::Megatron);
    if by_manifest {
        if let Some(found) = manifest_shards(path)? {
            return Ok(found);
        }
    }
    if crate::storage::is_url(path) || path.is_file() {
        for f in FORMATS.iter().filter(|f| f.sharded && !f.prefix) {
            let (kind, suffixes) = (f.kind, f.suffixes);
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
        let prefix = path.with_extension("");
        let is_megatron = megatron
            .suffixes
            .iter()
            .chain(megatron.companions)
            .any(|s| name.ends_with(s))
            && (crate::storage::is_url(path)
                || is_of(megatron, &with_suffix(&prefix, megatron.suffixes[0])));
        if is_megatron {
            let why = "a .bin / .idx file: a Megatron indexed dataset's".to_string();
            return Ok(Detected {
                paths: vec![path.with_extension("")],
                ..one(DatasetKind::Megatron, why)
            });
        }
        let list = format(DatasetKind::FileList)
            .suffixes
            .iter()
            .any(|s| name.ends_with(s));
        if crate::storage::is_url(path) && !list {
            // Megatron datasets under a URL: its prefix, or a folder of
            // them (each PREFIX.idx listed).
            let url = crate::storage::url_of(path)
                .trim_end_matches('/')
                .to_string();
            let idx = format!("{url}{}", megatron.suffixes[0]);
            if crate::storage::Blob::open(Path::new(&idx)).is_ok() {
                return Ok(one(
                    DatasetKind::Megatron,
                    "a prefix of a Megatron indexed dataset (PREFIX.idx, PREFIX.bin)".into(),
                ));
            }
            if let Some(idx) = has(megatron.suffixes) {
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
        if is_of(megatron, &with_suffix(path, megatron.suffixes[0])) {
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

/// The WebDataset or TFRecord shards or Parquet files that a manifest
/// under the URL prefix `path` lists: one GET and no listing (an HTTP
/// server cannot list; a prefix of 10^5 shards and their index files is
/// hundreds of listing pages). `None` for a local path (its folder is surveyed: a readdir), a URL naming a
/// file or a brace pattern, or a prefix without a manifest.
fn manifest_shards(path: &Path) -> Result<Option<Detected>> {
    use shards::manifest::{join, Manifest, MANIFEST_NAME};
    if !crate::storage::is_url(path) {
        return Ok(None);
    }
    let url = crate::storage::url_of(path);
    let named = FORMATS
        .iter()
        .flat_map(|f| f.suffixes.iter().chain(f.companions))
        .any(|s| url.ends_with(s));
    if named || url.contains('{') {
        return Ok(None);
    }
    let dir = PathBuf::from(url.trim_end_matches('/'));
    let Some(m) = Manifest::read(&dir)? else {
        return Ok(None);
    };
    let kind = match m.format.as_str() {
        shards::webdataset::MANIFEST_FORMAT => DatasetKind::WebDataset,
        shards::tfrecord::MANIFEST_FORMAT => DatasetKind::TfRecord,
        shards::safetensors::MANIFEST_FORMAT => DatasetKind::Safetensors,
        #[cfg(feature = "parquet")]
        parquet::MANIFEST_FORMAT => DatasetKind::Parquet,
        _ => return Ok(None),
    };
    if m.shards.is_empty() {
        return Ok(None);
    }
    Ok(Some(Detected {
        kind,
        paths: m.shards.iter().map(|s| join(&dir, &s.name)).collect(),
        why: format!(
            "{} {}, as its {MANIFEST_NAME} lists them",
            m.shards.len(),
            format(kind).name
        ),
        strays: Vec::new(),
    }))
}

/// Opens the dataset at `path` as [`detect`] says, leaving its strays out:
/// TFRecord shards (`.tfrecord`, `.tfrecords`, `.tfrecord.gz`,
/// `.tfrecord.zz`), WebDataset tars (`.tar`), safetensors shards
/// (`.safetensors`) or Parquet files (`.parquet`), each a file, a folder
/// of them or a URL; a Hugging Face dataset folder's train split; a folder of
/// class folders as an [`ImageFolder`](crate::source::ImageFolder); another file as a [`FileList`](crate::source::FileList).
/// Default options each. A Megatron dataset needs a window length: open
/// it with [`Megatron::open`](crate::source::Megatron::open).
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
    crate::storage::one_listing(|| {
        let found = detect(path)?;
        found.kind.open(&found.paths)
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
