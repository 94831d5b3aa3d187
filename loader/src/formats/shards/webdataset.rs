//! WebDataset tar shards: the files of a sample share a key (the path up to
//! the first dot of the file name: `0001.jpg` + `0001.cls`) and follow one
//! another in the archive.

use super::manifest::{self, IndexedWith, Lazy, Listed};
use super::webdataset_index::{IndexBuilder, Member, ShardIndex, SIDECAR_SUFFIX};
use super::{ShardOptions, ShardSet};
use crate::contract::{reads_through, Damage, Parts, Record, ShardInfo, Source, Value};
use crate::error::{shard_error, Cause};
use crate::error::{Error, Result};
use crate::formats::images::IMAGE_EXTENSIONS;
use crate::formats::{DatasetKind, Format};
use crate::storage::Blob;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest label file read (`.cls`, `.json`).
const MAX_LABEL_BYTES: u64 = 64 << 10;
/// Largest GNU long-name or PAX extension member read (a path is at most
/// 4 KiB on Linux; the tar crate alone would read any size).
const MAX_EXTENSION_BYTES: u64 = 64 << 10;
/// Largest image member read.
const MAX_IMAGE_BYTES: u64 = crate::storage::local::MAX_FILE_BYTES;

/// Options for [`WebDataset::open_with`].
#[derive(Debug, Clone)]
pub struct WebDatasetOptions {
    /// Extensions (lower case) of the image member, in order of preference.
    /// Default `jpg jpeg png webp bmp gif tif tiff`.
    pub image_exts: Vec<String>,
    /// Extension of the label member: a decimal integer (`cls`, `cls2`,
    /// `index`, `txt`), or a JSON object when it ends in `json`, whose
    /// [`Self::json_label_field`] is the label. `None`: no labels, every
    /// label is 0. Default `cls`.
    pub label_ext: Option<String>,
    /// The field of a JSON label member. Default `label`.
    pub json_label_field: String,
    /// Damage handling on open.
    pub shard: ShardOptions,
}

impl Default for WebDatasetOptions {
    fn default() -> Self {
        Self {
            image_exts: IMAGE_EXTENSIONS.iter().map(|s| s.to_string()).collect(),
            label_ext: Some("cls".into()),
            json_label_field: "label".into(),
            shard: ShardOptions::default(),
        }
    }
}

/// A dataset of WebDataset tar shards, read at random through an index of
/// each shard's tar headers: made when the dataset is opened, or, for a
/// shard that a manifest beside it lists (`wick index` writes one), read
/// from the shard's index file when the shard is first read, so opening
/// reads no shard at all.
///
/// ```no_run
/// use candle_wick::source::WebDataset;
/// use candle_wick::Loader;
/// # fn main() -> candle_wick::Result<()> {
/// let train = WebDataset::open(["shards/train-000000.tar", "shards/train-000001.tar"])?;
/// let loader = Loader::builder(train).batch_size(64).train_transforms().build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct WebDataset {
    shards: Vec<Shard>,
    set: ShardSet,
}

/// One shard of a [`WebDataset`].
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    /// Its file and index: made at open, or loaded from its manifest's
    /// listing on its first read.
    opened: Lazy<Opened>,
}

impl Shard {
    /// The key of its sample `n`: `<shard>:<key>`, or `<shard>#<n>` while
    /// its index is not loaded (naming a sample loads nothing).
    fn key(&self, n: usize) -> String {
        match self.opened.get() {
            Some(o) => format!("{}:{}", self.path.display(), o.index.key(n)),
            None => format!("{}#{n}", self.path.display()),
        }
    }
}

/// A shard's file and index.
#[derive(Debug)]
struct Opened {
    blob: Blob,
    index: ShardIndex,
}

/// A shard indexed by reading its tar headers.
pub(crate) struct Scanned {
    pub(crate) blob: Blob,
    pub(crate) len: u64,
    pub(crate) index: ShardIndex,
    pub(crate) damage: Vec<Damage>,
}

