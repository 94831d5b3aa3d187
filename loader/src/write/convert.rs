//! `wick convert`: any source to TFRecord, WebDataset tar or safetensors
//! shards, optionally pre-resized (FFCV's `max_resolution`).

use super::{SafetensorsWriter, ShardSample, ShardWriter, TfRecordWriter, WebDatasetWriter};
use crate::contract::Source;
use crate::decode::decode_rgb_into;
use crate::error::{Error, Result};
use crate::formats::{format, DatasetKind};
use crate::geometry::Size;
use crate::layout::{HostLayout, Slot};
use crate::transform::resize::{Crop, Resampler, View};
use crate::transform::{ImageTransform, Transforms};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// The shard format [`convert`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardFormat {
    /// `<prefix>-00000-of-0000N.tfrecord`: `tf.train.Example`s with
    /// `image/encoded` and `image/class/label`.
    TfRecord,
    /// `<prefix>-000000.tar`: `<key>.<ext>` + `<key>.cls` per sample.
    WebDataset,
    /// `<prefix>-00000.safetensors` with `encoded`, `offsets`, `labels`.
    SafetensorsEncoded,
    /// `<prefix>-00000.safetensors` with `images` u8 `[N, size, size, 3]`:
    /// the shorter side resized to `size`, the centre square kept.
    SafetensorsPixels {
        /// Side of the stored square images.
        size: usize,
    },
    /// Parquet in the Hugging Face Hub's layout
    /// (`data/{split}-NNNNN-of-NNNNN.parquet`: an `image` struct
    /// `{bytes, path}`, a `label` `ClassLabel`), row groups of `row_group`
    /// rows ([`ParquetWriter`](super::ParquetWriter)).
    #[cfg(feature = "parquet")]
    Parquet {
        /// Rows a row group.
        row_group: usize,
    },
}

/// Settings of [`convert`].
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Output format.
    pub format: ShardFormat,
    /// Records per shard. Default 1,000.
    pub shard_size: usize,
    /// Re-encode images whose longer side exceeds this, resized (bilinear,
    /// antialiased) to fit it, keeping the aspect ratio. Smaller images are
    /// copied byte for byte. `None` (default): every image copied.
    pub max_side: Option<usize>,
    /// JPEG quality of re-encoded images. Default 90.
    pub quality: u8,
    /// File name prefix of the shards. Default `"data"`.
    pub prefix: String,
    /// Threads preparing the records (0: all cores). Default 0.
    pub threads: usize,
    /// The split a Parquet conversion writes
    /// (`data/{split}-NNNNN-of-NNNNN.parquet`). Default `"train"`.
    pub split: String,
    /// Class names, written as a Parquet conversion's `ClassLabel`.
    /// Default `None`: plain integer labels.
    pub classes: Option<Vec<String>>,
    /// Replace the shards of an earlier conversion in the destination
    /// (deleted first). Default `false`: a destination holding shard
    /// files is an error naming them, since shards left from a larger
    /// conversion would join the new dataset.
    pub overwrite: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        Self {
            format: ShardFormat::TfRecord,
            shard_size: 1000,
            max_side: None,
            quality: 90,
            prefix: "data".into(),
            threads: 0,
            split: "train".into(),
            classes: None,
            overwrite: false,
        }
    }
}

/// One record ready to write: the payload, its file extension, the label.
struct Prepared {
    bytes: Vec<u8>,
    ext: &'static str,
    label: u32,
}

