//! safetensors shards, the pre-packed fast path (as FFCV's `.beton`):
//! the header parsed once on open, each sample one positioned read (no
//! parsing per sample).
//!
//! Two layouts, told apart by the tensor names:
//! - **pre-resized pixels**: `images` u8 `[N, H, W, 3]` and `labels` `[N]`:
//!   no decode at all;
//! - **encoded images**: `encoded` u8 `[B]` (the JPEG/PNG files one after
//!   another), `offsets` i64 `[N + 1]` (sample `i` is
//!   `encoded[offsets[i]..offsets[i + 1]]`) and `labels` `[N]`.
//!
//! Labels may be any integer dtype; they are checked on open.

use super::manifest::{self, IndexedWith, Lazy, Listed};
use super::ShardSet;
use crate::contract::{reads_through, Damage, Parts, Record, ShardInfo, Source, Value};
use crate::error::{shard_error, Cause};
use crate::error::{Error, Result};
use crate::formats::{DatasetKind, Format};
use crate::geometry::Size;
use crate::storage::Blob;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use std::path::{Path, PathBuf};

/// The largest header the safetensors crate accepts (its own limit).
const MAX_HEADER: u64 = 100_000_000;

#[derive(Debug)]
enum HostLayout {
    /// `images [N, H, W, 3]`: pixel data starts at `start`.
    Pixels {
        start: usize,
        height: usize,
        width: usize,
    },
    /// `encoded` at `start`, sample bounds from `offsets`.
    Encoded {
        start: usize,
        bounds: Vec<(usize, usize)>,
    },
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    /// Its header read: at open, or, for a shard a manifest lists, when a
    /// sample of it is first read.
    opened: Lazy<Opened>,
}

/// A shard, open, its header read and its labels (and sample bounds)
/// loaded.
#[derive(Debug)]
struct Opened {
    file: Blob,
    layout: HostLayout,
    labels: Vec<u32>,
    /// Every tensor with a row per sample (`[N, ..]`), as named parts.
    rows: Vec<Rows>,
}

/// The manifest's name for the format.
pub(crate) const MANIFEST_FORMAT: &str = "safetensors";

/// A tensor of one row per sample: sample `n`'s row is the file's bytes
/// `start + n * row_bytes..` (`row_bytes` of them).
#[derive(Debug)]
struct Rows {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    start: usize,
    row_bytes: usize,
}

/// A dataset of safetensors shards; see the module docs for the layouts.
///
/// Samples are read from the shard files with positioned reads (not a
/// memory map), so a shard truncated or rewritten while the source is open
/// gives an error naming the file and offset for each sample past the
/// damage, never a crash (`SIGBUS`) or bytes changing under a reader.
///
/// ```no_run
/// use candle_wick::source::SafetensorsShards;
/// use candle_wick::Loader;
/// # fn main() -> candle_wick::Result<()> {
/// let train = SafetensorsShards::open(["train-0000.safetensors"])?;
/// let loader = Loader::builder(train).batch_size(256).train_transforms().build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SafetensorsShards {
    shards: Vec<Shard>,
    set: ShardSet,
}

/// The values of an integer tensor as i64.
fn ints(data: &[u8], info: &TensorInfo) -> Option<Vec<i64>> {
    macro_rules! conv {
        ($t:ty) => {
            data.chunks_exact(std::mem::size_of::<$t>())
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk size")) as i64)
                .collect()
        };
    }
    Some(match info.dtype {
        Dtype::I64 => conv!(i64),
        Dtype::I32 => conv!(i32),
        Dtype::I16 => conv!(i16),
        Dtype::I8 => conv!(i8),
        Dtype::U32 => conv!(u32),
        Dtype::U16 => conv!(u16),
        Dtype::U8 => conv!(u8),
        Dtype::U64 => data
            .chunks_exact(8)
            .map(|c| {
                i64::try_from(u64::from_le_bytes(c.try_into().expect("8 bytes"))).unwrap_or(-1)
            })
            .collect(),
        _ => return None,
    })
}

impl SafetensorsShards {
    /// Opens shards (in the order given) and checks their headers. A
    /// shard that a manifest in its folder lists (`wick index`, `wick
    /// convert`) is not read until a sample of it is (then its header and
    /// labels, the shard checked to have its listed size, version and
    /// count); the others' headers are read now (each local shard on a
    /// core of its own, 16 remote ones at once).
    pub fn open(paths: impl IntoIterator<Item = impl AsRef<Path>>) -> Result<Self> {
        let mut set = ShardSet::default();
        let mut shards = Vec::new();
        let paths = super::owned(paths);
        let listed = manifest::lookup(&paths, MANIFEST_FORMAT, &IndexedWith::default())?;
        let unlisted = manifest::unlisted(&paths, &listed);
        let mut opened = super::open_each(&unlisted, open_one).into_iter();
        for (path, listed) in paths.into_iter().zip(listed) {
            let loaded = match &listed {
                Some((_, l)) => {
                    set.push_listed(&Default::default(), &path, l)?;
                    None
                }
                None => {
                    let o = opened.next().expect("one open a shard no manifest lists")?;
                    set.push(&path, o.labels.len());
                    Some(o)
                }
            };
            shards.push(Shard {
                path,
                opened: Lazy::new(loaded, listed),
            });
        }
        Ok(Self { shards, set })
    }