/// The WebDataset split of a member path: `(key, extension)`, the key being
/// the path up to the first dot of the file name. `None` without a dot.
fn split_key(path: &str) -> Option<(&str, &str)> {
    let name_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[name_start..].find('.')? + name_start;
    Some((&path[..dot], &path[dot + 1..]))
}

/// A sample being gathered while the shard is indexed.
#[derive(Default)]
struct Pending {
    key: String,
    image: Option<(u64, u64, usize)>,
    label: Option<u32>,
    offset: u64,
    /// Every member: `(extension index, offset, length)`.
    members: Vec<Member>,
}

impl WebDataset {
    /// Opens shards with the default options.
    pub fn open(paths: impl IntoIterator<Item = impl AsRef<Path>>) -> Result<Self> {
        Self::open_with(paths, WebDatasetOptions::default())
    }

    /// Opens shards (in the order given). A shard that a manifest in its
    /// folder lists (made by `wick index` or `wick convert` with the same
    /// options) is not read until a sample of it is; the others are
    /// indexed now, by reading their tar headers (each local shard on a
    /// core of its own, 16 remote ones at once), and a line on standard
    /// error says how to index them once instead.
    pub fn open_with(
        paths: impl IntoIterator<Item = impl AsRef<Path>>,
        opts: WebDatasetOptions,
    ) -> Result<Self> {
        let paths = super::owned(paths);
        let listed = manifest::lookup(&paths, MANIFEST_FORMAT, &indexed_with(&opts))?;
        let unlisted = manifest::unlisted(&paths, &listed);
        if !unlisted.is_empty() {
            hint(&unlisted);
        }
        let mut scanned = scan_each(&unlisted, &opts).into_iter();
        let mut set = ShardSet::default();
        let mut shards = Vec::with_capacity(paths.len());
        for (path, listed) in paths.into_iter().zip(listed) {
            let mut opened = None;
            match &listed {
                Some((_, l)) => drop(set.push_listed(&opts.shard, &path, l)?),
                None => {
                    let s = scanned
                        .next()
                        .expect("one scan a shard no manifest lists")?;
                    set.damage.extend(s.damage);
                    set.push(&path, s.index.len());
                    opened = Some(Opened {
                        blob: s.blob,
                        index: s.index,
                    });
                }
            }
            shards.push(Shard {
                path,
                opened: Lazy::new(opened, listed),
            });
        }
        Ok(Self { shards, set })
    }

    /// Shard `s`'s file and index, loaded from its manifest's listing on
    /// its first read.
    fn opened(&self, s: usize) -> Result<&Opened> {
        let shard = &self.shards[s];
        shard
            .opened
            .load(|manifest, listed| load_listed(&shard.path, manifest, listed))
    }
}

/// The manifest's name for the format.
pub(crate) const MANIFEST_FORMAT: &str = "webdataset";

/// What a manifest records of the options a shard was indexed with.
pub(crate) fn indexed_with(opts: &WebDatasetOptions) -> IndexedWith {
    IndexedWith {
        image_exts: opts.image_exts.clone(),
        label_ext: opts.label_ext.clone(),
        json_label_field: opts.json_label_field.clone(),
    }
}

/// The path of shard `path`'s index file.
pub(crate) fn sidecar_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(SIDECAR_SUFFIX);
    PathBuf::from(p)
}

/// Indexes shard `path` by reading its tar headers.
pub(crate) fn scan(path: &Path, opts: &WebDatasetOptions) -> Result<Scanned> {
    let (blob, len) = Blob::open(path)?;
    scan_blob(path, blob, len, opts)
}

/// Indexes shard `path`, open as `blob` (`len` bytes), by reading its
/// tar headers.
fn scan_blob(path: &Path, blob: Blob, len: u64, opts: &WebDatasetOptions) -> Result<Scanned> {
    let mut own = ShardSet::default();
    let index = index_shard(path, blob.reader(path, len), len, opts, &mut own)?;
    Ok(Scanned {
        blob,
        len,
        index,
        damage: own.damage,
    })
}

