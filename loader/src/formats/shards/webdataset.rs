//! WebDataset tar shards: the files of a sample share a key (the path up to
//! the first dot of the file name: `0001.jpg` + `0001.cls`) and follow one
//! another in the archive.

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

#[derive(Debug)]
struct Sample {
    key: String,
    offset: u64,
    len: u64,
    label: u32,
    /// Its members, a range of the shard's [`Members`].
    members: std::ops::Range<u32>,
}

/// One member of a sample: the extension (an index into the dataset's
/// table of extensions), where its bytes are and how many.
#[derive(Debug, Clone, Copy)]
struct Member {
    ext: u32,
    offset: u64,
    len: u64,
}

/// The members of one shard's samples, in order, and the extensions seen.
#[derive(Debug, Default)]
struct Members {
    members: Vec<Member>,
}

/// A dataset of WebDataset tar shards, read at random through an index of
/// the tar headers built when it is opened.
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
    files: Vec<(PathBuf, Blob)>,
    /// Samples of each shard.
    samples: Vec<Vec<Sample>>,
    /// Members of each shard's samples.
    members: Vec<Members>,
    /// Every member extension seen (lower case), by index.
    exts: Vec<String>,
    set: ShardSet,
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

    /// Opens shards (in the order given) and indexes their samples.
    pub fn open_with(
        paths: impl IntoIterator<Item = impl AsRef<Path>>,
        opts: WebDatasetOptions,
    ) -> Result<Self> {
        let mut set = ShardSet::default();
        let (mut files, mut samples, mut members) = (Vec::new(), Vec::new(), Vec::new());
        let mut exts: Vec<String> = Vec::new();
        let paths = super::owned(paths);
        // Each shard indexed on its own (at once when remote), with its own
        // extensions and damage, merged in order below.
        let opened = super::open_each(&paths, |path| {
            let (file, len) = Blob::open(path)?;
            let (mut m, mut own_exts, mut own) =
                (Members::default(), Vec::new(), ShardSet::default());
            let reader = file.reader(path, len);
            let shard = index_shard(path, reader, len, &opts, &mut own, (&mut m, &mut own_exts))?;
            Ok((file, shard, m, own_exts, own.damage))
        });
        for (path, opened) in paths.iter().zip(opened) {
            let (file, shard, mut m, own_exts, damage) = opened?;
            let ids: Vec<u32> = own_exts
                .into_iter()
                .map(|e| match exts.iter().position(|x| *x == e) {
                    Some(i) => i as u32,
                    None => {
                        exts.push(e);
                        exts.len() as u32 - 1
                    }
                })
                .collect();
            for member in &mut m.members {
                member.ext = ids[member.ext as usize];
            }
            set.damage.extend(damage);
            set.push(path, shard.len());
            samples.push(shard);
            members.push(m);
            files.push((path.clone(), file));
        }
        Ok(Self {
            files,
            samples,
            members,
            exts,
            set,
        })
    }
}

/// Reads the tar headers of one shard and groups its members into samples.
fn index_shard<R: Read + std::io::Seek>(
    path: &Path,
    file: R,
    file_len: u64,
    opts: &WebDatasetOptions,
    set: &mut ShardSet,
    (members, exts): (&mut Members, &mut Vec<String>),
) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
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
                out.push(finish(path, done, opts, members)?);
            }
            pending = Some(Pending {
                key: key.to_string(),
                offset: header_at,
                ..Pending::default()
            });
        }
        let p = pending.as_mut().expect("set above");
        if size <= MAX_IMAGE_BYTES {
            let ext_id = match exts.iter().position(|e| *e == ext) {
                Some(i) => i,
                None => {
                    exts.push(ext.clone());
                    exts.len() - 1
                }
            };
            p.members.push(Member {
                ext: ext_id as u32,
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
            out.push(finish(path, p, opts, members)?);
        }
    } else if let Some(done) = pending.take() {
        out.push(finish(path, done, opts, members)?);
    }
    Ok(out)
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

fn finish(
    path: &Path,
    p: Pending,
    opts: &WebDatasetOptions,
    members: &mut Members,
) -> Result<Sample> {
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
    let first = members.members.len() as u32;
    members.members.extend_from_slice(&p.members);
    Ok(Sample {
        key: p.key,
        offset,
        len,
        label,
        members: first..members.members.len() as u32,
    })
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
        let (path, file) = &self.files[s];
        let sample = &self.samples[s][n];
        let range = sample.members.start as usize..sample.members.end as usize;
        for m in &self.members[s].members[range] {
            let ext = &self.exts[m.ext as usize];
            if !parts.wants(ext) {
                continue;
            }
            let mut data = vec![0; m.len as usize];
            file.read_exact_at(path, m.offset, &mut data)?;
            record.parts.push((ext.clone(), Value::Bytes(data)));
        }
        Ok(record)
    }

    fn read_reusing(&self, index: usize, mut bytes: Vec<u8>) -> Result<Record> {
        let (s, n) = self.set.locate(index)?;
        let (path, file) = &self.files[s];
        let sample = &self.samples[s][n];
        bytes.clear();
        bytes.resize(sample.len as usize, 0);
        file.read_exact_at(path, sample.offset, &mut bytes)?;
        if bytes.is_empty() {
            return Err(Error::EmptyFile {
                key: self.key(index),
            });
        }
        Ok(Record::encoded(self.key(index), bytes, sample.label))
    }

    fn key(&self, index: usize) -> String {
        match self.set.locate(index) {
            Ok((s, n)) => format!("{}:{}", self.files[s].0.display(), self.samples[s][n].key),
            Err(_) => format!("#{index}"),
        }
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