    /// Shard `s`, its header read (on its first read, for a shard a
    /// manifest lists).
    fn opened(&self, s: usize) -> Result<&Opened> {
        let shard = &self.shards[s];
        shard
            .opened
            .load(|manifest, listed| load_listed(&shard.path, manifest, listed))
    }
}

/// What the manifest lists of shard `path`: its name, size, version and
/// samples (its header is its index: no index file).
pub(crate) fn listed(path: &Path) -> Result<Listed> {
    let (file, len) = Blob::open(path)?;
    let o = read_header(path, file, len)?;
    Ok(Listed {
        name: manifest::split(path).1,
        size: len,
        version: o.file.version(),
        records: o.labels.len() as u64,
        index_bytes: 0,
        index_crc: 0,
        damage: Vec::new(),
        row_groups: Vec::new(),
    })
}

/// Shard `path` as `manifest` lists it: opened with its listed size and
/// version (no request for a remote one), its header read, and its
/// samples checked to be the listed count.
fn load_listed(path: &Path, manifest: &Path, listed: &Listed) -> Result<Opened> {
    let (file, len) = manifest::open_listed(path, manifest, listed)?;
    let o = read_header(path, file, len)?;
    if o.labels.len() as u64 != listed.records {
        let what = format!(
            "the shard holds {} samples, not the {} the manifest lists",
            o.labels.len(),
            listed.records
        );
        return Err(manifest::changed(path, manifest, &what));
    }
    Ok(o)
}

/// Opens one shard: its header read and checked ([`read_header`]).
fn open_one(path: &Path) -> Result<Opened> {
    let (file, len) = Blob::open(path)?;
    read_header(path, file, len)
}

/// Reads shard `path`'s header (`file`, of `len` bytes) and checks it
/// against the file's length (as `SafeTensors::read_metadata` does over a
/// whole file), then only the label (and offset) tensors.
fn read_header(path: &Path, file: Blob, len: u64) -> Result<Opened> {
    let bad = |offset: u64, reason: String| shard_error(path, offset, reason);
    let mut n = [0; 8];
    if len < 8 {
        return Err(bad(
            0,
            format!("{len} bytes: too short for a safetensors header"),
        ));
    }
    file.read_exact_at(path, 0, &mut n)?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || 8 + n > len {
        return Err(bad(
            0,
            format!("the header declares {n} bytes; the file has {len} (at most 100 MB)"),
        ));
    }
    let mut header = vec![0; n as usize];
    file.read_exact_at(path, 8, &mut header)?;
    let meta: Metadata = serde_json::from_slice(&header)
        .map_err(|e| shard_error(path, 8, Cause::new("bad safetensors header", e)))?;
    let data_start = 8 + n;
    let data_end = data_start + meta.data_len() as u64;
    if data_end != len {
        return Err(bad(
            data_start,
            format!("the header's tensors end at byte {data_end}; the file has {len}"),
        ));
    }
    let read = |info: &TensorInfo| -> Result<Vec<u8>> {
        let (s, e) = info.data_offsets;
        let mut data = vec![0; e - s];
        file.read_exact_at(path, data_start + s as u64, &mut data)?;
        Ok(data)
    };
    let (layout, labels) = layout_of(path, &meta, data_start as usize, &read)?;
    let rows = rows_of(&meta, labels.len(), data_start as usize);
    Ok(Opened {
        file,
        layout,
        labels,
        rows,
    })
}