/// Writes `source` as shards in `dst` (created if missing) and returns
/// their paths. Records keep the source's order. `dst` may be a URL
/// (`s3://bucket/train/`, `gs://..`, `az://..`, `file://..`): each shard
/// is written to a temporary local folder, uploaded, and deleted there.
/// `progress` is called with the number of records written so far.
///
/// A destination that holds shard files already is an error unless
/// [`ConvertOptions::overwrite`] (then they are deleted first). A
/// conversion that fails deletes the shards it wrote (and aborts an
/// upload in parts), so no smaller dataset is left looking complete.
pub fn convert(
    source: &dyn Source,
    dst: &Path,
    opts: &ConvertOptions,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<PathBuf>> {
    if opts.shard_size == 0 {
        return Err(Error::InvalidConfig("shard_size must be at least 1".into()));
    }
    if opts.max_side == Some(0) {
        return Err(Error::InvalidConfig("max_side must be at least 1".into()));
    }
    // A URL (`s3://bucket/train/`): each shard is written to a temporary
    // local folder, uploaded (with its index) and deleted there.
    let remote = crate::storage::is_url(dst);
    let local = if remote {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::env::temp_dir().join(format!("wick-convert-{}-{nanos}", std::process::id()))
    } else {
        dst.to_path_buf()
    };
    clear_destination(dst, opts.overwrite)?;
    std::fs::create_dir_all(&local).map_err(|source| Error::Io {
        path: local.clone(),
        source,
    })?;
    let mut written: Vec<PathBuf> = Vec::new();
    // Every format's shards are indexed as they are written (each index
    // file goes where its shard goes; a safetensors or Parquet shard's
    // header or footer is its own), and the manifest written last, in the
    // shards' folder (a Parquet dataset's data/).
    let wds = crate::source::WebDatasetOptions::default();
    let index_one = |p: &Path| match opts.format {
        ShardFormat::TfRecord => super::index::index_tfrecord(p, &wds),
        ShardFormat::SafetensorsEncoded | ShardFormat::SafetensorsPixels { .. } => {
            crate::formats::shards::safetensors::listed(p)
        }
        #[cfg(feature = "parquet")]
        ShardFormat::Parquet { .. } => crate::formats::parquet::listed(p),
        _ => super::index::index_one(p, &wds),
    };
    let write_manifest = |shards: &[PathBuf], listed: Vec<_>| {
        let dir = shards.first().map_or_else(
            || dst.to_path_buf(),
            |s| crate::formats::shards::manifest::split(s).0,
        );
        super::index::write_manifest(&dir, opts.format.kind(), &wds, listed)
    };
    let mut listed = Vec::new();
    let companions = |p: &Path| {
        [
            crate::formats::shards::tfrecord::index_path(p),
            crate::formats::shards::webdataset::sidecar_path(p),
        ]
    };
    if !remote {
        let done = convert_into(source, &local, opts, progress, &mut |p| {
            written.push(p.to_path_buf());
            listed.push(index_one(p)?);
            Ok(p.to_path_buf())
        });
        let done = done.and_then(|paths| {
            write_manifest(&paths, std::mem::take(&mut listed))?;
            Ok(paths)
        });
        if done.is_err() {
            for p in &written {
                let _ = std::fs::remove_file(p);
                companions(p)
                    .iter()
                    .for_each(|c| drop(std::fs::remove_file(c)));
            }
        }
        return done;
    }
    let base = crate::storage::url_of(dst)
        .trim_end_matches('/')
        .to_string();
    let mut up = |shard: &Path| -> Result<PathBuf> {
        // The index beside its shard goes up too: a TFRecord's `.idx`,
        // a WebDataset's `.wickidx` (made here, from the local file).
        let mut entry = Some(index_one(shard)?);
        // Named by the path under the folder (a Parquet shard is in data/).
        let name = |file: &Path| {
            let rel = file.strip_prefix(&local).unwrap_or(file);
            let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
            parts.join("/")
        };
        let [idx, sidecar] = companions(shard);
        for file in [shard, &idx, &sidecar] {
            if file.exists() {
                let url = PathBuf::from(format!("{base}/{}", name(file)));
                crate::storage::upload(file, &url)?;
                written.push(url);
                let _ = std::fs::remove_file(file);
            }
        }
        let url = PathBuf::from(format!("{base}/{}", name(shard)));
        if let Some(mut entry) = entry.take() {
            // The uploaded object's version (one HEAD), which opening
            // checks.
            entry.version = crate::storage::Blob::open(&url)?.0.version();
            listed.push(entry);
        }
        Ok(url)
    };
    let uploaded = convert_into(source, &local, opts, progress, &mut up).and_then(|paths| {
        let manifest = write_manifest(&paths, std::mem::take(&mut listed))?;
        written.push(manifest.manifest);
        Ok(paths)
    });
    let _ = std::fs::remove_dir_all(&local);
    if uploaded.is_err() {
        for url in &written {
            let _ = crate::storage::delete(url);
        }
    }
    uploaded
}

impl ShardFormat {
    /// The kind of dataset this format's shards are.
    fn kind(self) -> DatasetKind {
        match self {
            ShardFormat::TfRecord => DatasetKind::TfRecord,
            ShardFormat::WebDataset => DatasetKind::WebDataset,
            ShardFormat::SafetensorsEncoded | ShardFormat::SafetensorsPixels { .. } => {
                DatasetKind::Safetensors
            }
            #[cfg(feature = "parquet")]
            ShardFormat::Parquet { .. } => DatasetKind::Parquet,
        }
    }
}

/// Whether `name` is a file a conversion writes: a shard of a format it
/// writes (any of its endings), the file beside one (a TFRecord index, a
/// WebDataset shard's), or a WebDataset's manifest.
fn is_shard(name: &str) -> bool {
    name.ends_with(crate::formats::shards::manifest::MANIFEST_NAME)
        || [
            DatasetKind::TfRecord,
            DatasetKind::WebDataset,
            DatasetKind::Safetensors,
            DatasetKind::Parquet,
        ]
        .iter()
        .map(|&k| format(k))
        .flat_map(|f| f.suffixes.iter().chain(f.companions))
        .any(|s| name.ends_with(s))
}

/// Refuses a destination that holds shard files (directly, or in its
/// `data/` folder as a Parquet conversion writes them), or deletes them
/// when `overwrite`.
fn clear_destination(dst: &Path, overwrite: bool) -> Result<()> {
    let mut found: Vec<PathBuf> = Vec::new();
    if crate::storage::is_url(dst) {
        let base = crate::storage::url_of(dst).trim_end_matches('/');
        let under = crate::storage::list_all(base, &[]).unwrap_or_default();
        for url in under {
            let rel = url
                .strip_prefix(base)
                .unwrap_or(&url)
                .trim_start_matches('/');
            let top =
                !rel.contains('/') || rel.strip_prefix("data/").is_some_and(|r| !r.contains('/'));
            if top && is_shard(rel) {
                found.push(PathBuf::from(url));
            }
        }
    } else {
        for dir in [dst.to_path_buf(), dst.join("data")] {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = entry.path();
                if p.is_file() && is_shard(&entry.file_name().to_string_lossy()) {
                    found.push(p);
                }
            }
        }
    }
    found.sort();
    if found.is_empty() {
        return Ok(());
    }
    if !overwrite {
        return Err(Error::Dataset {
            path: dst.to_path_buf(),
            reason: format!(
                "holds {} shard file(s) already (first {:?}): they would join the new \
                 dataset; convert into an empty destination, or overwrite (--overwrite) to \
                 delete them first",
                found.len(),
                crate::error::redact(&found[0].to_string_lossy())
            ),
            source: None,
        });
    }
    for p in &found {
        if crate::storage::is_url(p) {
            crate::storage::delete(p)?;
        } else {
            std::fs::remove_file(p).map_err(|source| Error::Io {
                path: p.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// [`convert`] into the local folder `dst`; `placed` is given each shard
/// written and returns where it ends up.
fn convert_into(
    source: &dyn Source,
    dst: &Path,
    opts: &ConvertOptions,
    progress: &(dyn Fn(usize) + Sync),
    placed: &mut dyn FnMut(&Path) -> Result<PathBuf>,
) -> Result<Vec<PathBuf>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .thread_name(|i| format!("wick-convert-{i}"))
        .build()
        .map_err(|e| Error::ThreadPool {
            source: Box::new(e),
        })?;
    let pixels = match opts.format {
        ShardFormat::SafetensorsPixels { size } => Some(ImageTransform::new(
            Transforms::ResizeCenterCrop { resize: size },
            HostLayout::U8Nhwc,
            Size::square(size),
            0,
        )?),
        _ => None,
    };
    let n = source.len();
    let shards = n.div_ceil(opts.shard_size);
    let mut paths = Vec::with_capacity(shards);
    let done = std::sync::atomic::AtomicUsize::new(0);
    for shard in 0..shards {
        let range = shard * opts.shard_size..((shard + 1) * opts.shard_size).min(n);
        let records: Vec<Prepared> = pool.install(|| {
            range
                .into_par_iter()
                .map(|i| {
                    let r = prepare(source, i, opts, pixels.as_ref());
                    progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
                    r
                })
                .collect::<Result<_>>()
        })?;
        let ext = format(opts.format.kind()).suffixes[0];
        let path = dst.join(match opts.format {
            ShardFormat::TfRecord => format!("{}-{shard:05}-of-{shards:05}{ext}", opts.prefix),
            ShardFormat::WebDataset => format!("{}-{shard:06}{ext}", opts.prefix),
            #[cfg(feature = "parquet")]
            ShardFormat::Parquet { .. } => {
                format!("data/{}-{shard:05}-of-{shards:05}{ext}", opts.split)
            }
            _ => format!("{}-{shard:05}{ext}", opts.prefix),
        });
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        write_shard(&path, opts, shard * opts.shard_size, &records)?;
        paths.push(placed(&path)?);
    }
    Ok(paths)
}

fn write_shard(
    path: &Path,
    opts: &ConvertOptions,
    first: usize,
    records: &[Prepared],
) -> Result<()> {
    match opts.format {
        #[cfg(feature = "parquet")]
        ShardFormat::Parquet { row_group } => fill(
            super::ParquetWriter::create(path, row_group, opts.classes.as_deref())?,
            first,
            records,
        ),
        ShardFormat::TfRecord => fill(TfRecordWriter::create(path)?, first, records),
        ShardFormat::WebDataset => fill(WebDatasetWriter::create(path)?, first, records),
        ShardFormat::SafetensorsPixels { size } => fill(
            SafetensorsWriter::create_pixels(path, size, size)?,
            first,
            records,
        ),
        ShardFormat::SafetensorsEncoded => {
            fill(SafetensorsWriter::create_encoded(path)?, first, records)
        }
    }
}

/// Writes `records` (source indices from `first` on, which name them) and
/// finishes the shard.
fn fill(mut w: impl ShardWriter, first: usize, records: &[Prepared]) -> Result<()> {
    for (i, r) in records.iter().enumerate() {
        w.write(ShardSample {
            key: &format!("{:09}", first + i),
            ext: r.ext,
            bytes: &r.bytes,
            label: r.label,
        })?;
    }
    w.finish()
}

/// The file extension of an encoded image, from its first bytes.
fn extension(bytes: &[u8]) -> &'static str {
    match image::guess_format(bytes) {
        Ok(image::ImageFormat::Png) => "png",
        Ok(image::ImageFormat::WebP) => "webp",
        Ok(image::ImageFormat::Bmp) => "bmp",
        _ => "jpg",
    }
}

fn prepare(
    source: &dyn Source,
    i: usize,
    opts: &ConvertOptions,
    pixels: Option<&ImageTransform>,
) -> Result<Prepared> {
    let rec = source.read(i)?;
    if let Some(t) = pixels {
        let mut out = vec![0; t.slot_len()];
        match rec.rgb_size {
            Some(wh) => t.apply_decoded(&rec.key, &rec.bytes, wh, 0, i, Slot::U8(&mut out))?,
            None => {
                t.apply(&rec.key, &rec.bytes, 0, i, Slot::U8(&mut out))?;
            }
        }
        return Ok(Prepared {
            bytes: out,
            ext: "rgb",
            label: rec.label,
        });
    }
    let (mut rgb, wh) = match rec.rgb_size {
        Some(wh) => (rec.bytes.clone(), Some(wh)),
        None => (Vec::new(), None),
    };
    let max = opts.max_side.unwrap_or(usize::MAX);
    let Size {
        width: w,
        height: h,
    } = match wh {
        Some(wh) => wh,
        None if opts.max_side.is_none() => {
            return Ok(Prepared {
                ext: extension(&rec.bytes),
                bytes: rec.bytes,
                label: rec.label,
            })
        }
        None => decode_rgb_into(&rec.key, &rec.bytes, &mut rgb)?,
    };
    if w.max(h) <= max && wh.is_none() {
        return Ok(Prepared {
            ext: extension(&rec.bytes),
            bytes: rec.bytes,
            label: rec.label,
        });
    }
    let s = (max as f64 / w.max(h) as f64).min(1.0);
    let (nw, nh) = (
        ((w as f64 * s).round() as usize).max(1),
        ((h as f64 * s).round() as usize).max(1),
    );
    let resized = if (nw, nh) == (w, h) {
        rgb.truncate(w * h * 3);
        rgb
    } else {
        resize(&rec.key, &rgb[..w * h * 3], (w, h), (nw, nh))?
    };
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, opts.quality)
        .encode(
            &resized,
            nw as u32,
            nh as u32,
            image::ExtendedColorType::Rgb8,
        )
        .map_err(|e| Error::Transform {
            key: rec.key.clone(),
            reason: "JPEG encoding failed".into(),
            source: Some(Box::new(e)),
        })?;
    Ok(Prepared {
        bytes: jpeg,
        ext: "jpg",
        label: rec.label,
    })
}

/// Resizes a whole `w x h` packed RGB8 image to `nw x nh`, antialiased
/// bilinear (the loader's resampler).
fn resize(
    key: &str,
    rgb: &[u8],
    (w, h): (usize, usize),
    (nw, nh): (usize, usize),
) -> Result<Vec<u8>> {
    let src = View::whole(rgb, w, h);
    if nw == 0 || nh == 0 || !src.fits() {
        return Err(Error::Transform {
            key: key.into(),
            reason: format!("cannot resize {} bytes as {w}x{h} to {nw}x{nh}", rgb.len()),
            source: None,
        });
    }
    let whole = Crop::whole(w, h);
    let mut out = vec![0; nw * nh * 3];
    Resampler::default().resize(&src, whole, (nw, nh), false, &mut out);
    Ok(out)
}