/// Indexes `paths` (shards no manifest lists), in their order: each by
/// reading its tar headers, except that a shard in object storage, with
/// a cache directory, is indexed once a node ([`scan_shared`]). The
/// node's processes share the work: each first takes the shards no
/// other is indexing, then waits for the others' (`open_each`: local
/// shards on every core, remote ones 16 at a time).
fn scan_each(paths: &[PathBuf], opts: &WebDatasetOptions) -> Vec<Result<Scanned>> {
    let mut got = super::open_each(paths, |path| scan_shared(path, opts, false));
    let busy: Vec<usize> = (0..paths.len())
        .filter(|&i| matches!(got[i], Ok(None)))
        .collect();
    let waiting: Vec<PathBuf> = busy.iter().map(|&i| paths[i].clone()).collect();
    let waited = super::open_each(&waiting, |path| scan_shared(path, opts, true));
    for (i, r) in busy.into_iter().zip(waited) {
        got[i] = r;
    }
    got.into_iter()
        .zip(paths)
        .map(|(r, path)| match r {
            Ok(Some(s)) => Ok(s),
            // Never busy when waiting; indexed here if it were.
            Ok(None) => scan(path, opts),
            Err(e) => Err(e),
        })
        .collect()
}

/// Indexes shard `path`, once a node when it is in object storage with
/// an entity tag and the remote cache has a directory: the index is the
/// node's file under the shard's URL, size, tag and the options, made by
/// the one process that takes its lock and mapped by the others (see
/// [`crate::storage::node_file`]). The shard is opened pinned to the tag
/// the file is named by, so a shard rewritten since is refused by its
/// store, never read through another version's index. A shard with
/// damage is indexed by each process (its damage is not in the file).
/// `Ok(None)`: another process is indexing it and `wait` is false.
fn scan_shared(path: &Path, opts: &WebDatasetOptions, wait: bool) -> Result<Option<Scanned>> {
    use crate::storage::NodeFile;
    if !crate::storage::is_url(path) {
        return scan(path, opts).map(Some);
    }
    let (blob, len) = Blob::open(path)?;
    let Some(tag) = blob.version() else {
        return scan_blob(path, blob, len, opts).map(Some);
    };
    let (blob, len) = Blob::open_listed(path, len, Some(&tag))?;
    let key = format!(
        "{}#{len}#{tag}#wickidx#{:?}",
        path.display(),
        indexed_with(opts)
    );
    match crate::storage::node_file(&key, wait)? {
        NodeFile::Busy if !wait => Ok(None),
        NodeFile::Ready(backing) => match ShardIndex::parse(backing, len) {
            Ok(index) => Ok(Some(Scanned {
                blob,
                len,
                index,
                damage: Vec::new(),
            })),
            // Not a whole index of this shard: indexed here.
            Err(_) => scan_blob(path, blob, len, opts).map(Some),
        },
        NodeFile::Mine(lock) => {
            let s = scan_blob(path, blob, len, opts)?;
            if s.damage.is_empty() {
                crate::storage::node_publish(&key, s.index.as_bytes())?;
            }
            drop(lock);
            Ok(Some(s))
        }
        NodeFile::Busy | NodeFile::Alone => scan_blob(path, blob, len, opts).map(Some),
    }
}

/// An error when shard `path`'s mapped index file was cut short while
/// mapped (what was read from it since is zeros, not the index).
fn intact(path: &Path, index: &ShardIndex) -> Result<()> {
    if !index.damaged() {
        return Ok(());
    }
    let what = "the index file was cut short while it was mapped: run `wick index` again";
    Err(shard_error(&sidecar_path(path), 0, what))
}

