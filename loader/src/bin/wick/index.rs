//! `wick index`: a WebDataset's or TFRecord dataset's manifest and
//! per-shard index files, written once beside its shards, so that opening
//! it reads no shard.

use candle_wick::source::{ShardOptions, WebDatasetOptions};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub(crate) struct IndexArgs {
    /// The WebDataset or TFRecord shards: a folder, URL prefix
    /// (`s3://bucket/laion/`), brace pattern or one shard.
    pub(crate) data: PathBuf,
    /// Extension of the label member (`cls`, `json`, ...), as the loader
    /// will open the shards with; `none` for shards without labels
    /// (WebDataset only).
    #[arg(long, default_value = "cls")]
    pub(crate) label_ext: String,
    /// The field of a JSON label member (WebDataset only).
    #[arg(long, default_value = "label")]
    pub(crate) json_label_field: String,
    /// Keep the records before damage in a shard (and list the damage in
    /// the manifest) instead of failing.
    #[arg(long)]
    pub(crate) skip_damaged: bool,
}

pub(crate) fn run(a: &IndexArgs) -> Result<(), Box<dyn std::error::Error>> {
    let opts = WebDatasetOptions {
        label_ext: (a.label_ext != "none").then(|| a.label_ext.clone()),
        json_label_field: a.json_label_field.clone(),
        shard: ShardOptions {
            skip_damaged: a.skip_damaged,
        },
        ..WebDatasetOptions::default()
    };
    let t = Instant::now();
    let done = candle_wick::write::index(&a.data, &opts)?;
    let per_sample = done.index_bytes as f64 / done.records.max(1) as f64;
    let reused = match done.reused {
        0 => String::new(),
        n => format!("; {n} unchanged since the last index, kept"),
    };
    println!(
        "indexed {} shards ({} samples): {} read ({:.1} MB of shards){reused}, in {:.1?}; \
         {:.1} MB of index files ({per_sample:.0} B a sample); manifest {}",
        done.shards,
        done.records,
        done.shards - done.reused,
        done.shard_bytes as f64 / 1e6,
        t.elapsed(),
        done.index_bytes as f64 / 1e6,
        done.manifest.display()
    );
    Ok(())
}