/// The shard's layout and labels, from its header; `read` gives a
/// tensor's bytes.
fn layout_of(
    path: &Path,
    meta: &Metadata,
    data_start: usize,
    read: &dyn Fn(&TensorInfo) -> Result<Vec<u8>>,
) -> Result<(HostLayout, Vec<u32>)> {
    let bad = |reason: String| shard_error(path, 0, reason);
    let tensor = |name: &str| meta.info(name);
    let linfo = tensor("labels").ok_or_else(|| bad("no `labels` tensor".into()))?;
    let raw = ints(&read(linfo)?, linfo).ok_or_else(|| {
        bad(format!(
            "`labels` has dtype {:?}, not an integer",
            linfo.dtype
        ))
    })?;
    if linfo.shape.len() != 1 {
        return Err(bad(format!(
            "`labels` has shape {:?}, not [N]",
            linfo.shape
        )));
    }
    let labels = raw
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            u32::try_from(l)
                .map_err(|_| bad(format!("label {l} of sample {i} is not a class index")))
        })
        .collect::<Result<Vec<u32>>>()?;
    let count = labels.len();
    let layout = if let Some(info) = tensor("images") {
        match (info.dtype, info.shape.as_slice()) {
            (Dtype::U8, &[n, h, w, 3]) if n == count && h > 0 && w > 0 => HostLayout::Pixels {
                start: data_start + info.data_offsets.0,
                height: h,
                width: w,
            },
            (d, s) => {
                return Err(bad(format!(
                    "`images` is {d:?} {s:?}; expected U8 [{count}, H, W, 3] to match `labels`"
                )))
            }
        }
    } else if let Some(info) = tensor("encoded") {
        if info.dtype != Dtype::U8 || info.shape.len() != 1 {
            return Err(bad(format!(
                "`encoded` is {:?} {:?}, expected U8 [B]",
                info.dtype, info.shape
            )));
        }
        let total = info.shape[0];
        let oinfo = tensor("offsets").ok_or_else(|| bad("`encoded` without `offsets`".into()))?;
        let offsets = ints(&read(oinfo)?, oinfo)
            .filter(|_| oinfo.shape == [count + 1])
            .ok_or_else(|| {
                bad(format!(
                    "`offsets` is {:?} {:?}, expected I64 [{}]",
                    oinfo.dtype,
                    oinfo.shape,
                    count + 1
                ))
            })?;
        let mut bounds = Vec::with_capacity(count);
        for (i, w) in offsets.windows(2).enumerate() {
            let ok = w[0] >= 0 && w[0] <= w[1] && w[1] as u64 <= total as u64;
            if !ok || (i == 0 && w[0] != 0) {
                return Err(bad(format!(
                    "`offsets` [{i}..{}] = {}..{} is not a range inside `encoded` ({total} bytes)",
                    i + 1,
                    w[0],
                    w[1]
                )));
            }
            bounds.push((w[0] as usize, w[1] as usize));
        }
        HostLayout::Encoded {
            start: data_start + info.data_offsets.0,
            bounds,
        }
    } else {
        return Err(bad("neither `images` nor `encoded` tensor".into()));
    };
    Ok((layout, labels))
}

/// Every tensor with a row per sample (`[count, ..]`), by name.
fn rows_of(meta: &Metadata, count: usize, data_start: usize) -> Vec<Rows> {
    let mut rows: Vec<Rows> = meta
        .tensors()
        .into_iter()
        .filter(|(_, info)| info.shape.first() == Some(&count) && info.dtype.bitsize() % 8 == 0)
        .map(|(name, info)| {
            let row_elems: usize = info.shape[1..].iter().product();
            Rows {
                name,
                dtype: format!("{:?}", info.dtype),
                shape: info.shape[1..].to_vec(),
                start: data_start + info.data_offsets.0,
                row_bytes: row_elems * info.dtype.bitsize() / 8,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// Safetensors shards in the format table.
pub(crate) const FORMAT: Format = Format::shards(
    DatasetKind::Safetensors,
    "safetensors shards",
    &[".safetensors"],
    |paths| Ok(Box::new(SafetensorsShards::open(paths)?)),
);

impl Source for SafetensorsShards {
    fn len(&self) -> usize {
        self.set.len()
    }

    reads_through!(read_reusing);

    /// One positioned read of the sample's pixels or encoded bytes into
    /// `bytes` (reused).
    fn read_reusing(&self, index: usize, mut bytes: Vec<u8>) -> Result<Record> {
        let (s, n) = self.set.locate(index)?;
        let path = &self.shards[s].path;
        let shard = self.opened(s)?;
        let key = self.set.key(index);
        let label = shard.labels[n];
        let (at, size, rgb_size) = match &shard.layout {
            HostLayout::Pixels {
                start,
                height,
                width,
            } => {
                let size = height * width * 3;
                (start + n * size, size, Some(Size::new(*width, *height)))
            }
            HostLayout::Encoded { start, bounds } => {
                let (a, b) = bounds[n];
                if a == b {
                    return Err(Error::EmptyFile { key });
                }
                (start + a, b - a, None)
            }
        };
        bytes.clear();
        bytes.resize(size, 0);
        shard.file.read_exact_at(path, at as u64, &mut bytes)?;
        Ok(Record {
            rgb_size,
            ..Record::encoded(key, bytes, label)
        })
    }

    /// Every tensor with a row per sample (`[N, ..]`: `labels`, `images`
    /// and any other) gives sample `n`'s row as [`Value::Array`], named as
    /// the tensor.
    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let mut record = self.read_reusing(index, bytes)?;
        if *parts == Parts::Default {
            return Ok(record);
        }
        let (s, n) = self.set.locate(index)?;
        let path = &self.shards[s].path;
        let shard = self.opened(s)?;
        for r in shard.rows.iter().filter(|r| parts.wants(&r.name)) {
            let mut data = vec![0; r.row_bytes];
            let at = r.start + n * r.row_bytes;
            shard.file.read_exact_at(path, at as u64, &mut data)?;
            let value = Value::Array {
                dtype: r.dtype.clone(),
                shape: r.shape.clone(),
                data,
            };
            record.parts.push((r.name.clone(), value));
        }
        Ok(record)
    }

    fn key(&self, index: usize) -> String {
        self.set.key(index)
    }

    fn shards(&self) -> &[ShardInfo] {
        &self.set.infos
    }

    fn damage(&self) -> &[Damage] {
        &self.set.damage
    }
}