/// Says once a process, on standard error, how to open `paths` (shards
/// being indexed by reading them) without reading them.
fn hint(paths: &[PathBuf]) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let dir = manifest::split(&paths[0]).0;
    eprintln!(
        "wick: indexing {} WebDataset shard(s) by reading their tar headers; `wick index {}` \
         writes a manifest and per-shard indexes once, and opening then reads no shard",
        paths.len(),
        crate::error::redact(&dir.to_string_lossy())
    );
}

/// Shard `path`'s file and index from what `manifest` lists of it: the
/// shard must have the size (and version) it had when it was indexed,
/// and its index file the size and checksum the manifest gives
/// ([`manifest::open_listed`], [`manifest::map_sidecar`]).
fn load_listed(path: &Path, manifest: &Path, listed: &Listed) -> Result<Opened> {
    let (blob, len) = manifest::open_listed(path, manifest, listed)?;
    let sidecar = sidecar_path(path);
    let backing = manifest::map_sidecar(&sidecar, manifest, listed, ShardIndex::checksum)?;
    let index = ShardIndex::parse(backing, len).map_err(|c| shard_error(&sidecar, 0, c))?;
    if index.len() as u64 != listed.records {
        let what = format!(
            "the index holds {} samples, not the {} the manifest lists",
            index.len(),
            listed.records
        );
        return Err(manifest::changed(&sidecar, manifest, &what));
    }
    Ok(Opened { blob, index })
}

