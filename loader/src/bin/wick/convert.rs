//! `wick convert`: any dataset `wick bench` reads, written as TFRecord,
//! WebDataset tar, safetensors shards or Parquet in the Hugging Face Hub's
//! layout.

use candle_wick::source::{detect, DatasetKind, ImageFolder, Parquet};
use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use clap::ValueEnum;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub(crate) struct ConvertArgs {
    /// The dataset to read (any format `wick bench` reads).
    pub(crate) src: PathBuf,
    /// Folder for the shards (created if missing), or a URL to upload them
    /// to (`s3://bucket/train/`, `gs://..`, `az://..`, `file://..`).
    pub(crate) dst: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutFormat::Tfrecord)]
    pub(crate) format: OutFormat,
    /// Records per shard.
    #[arg(long, default_value_t = 1000)]
    pub(crate) shard_size: usize,
    /// Re-encode (JPEG) images whose longer side is over N, resized to N.
    #[arg(long)]
    pub(crate) max_side: Option<usize>,
    /// Side of the square images of `--format safetensors-pixels` (shorter
    /// side resized to it, centre square kept).
    #[arg(long, default_value_t = 256)]
    pub(crate) pixels_size: usize,
    /// JPEG quality of re-encoded images.
    #[arg(long, default_value_t = 90)]
    pub(crate) quality: u8,
    /// Shard file name prefix.
    #[arg(long, default_value = "data")]
    pub(crate) prefix: String,
    /// Threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
    /// Rows a Parquet row group (`--format parquet`; `datasets` writes
    /// image datasets in groups of 100).
    #[arg(long, default_value_t = 100)]
    pub(crate) row_group: usize,
    /// The split a Parquet conversion writes: `data/{split}-NNNNN-of-NNNNN.parquet`.
    #[arg(long, default_value = "train")]
    pub(crate) split: String,
    /// Delete the shards of an earlier conversion in the destination
    /// first (without it, a destination holding shards is an error).
    #[arg(long)]
    pub(crate) overwrite: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub(crate) enum OutFormat {
    /// TFRecord of tf.train.Example (image/encoded, image/class/label).
    Tfrecord,
    /// WebDataset tar (`<key>.jpg` + `<key>.cls`).
    Wds,
    /// safetensors: encoded images + offsets + labels.
    Safetensors,
    /// safetensors: pre-resized u8 pixels [N, S, S, 3] + labels.
    SafetensorsPixels,
    /// Parquet as the Hugging Face Hub stores it: `data/{split}-*.parquet`,
    /// an `image` struct {bytes, path} and a `label` ClassLabel.
    Parquet,
}

pub(crate) fn run_convert(a: &ConvertArgs) -> Result<(), Box<dyn std::error::Error>> {
    let found = detect(&a.src)?;
    let source = found.kind.open(&found.paths)?;
    let format = match a.format {
        OutFormat::Tfrecord => ShardFormat::TfRecord,
        OutFormat::Wds => ShardFormat::WebDataset,
        OutFormat::Safetensors => ShardFormat::SafetensorsEncoded,
        OutFormat::SafetensorsPixels => ShardFormat::SafetensorsPixels {
            size: a.pixels_size,
        },
        OutFormat::Parquet => ShardFormat::Parquet {
            row_group: a.row_group,
        },
    };
    // The class names, where the source has them: an image folder's
    // folders, a Parquet file's ClassLabel.
    let classes = match found.kind {
        DatasetKind::ImageFolder if !candle_wick::storage::is_url(&a.src) => {
            ImageFolder::new(&a.src).ok().map(|f| f.classes().to_vec())
        }
        DatasetKind::Parquet => Parquet::open(&found.paths)
            .ok()
            .and_then(|p| p.classes().map(<[String]>::to_vec)),
        _ => None,
    };
    let opts = ConvertOptions {
        format,
        shard_size: a.shard_size,
        max_side: a.max_side,
        quality: a.quality,
        prefix: a.prefix.clone(),
        threads: a.threads,
        split: a.split.clone(),
        classes,
        overwrite: a.overwrite,
    };
    let bar = indicatif::ProgressBar::new(source.len() as u64).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} records, {per_sec}, eta {eta}",
        )?,
    );
    let t = Instant::now();
    let paths = convert(source.as_ref(), &a.dst, &opts, &|n| {
        bar.set_position(n as u64)
    })?;
    bar.finish_and_clear();
    let bytes: u64 = paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    // Uploaded shards (a URL) have no local size to print.
    let size = if candle_wick::storage::is_url(&a.dst) {
        String::new()
    } else {
        format!(" ({:.1} MB)", bytes as f64 / 1e6)
    };
    println!(
        "wrote {} records in {} shards{size} to {} in {:.1?}",
        source.len(),
        paths.len(),
        a.dst.display(),
        t.elapsed()
    );
    Ok(())
}
