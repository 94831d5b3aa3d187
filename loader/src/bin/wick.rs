//! `wick`: command-line tools for the candle-wick loader.
//!
//! `wick bench DATA` runs the loader over a dataset with no model attached
//! and reports its throughput, per-stage times and peak memory.
//! `wick convert SRC DST` writes a dataset as TFRecord, WebDataset tar or
//! safetensors shards.
//!
//! A dataset is an ImageFolder (a folder of class folders), a file list
//! (`.csv`/`.tsv`), or shards: a `.tfrecord`/`.tfrecord.gz`, `.tar` or
//! `.safetensors` file, or a folder of them.

use candle_wick::{
    convert, shard_paths, CacheMode, ConvertOptions, FileList, ImageFolder, Loader, Output,
    SafetensorsShards, ShardFormat, Source, Stats, TfRecord, Transforms, WebDataset,
};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "wick",
    version,
    about = "Tools for the candle-wick data loader"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure loader throughput over a dataset, with no model.
    Bench(BenchArgs),
    /// Write a dataset as TFRecord, WebDataset tar or safetensors shards.
    Convert(ConvertArgs),
}

#[derive(clap::Args, Debug)]
struct ConvertArgs {
    /// The dataset to read (any format `wick bench` reads).
    src: PathBuf,
    /// Folder for the shards (created if missing).
    dst: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutFormat::Tfrecord)]
    format: OutFormat,
    /// Records per shard.
    #[arg(long, default_value_t = 1000)]
    shard_size: usize,
    /// Re-encode (JPEG) images whose longer side is over N, resized to N.
    #[arg(long)]
    max_side: Option<usize>,
    /// Side of the square images of `--format safetensors-pixels` (shorter
    /// side resized to it, centre square kept).
    #[arg(long, default_value_t = 256)]
    pixels_size: usize,
    /// JPEG quality of re-encoded images.
    #[arg(long, default_value_t = 90)]
    quality: u8,
    /// Shard file name prefix.
    #[arg(long, default_value = "data")]
    prefix: String,
    /// Threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum OutFormat {
    /// TFRecord of tf.train.Example (image/encoded, image/class/label).
    Tfrecord,
    /// WebDataset tar (<key>.jpg + <key>.cls).
    Wds,
    /// safetensors: encoded images + offsets + labels.
    Safetensors,
    /// safetensors: pre-resized u8 pixels [N, S, S, 3] + labels.
    SafetensorsPixels,
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// An ImageFolder (`DIR/<class>/<image>`), a CSV/TSV file list, or
    /// TFRecord / WebDataset tar / safetensors shards (a file or a folder).
    data: PathBuf,
    /// Streaming mode: read shards sequentially, CYCLE at a time, BLOCK
    /// records from each in turn (tf.data interleave), as `CYCLE,BLOCK`.
    #[arg(long, value_parser = parse_pair)]
    interleave: Option<(usize, usize)>,
    /// Shuffle buffer of the streaming mode (records).
    #[arg(long)]
    shuffle_buffer: Option<usize>,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Output image side.
    #[arg(long, default_value_t = 224)]
    image_size: usize,
    /// Decode workers (0: AUTOTUNE).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Batches prepared ahead of the consumer (0: AUTOTUNE).
    #[arg(long, default_value_t = 0)]
    prefetch: usize,
    /// Host batch buffers in flight (0: AUTOTUNE).
    #[arg(long, default_value_t = 0)]
    in_flight: usize,
    /// Epochs to run; each is timed on its own.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// `train`: RandomResizedCrop + flip; `eval`: resize + centre crop.
    #[arg(long, value_enum, default_value_t = Mode::Train)]
    transforms: Mode,
    /// `u8` NHWC or `f32` NCHW normalized.
    #[arg(long, value_enum, default_value_t = Format::U8)]
    output: Format,
    /// A simulated training step after each batch, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    step_ms: f64,
    /// How the simulated step spends its time: `sleep` (a GPU step: the
    /// CPU is free) or `spin` (a CPU step: one core busy).
    #[arg(long, value_enum, default_value_t = StepKind::Sleep)]
    step_kind: StepKind,
    /// RAM budget in MB of 10^6 bytes, the unit the reports print (default:
    /// a quarter of the available memory).
    #[arg(long)]
    ram_budget_mb: Option<u64>,
    /// Cache samples in memory after the first epoch.
    #[arg(long, value_enum)]
    cache: Option<CacheArg>,
    /// Print AUTOTUNE's decisions over time.
    #[arg(long)]
    autotune: bool,
    /// Run a sweep of fixed workers x prefetch x in-flight settings, then
    /// AUTOTUNE, on the same data, and print the table.
    #[arg(long)]
    sweep: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum StepKind {
    Sleep,
    Spin,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum CacheArg {
    Encoded,
    Decoded,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Train,
    Eval,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Format {
    U8,
    F32,
}

#[derive(Serialize, Debug)]
struct Report {
    data: String,
    jpeg_decoder: &'static str,
    samples: usize,
    batch_size: usize,
    image_size: usize,
    workers: usize,
    in_flight: usize,
    prefetch: usize,
    transforms: Mode,
    output: Format,
    step_ms: f64,
    epoch_images_per_sec: Vec<f64>,
    median_images_per_sec: f64,
    decoded_mb_per_sec: f64,
    read_us_per_sample: f64,
    decode_us_per_sample: f64,
    transform_us_per_sample: f64,
    upload_us_per_batch: f64,
    consumer_wait_ms_per_batch: f64,
    consumer_wait_share: f64,
    consumer_wait_p50_ms: f64,
    consumer_wait_p99_ms: f64,
    verdict: String,
    loader_memory_peak_mb: f64,
    skipped: usize,
    autotune: Vec<TuneRow>,
    peak_rss_mb: Option<f64>,
    #[serde(skip)]
    report: String,
}

#[derive(Serialize, Debug)]
struct TuneRow {
    at_s: f64,
    workers: usize,
    in_flight: usize,
    prefetch: usize,
    batches_per_sec: f64,
    wait_share: f64,
    action: String,
}

/// Peak resident set size of this process (Linux `VmHWM`).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn parse_pair(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected CYCLE,BLOCK")?;
    Ok((
        a.trim().parse().map_err(|_| "bad CYCLE")?,
        b.trim().parse().map_err(|_| "bad BLOCK")?,
    ))
}

const TFRECORD: &[&str] = &[".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecord.zz"];

/// Opens any dataset format, told by file names.
fn open(path: &Path) -> candle_wick::Result<Box<dyn Source>> {
    let has = |suffixes: &[&str]| shard_paths(path, suffixes).ok();
    if let Some(p) = has(TFRECORD) {
        return Ok(Box::new(TfRecord::open(p)?));
    }
    if let Some(p) = has(&[".tar"]) {
        return Ok(Box::new(WebDataset::open(p)?));
    }
    if let Some(p) = has(&[".safetensors"]) {
        return Ok(Box::new(SafetensorsShards::open(p)?));
    }
    Ok(if path.is_dir() {
        Box::new(ImageFolder::new(path)?)
    } else {
        Box::new(FileList::new(path)?)
    })
}

/// The simulated training step.
fn step(a: &BenchArgs) {
    if a.step_ms <= 0.0 {
        return;
    }
    let d = Duration::from_secs_f64(a.step_ms / 1e3);
    match a.step_kind {
        StepKind::Sleep => std::thread::sleep(d),
        StepKind::Spin => {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        }
    }
}

/// Runs the loader over `source` with `(workers, in_flight, prefetch)`
/// (0: AUTOTUNE).
fn bench_with(
    a: &BenchArgs,
    source: Arc<dyn Source>,
    (workers, in_flight, prefetch): (usize, usize, usize),
    quiet: bool,
) -> Result<Report, Box<dyn std::error::Error>> {
    let samples = source.len();
    let output = match a.output {
        Format::U8 => Output::U8Nhwc,
        Format::F32 => Output::imagenet(),
    };
    let transforms = match a.transforms {
        Mode::Train => Transforms::train(),
        Mode::Eval => Transforms::eval(a.image_size),
    };
    let mut builder = Loader::builder(source)
        .batch_size(a.batch_size)
        .image_size(a.image_size)
        .workers(workers)
        .prefetch(prefetch)
        .batches_in_flight(in_flight)
        .transforms(transforms)
        .output(output)
        .shuffle(0);
    if let Some((cycle, block)) = a.interleave {
        builder = builder.interleave(cycle, block);
    }
    if let Some(n) = a.shuffle_buffer {
        builder = builder.shuffle_buffer(n);
    }
    if let Some(mb) = a.ram_budget_mb {
        builder = builder.ram_budget(mb.saturating_mul(1_000_000));
    }
    if let Some(c) = a.cache {
        builder = builder.cache(match c {
            CacheArg::Encoded => CacheMode::Encoded,
            CacheArg::Decoded => CacheMode::Decoded,
        });
    }
    let mut loader = builder.build()?;
    let mut rates = Vec::new();
    for epoch in 0..a.epochs {
        let t = Instant::now();
        let mut n = 0;
        for batch in loader.epoch(epoch) {
            n += batch?.len();
            step(a);
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        if !quiet {
            let (f, p) = loader.queue_depths();
            println!(
                "epoch {epoch}: {n} images in {:.2?}, {rate:.0} images/s (workers {}, in flight {f}, prefetch {p})",
                t.elapsed(),
                loader.workers()
            );
        }
        rates.push(rate);
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let s: Stats = loader.stats();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (in_flight, prefetch) = loader.queue_depths();
    Ok(Report {
        data: a.data.display().to_string(),
        jpeg_decoder: candle_wick::JPEG_DECODER,
        samples,
        batch_size: a.batch_size,
        image_size: a.image_size,
        workers: loader.workers(),
        in_flight,
        prefetch,
        transforms: a.transforms,
        output: a.output,
        step_ms: a.step_ms,
        epoch_images_per_sec: rates,
        median_images_per_sec: median,
        decoded_mb_per_sec: s.decoded_mb_per_sec(),
        read_us_per_sample: us(s.read_per_sample),
        decode_us_per_sample: us(s.decode_per_sample),
        transform_us_per_sample: us(s.transform_per_sample),
        upload_us_per_batch: us(s.upload_per_batch),
        consumer_wait_ms_per_batch: us(s.consumer_wait_per_batch) / 1e3,
        consumer_wait_share: s.consumer_wait_share,
        consumer_wait_p50_ms: us(s.consumer_wait_p50) / 1e3,
        consumer_wait_p99_ms: us(s.consumer_wait_p99) / 1e3,
        verdict: s.verdict.to_string(),
        loader_memory_peak_mb: s.memory_peak as f64 / 1e6,
        skipped: s.skipped_samples as usize,
        autotune: loader
            .autotune_history()
            .into_iter()
            .map(|t| TuneRow {
                at_s: t.at.as_secs_f64(),
                workers: t.workers,
                in_flight: t.in_flight,
                prefetch: t.prefetch,
                batches_per_sec: t.batches_per_sec,
                wait_share: t.wait_share,
                action: t.action,
            })
            .collect(),
        peak_rss_mb: peak_rss_mb(),
        report: s.report(),
    })
}

fn open_shared(a: &BenchArgs) -> Result<Arc<dyn Source>, Box<dyn std::error::Error>> {
    let source = open(&a.data)?;
    for d in source.damage() {
        eprintln!(
            "wick: left out damaged {:?} from byte {}: {}",
            d.path, d.offset, d.reason
        );
    }
    Ok(Arc::from(source))
}

/// Fixed settings against AUTOTUNE on the same data.
fn sweep(a: &BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let source = open_shared(a)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = Vec::new();
    for workers in 1..=cores {
        for in_flight in [2, 4] {
            for prefetch in [1, 2, 4] {
                let r = bench_with(a, source.clone(), (workers, in_flight, prefetch), true)?;
                println!(
                    "fixed workers {workers} in flight {in_flight} prefetch {prefetch}: {:.0} images/s",
                    r.median_images_per_sec
                );
                rows.push((
                    format!("{workers} | {in_flight} | {prefetch}"),
                    r.median_images_per_sec,
                ));
            }
        }
    }
    let auto = bench_with(a, source, (0, 0, 0), true)?;
    let best = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    println!("\n| workers | in flight | prefetch | images/s | vs best |");
    println!("|---|---|---|---:|---:|");
    for (cfg, ips) in &rows {
        println!("| {cfg} | {ips:.0} | {:.2} |", ips / best);
    }
    println!(
        "| AUTOTUNE (ended at {} / {} / {}) | | | {:.0} | {:.2} |",
        auto.workers,
        auto.in_flight,
        auto.prefetch,
        auto.median_images_per_sec,
        auto.median_images_per_sec / best
    );
    println!(
        "step {} ms ({:?}), {} epochs each, median epoch; AUTOTUNE epochs: {:?}",
        a.step_ms,
        a.step_kind,
        a.epochs,
        auto.epoch_images_per_sec
            .iter()
            .map(|r| r.round())
            .collect::<Vec<_>>()
    );
    Ok(())
}

fn bench(a: &BenchArgs) -> Result<Report, Box<dyn std::error::Error>> {
    let source = open_shared(a)?;
    bench_with(a, source, (a.workers, a.in_flight, a.prefetch), a.json)
}

fn run_convert(a: &ConvertArgs) -> Result<(), Box<dyn std::error::Error>> {
    let source = open(&a.src)?;
    let format = match a.format {
        OutFormat::Tfrecord => ShardFormat::TfRecord,
        OutFormat::Wds => ShardFormat::WebDataset,
        OutFormat::Safetensors => ShardFormat::SafetensorsEncoded,
        OutFormat::SafetensorsPixels => ShardFormat::SafetensorsPixels {
            size: a.pixels_size,
        },
    };
    let opts = ConvertOptions {
        format,
        shard_size: a.shard_size,
        max_side: a.max_side,
        quality: a.quality,
        prefix: a.prefix.clone(),
        threads: a.threads,
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
    println!(
        "wrote {} records in {} shards ({:.1} MB) to {} in {:.1?}",
        source.len(),
        paths.len(),
        bytes as f64 / 1e6,
        a.dst.display(),
        t.elapsed()
    );
    Ok(())
}

fn report_error(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("wick: {}", candle_wick::error_chain(e));
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Bench(args) => args,
        Command::Convert(args) => {
            return match run_convert(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => report_error(e.as_ref()),
            }
        }
    };
    if args.sweep {
        return match sweep(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => report_error(e.as_ref()),
        };
    }
    match bench(&args) {
        Ok(r) if args.json => match serde_json::to_string_pretty(&r) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("wick: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(r) => {
            println!(
                "{} samples, batch {}, {}x{}, {:?} transforms, {:?} output, step {} ms",
                r.samples,
                r.batch_size,
                r.image_size,
                r.image_size,
                r.transforms,
                r.output,
                r.step_ms
            );
            println!("JPEG decoder: {}", r.jpeg_decoder);
            println!(
                "images/s (median of {} epochs): {:.0}",
                r.epoch_images_per_sec.len(),
                r.median_images_per_sec
            );
            println!(
                "per sample (worker time): read {:.0} us, decode {:.0} us, transform {:.0} us; upload {:.0} us per batch",
                r.read_us_per_sample, r.decode_us_per_sample, r.transform_us_per_sample, r.upload_us_per_batch
            );
            println!("{}", r.report);
            if args.autotune {
                println!("AUTOTUNE decisions:");
                for t in &r.autotune {
                    println!(
                        "  {:6.2}s  workers {} in flight {} prefetch {}  ({:.1} batches/s, waited {:.0}%)  {}",
                        t.at_s, t.workers, t.in_flight, t.prefetch, t.batches_per_sec, t.wait_share * 100.0, t.action
                    );
                }
                println!(
                    "settled at: workers {}, in flight {}, prefetch {}",
                    r.workers, r.in_flight, r.prefetch
                );
            }
            if r.skipped > 0 {
                println!("skipped samples: {}", r.skipped);
            }
            match r.peak_rss_mb {
                Some(mb) => println!("peak RSS: {mb:.0} MB"),
                None => println!("peak RSS: not available on this platform"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => report_error(e.as_ref()),
    }
}