/// Reads the tar headers of one shard and groups its members into samples.
fn index_shard<R: Read + std::io::Seek>(
    path: &Path,
    file: R,
    file_len: u64,
    opts: &WebDatasetOptions,
    set: &mut ShardSet,
) -> Result<ShardIndex> {
    let mut out = IndexBuilder::default();
    let mut archive = tar::Archive::new(file);
    let mut next_header = 0u64;
    let mut pending: Option<Pending> = None;
    // Raw: GNU long-name and PAX members come to this loop, which bounds
    // their size, instead of being read whole inside the tar crate.
    let entries = archive
        .entries_with_seek()
        .map_err(|e| shard_error(path, 0, Cause::new("not a tar archive", e)))?
        .raw(true);
    let mut damage: Option<(u64, Cause)> = None;
    // What extension members said about the next member.
    let (mut long_name, mut pax_path, mut pax_size) = (None, None, None);
    let io_or = |e: std::io::Error, at: u64, what: String| match os_error(&e) {
        true => Error::Io {
            path: path.to_path_buf(),
            source: e,
        },
        false => shard_error(path, at, Cause::new(what, e)),
    };
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            // The disk failed, not the shard: an error, never damage that
            // `skip_damaged` would turn into a shorter shard on this rank.
            Err(e) if os_error(&e) => {
                return Err(Error::Io {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
            Err(e) => {
                damage = Some((next_header, Cause::new("bad tar header", e)));
                break;
            }
        };
        let header_at = entry.raw_header_position();
        let (start, size) = (entry.raw_file_position(), entry.size());
        if start + size > file_len {
            damage = Some((
                header_at,
                format!("member of {size} bytes runs past the end of the file").into(),
            ));
            break;
        }
        next_header = start + size.div_ceil(512) * 512;
        let kind = entry.header().entry_type();
        let long = kind.is_gnu_longname() || kind.is_gnu_longlink();
        if long || kind.is_pax_local_extensions() || kind.is_pax_global_extensions() {
            if size > MAX_EXTENSION_BYTES {
                return Err(shard_error(
                    path,
                    header_at,
                    format!("tar extension member of {size} bytes is over the 64 KiB limit"),
                ));
            }
            let mut data = Vec::with_capacity(size as usize);
            entry
                .read_to_end(&mut data)
                .map_err(|e| io_or(e, start, "cannot read a tar extension member".into()))?;
            if kind.is_gnu_longname() {
                while data.last() == Some(&0) {
                    data.pop();
                }
                long_name = Some(data);
            } else if kind.is_pax_local_extensions() {
                for ext in tar::PaxExtensions::new(&data).flatten() {
                    match ext.key_bytes() {
                        b"path" => pax_path = Some(ext.value_bytes().to_vec()),
                        b"size" => pax_size = Some(ext.value_bytes().to_vec()),
                        _ => {}
                    }
                }
            }
            continue;
        }
        // The extensions describe this member; a PAX size other than the
        // header's would move every later header, which raw reading cannot
        // follow (members that big are over the image limit anyway).
        let name_bytes = long_name.take().or(pax_path.take());
        if let Some(claim) = pax_size.take() {
            if std::str::from_utf8(&claim)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                != Some(size)
            {
                damage = Some((
                    header_at,
                    format!(
                        "PAX size {:?} disagrees with the header's {size}",
                        String::from_utf8_lossy(&claim)
                    )
                    .into(),
                ));
                break;
            }
        }
        if !kind.is_file() {
            continue;
        }
        let name = match name_bytes {
            Some(b) => String::from_utf8_lossy(&b).into_owned(),
            None => match entry.path() {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(e) => {
                    damage = Some((header_at, Cause::new("bad member name", e)));
                    break;
                }
            },
        };
        let Some((key, ext)) = split_key(&name) else {
            continue; // no extension: not part of a sample, as in WebDataset
        };
        let ext = ext.to_ascii_lowercase();
        if pending.as_ref().is_none_or(|p| p.key != key) {
            if let Some(done) = pending.take() {
                finish(path, done, opts, &mut out)?;
            }
            pending = Some(Pending {
                key: key.to_string(),
                offset: header_at,
                ..Pending::default()
            });
        }
        let p = pending.as_mut().expect("set above");
        if size <= MAX_IMAGE_BYTES {
            p.members.push(Member {
                ext: out.ext_id(&ext),
                offset: start,
                len: size,
            });
        }
        if let Some(rank) = opts.image_exts.iter().position(|x| *x == ext) {
            if size > MAX_IMAGE_BYTES {
                return Err(shard_error(
                    path,
                    header_at,
                    format!("image member of {size} bytes is over the limit"),
                ));
            }
            if p.image.is_none_or(|(_, _, r)| rank < r) {
                p.image = Some((start, size, rank));
            }
        } else if opts.label_ext.as_deref() == Some(ext.as_str()) {
            if size > MAX_LABEL_BYTES {
                return Err(shard_error(
                    path,
                    header_at,
                    format!("label member of {size} bytes is over the limit"),
                ));
            }
            let mut text = String::new();
            entry
                .read_to_string(&mut text)
                .map_err(|e| io_or(e, start, format!("cannot read label {name:?}")))?;
            let label = parse_label(&text, &ext, &opts.json_label_field).map_err(|c| {
                let reason = format!("label {name:?}: {}", c.reason);
                shard_error(path, header_at, Cause { reason, ..c })
            })?;
            p.label = Some(label);
        }
    }
    if let Some((offset, reason)) = damage {
        set.damaged(&opts.shard, path, offset, reason)?;
        // The sample in progress is kept if it has what a sample needs;
        // otherwise it lost members to the damage and goes with it.
        if let Some(p) =
            pending.filter(|p| p.image.is_some() && (p.label.is_some() || opts.label_ext.is_none()))
        {
            finish(path, p, opts, &mut out)?;
        }
    } else if let Some(done) = pending.take() {
        finish(path, done, opts, &mut out)?;
    }
    out.finish(file_len).map_err(|c| shard_error(path, 0, c))
}

/// Whether a tar error comes from the operating system (a failing disk or
/// network file system) rather than from the archive's bytes: the tar
/// crate reports format errors as `ErrorKind::Other` messages of its own,
/// and passes the reader's errors on, possibly wrapped.
fn os_error(e: &std::io::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        // A local disk's error, or a failed request to object storage.
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error().is_some())
            || matches!(
                err.downcast_ref::<Error>(),
                Some(Error::Io { .. } | Error::Remote { .. })
            )
        {
            return true;
        }
        cur = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as _),
            None => err.source(),
        };
    }
    false
}

