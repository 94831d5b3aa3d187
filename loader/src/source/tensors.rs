//! safetensors shards, the pre-packed fast path (as FFCV's `.beton`):
//! memory-mapped, read without parsing anything per sample.
//!
//! Two layouts, told apart by the tensor names:
//! - **pre-resized pixels**: `images` u8 `[N, H, W, 3]` and `labels` `[N]`:
//!   no decode at all;
//! - **encoded images**: `encoded` u8 `[B]` (the JPEG/PNG files one after
//!   another), `offsets` i64 `[N + 1]` (sample `i` is
//!   `encoded[offsets[i]..offsets[i + 1]]`) and `labels` `[N]`.
//!
//! Labels may be any integer dtype; they are checked on open.

use super::shards::{open_shard, shard_error, Cause, ShardSet};
use super::{Damage, Parts, Record, ShardInfo, Source, Value};
use crate::error::{Error, Result};
use crate::geometry::Size;
use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;
use std::path::Path;

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
    map: Mmap,
    layout: HostLayout,
    labels: Vec<u32>,
    /// Every tensor with a row per sample (`[N, ..]`), as named parts.
    rows: Vec<Rows>,
}

/// A tensor of one row per sample: sample `n`'s row is
/// `map[start + n * row_bytes..][..row_bytes]`.
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
/// The shard files are memory-mapped: they must not be modified or
/// truncated while the source is open. This is a contract on the files, not
/// something the loader can check: a process writing a mapped shard changes
/// bytes Rust code holds as `&[u8]` (undefined behaviour), and truncating it
/// makes the next read of the lost pages raise `SIGBUS`, which ends the
/// process. Write new shards under new names (or rename over old ones, which
/// keeps the mapped file intact) instead of rewriting them in place.
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
    /// Opens shards (in the order given) and checks their headers.
    pub fn open(paths: impl IntoIterator<Item = impl AsRef<Path>>) -> Result<Self> {
        let mut set = ShardSet::default();
        let mut shards = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let (file, _) = open_shard(path)?;
            // SAFETY: the map is read-only and every access below is
            // bounds-checked against its length. That is sound only while no
            // one writes or truncates the file, which this module cannot
            // enforce: a concurrent write is undefined behaviour (bytes
            // behind `&[u8]` change) and a truncation is SIGBUS on the next
            // read of a lost page. The type's docs state the contract; a
            // rename over the file keeps the mapping valid.
            let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let shard = open_shard_map(path, map)?;
            set.push(path, shard.labels.len());
            shards.push(shard);
        }
        Ok(Self { shards, set })
    }
}

fn open_shard_map(path: &Path, map: Mmap) -> Result<Shard> {
    let bad = |reason: String| shard_error(path, 0, reason);
    let (n, meta) = SafeTensors::read_metadata(&map)
        .map_err(|e| shard_error(path, 0, Cause::new("bad safetensors header", e)))?;
    let data_start = 8 + n;
    let tensor = |name: &str| -> Option<(&TensorInfo, &[u8])> {
        let info = meta.info(name)?;
        let (s, e) = info.data_offsets;
        Some((info, &map[data_start + s..data_start + e]))
    };
    let (linfo, ldata) = tensor("labels").ok_or_else(|| bad("no `labels` tensor".into()))?;
    let raw = ints(ldata, linfo).ok_or_else(|| {
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
    let layout = if let Some((info, _)) = tensor("images") {
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
    } else if let Some((info, _)) = tensor("encoded") {
        if info.dtype != Dtype::U8 || info.shape.len() != 1 {
            return Err(bad(format!(
                "`encoded` is {:?} {:?}, expected U8 [B]",
                info.dtype, info.shape
            )));
        }
        let total = info.shape[0];
        let (oinfo, odata) =
            tensor("offsets").ok_or_else(|| bad("`encoded` without `offsets`".into()))?;
        let offsets = ints(odata, oinfo)
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
    Ok(Shard {
        map,
        layout,
        labels,
        rows,
    })
}

impl Source for SafetensorsShards {
    fn len(&self) -> usize {
        self.set.len()
    }

    fn read(&self, index: usize) -> Result<Record> {
        let (s, n) = self.set.locate(index)?;
        let shard = &self.shards[s];
        let key = self.set.key(index);
        let label = shard.labels[n];
        Ok(match &shard.layout {
            HostLayout::Pixels {
                start,
                height,
                width,
            } => {
                let size = height * width * 3;
                let at = start + n * size;
                Record {
                    key,
                    bytes: shard.map[at..at + size].to_vec(),
                    label,
                    rgb_size: Some(Size::new(*width, *height)),
                    parts: Vec::new(),
                }
            }
            HostLayout::Encoded { start, bounds } => {
                let (a, b) = bounds[n];
                if a == b {
                    return Err(Error::EmptyFile { key });
                }
                Record::encoded(key, shard.map[start + a..start + b].to_vec(), label)
            }
        })
    }

    /// Every tensor with a row per sample (`[N, ..]`: `labels`, `images`
    /// and any other) gives sample `n`'s row as [`Value::Array`], named as
    /// the tensor.
    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        drop(bytes);
        let mut record = self.read(index)?;
        if *parts == Parts::Default {
            return Ok(record);
        }
        let (s, n) = self.set.locate(index)?;
        let shard = &self.shards[s];
        for r in shard.rows.iter().filter(|r| parts.wants(&r.name)) {
            let at = r.start + n * r.row_bytes;
            let data = shard.map[at..at + r.row_bytes].to_vec();
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
