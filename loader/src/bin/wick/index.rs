//! `wick index`: a WebDataset's, TFRecord, safetensors or Parquet
//! dataset's manifest and per-shard index files, written once beside its shards
//! (split across machines with `--part`), so that opening it reads no
//! shard.

use candle_wick::source::{ShardOptions, WebDatasetOptions};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub(crate) struct IndexArgs {
    /// The WebDataset, TFRecord or safetensors shards or Parquet files: a
    /// folder, URL prefix (`s3://bucket/laion/`), brace pattern or one
    /// shard.
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
    /// Index part K of N only (`3/16`: every 16th shard from the 4th),
    /// writing a part manifest: run each part on its own machine, then
    /// `wick index DATA` without `--part` on one to write the manifest
    /// (it reads no shard a part listed).
    #[arg(long, value_name = "K/N", value_parser = parse_part)]
    pub(crate) part: Option<(usize, usize)>,
}

fn parse_part(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?}: a part is K/N, 0 <= K < N (3/16)");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n): (usize, usize) = (k.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if k >= n {
        return Err(bad());
    }
    Ok((k, n))
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
    let done = match a.part {
        Some((k, n)) => candle_wick::write::index_part(&a.data, &opts, k, n)?,
        None => candle_wick::write::index(&a.data, &opts)?,
    };
    let per_sample = done.index_bytes as f64 / done.records.max(1) as f64;
    let reused = match (done.reused, done.merged) {
        (0, _) => String::new(),
        (n, 0) => format!("; {n} unchanged since the last index, kept"),
        (n, parts) => {
            format!("; {n} listed unchanged by {parts} part manifest(s) or the last index, kept")
        }
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