fn finish(path: &Path, p: Pending, opts: &WebDatasetOptions, out: &mut IndexBuilder) -> Result<()> {
    let Some((offset, len, _)) = p.image else {
        return Err(shard_error(
            path,
            p.offset,
            format!(
                "sample {:?} has no image member ({})",
                p.key,
                opts.image_exts.join("/")
            ),
        ));
    };
    let label = match (&opts.label_ext, p.label) {
        (None, _) => 0,
        (Some(_), Some(l)) => l,
        (Some(ext), None) => {
            return Err(shard_error(
                path,
                p.offset,
                format!("sample {:?} has no .{ext} label", p.key),
            ))
        }
    };
    out.push(&p.key, (offset, len), label, &p.members)
        .map_err(|c| shard_error(path, p.offset, c))
}

/// A label member's class index.
fn parse_label(text: &str, ext: &str, json_field: &str) -> Result<u32, Cause> {
    if ext.ends_with("json") {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Cause::new("not JSON", e))?;
        let l = v
            .get(json_field)
            .ok_or_else(|| format!("no field {json_field:?}"))?;
        Ok(l.as_u64()
            .and_then(|l| u32::try_from(l).ok())
            .ok_or_else(|| format!("field {json_field:?} is {l}, not a class index"))?)
    } else {
        Ok(text
            .trim()
            .parse()
            .map_err(|_| format!("{:?} is not a class index", text.trim()))?)
    }
}

/// WebDataset shards in the format table; without labels when surveyed.
pub(crate) const FORMAT: Format = Format {
    companions: &[SIDECAR_SUFFIX],
    lenient: Some((
        |paths| {
            let opts = WebDatasetOptions {
                label_ext: None,
                ..Default::default()
            };
            Ok(Box::new(WebDataset::open_with(paths, opts)?))
        },
        "labels",
    )),
    ..Format::shards(
        DatasetKind::WebDataset,
        "WebDataset shards (.tar)",
        &[".tar"],
        |paths| Ok(Box::new(WebDataset::open(paths)?)),
    )
};

impl Source for WebDataset {
    fn len(&self) -> usize {
        self.set.len()
    }

    reads_through!(read_reusing);

    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let mut record = self.read_reusing(index, bytes)?;
        if *parts == Parts::Default {
            return Ok(record);
        }
        let (s, n) = self.set.locate(index)?;
        let (path, o) = (&self.shards[s].path, self.opened(s)?);
        for (ext, offset, len) in o.index.members(n) {
            if !parts.wants(ext) {
                continue;
            }
            let mut data = vec![0; len as usize];
            o.blob.read_exact_at(path, offset, &mut data)?;
            record.parts.push((ext.to_string(), Value::Bytes(data)));
        }
        intact(path, &o.index)?;
        Ok(record)
    }

    fn read_reusing(&self, index: usize, mut bytes: Vec<u8>) -> Result<Record> {
        let (s, n) = self.set.locate(index)?;
        let (path, o) = (&self.shards[s].path, self.opened(s)?);
        let (offset, len) = o.index.image(n);
        let (label, key) = (o.index.label(n), self.shards[s].key(n));
        intact(path, &o.index)?;
        bytes.clear();
        bytes.resize(len as usize, 0);
        o.blob.read_exact_at(path, offset, &mut bytes)?;
        if bytes.is_empty() {
            return Err(Error::EmptyFile { key });
        }
        Ok(Record::encoded(key, bytes, label))
    }

    /// `<shard>:<key>` ([`Shard::key`]).
    fn key(&self, index: usize) -> String {
        let Ok((s, n)) = self.set.locate(index) else {
            return format!("#{index}");
        };
        self.shards[s].key(n)
    }

    fn shards(&self) -> &[ShardInfo] {
        &self.set.infos
    }

    fn damage(&self) -> &[Damage] {
        &self.set.damage
    }
}

#[cfg(test)]
#[path = "webdataset_tests.rs"]
mod tests;
