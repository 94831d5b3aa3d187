//! `wick`: command-line tools for the candle-wick loader.
//!
//! `wick bench DIR` runs the loader over an ImageFolder (a folder) or a file
//! list (a `.csv`/`.tsv` file) with no model attached and reports its
//! throughput, per-stage times and peak memory.

use candle_wick::{FileList, ImageFolder, Loader, Output, Source, Stats, Transforms};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

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
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// An ImageFolder (`DIR/<class>/<image>`) or a CSV/TSV file list.
    data: PathBuf,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Output image side.
    #[arg(long, default_value_t = 224)]
    image_size: usize,
    /// Decode workers (0: all cores).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Batches prepared ahead of the consumer.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// Host batch buffers in flight.
    #[arg(long, default_value_t = 3)]
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
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
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
    prefetch: usize,
    transforms: Mode,
    output: Format,
    epoch_images_per_sec: Vec<f64>,
    median_images_per_sec: f64,
    decoded_mb_per_sec: f64,
    read_us_per_sample: f64,
    decode_us_per_sample: f64,
    transform_us_per_sample: f64,
    upload_us_per_batch: f64,
    consumer_wait_ms_per_batch: f64,
    skipped: usize,
    peak_rss_mb: Option<f64>,
}

/// Peak resident set size of this process (Linux `VmHWM`).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn open(path: &Path) -> candle_wick::Result<Box<dyn Source>> {
    Ok(if path.is_dir() {
        Box::new(ImageFolder::new(path)?)
    } else {
        Box::new(FileList::new(path)?)
    })
}

fn bench(a: &BenchArgs) -> Result<Report, Box<dyn std::error::Error>> {
    let source = open(&a.data)?;
    let samples = source.len();
    let output = match a.output {
        Format::U8 => Output::U8Nhwc,
        Format::F32 => Output::imagenet(),
    };
    let transforms = match a.transforms {
        Mode::Train => Transforms::train(),
        Mode::Eval => Transforms::eval(a.image_size),
    };
    let mut loader = Loader::builder(source)
        .batch_size(a.batch_size)
        .image_size(a.image_size)
        .workers(a.workers)
        .prefetch(a.prefetch)
        .batches_in_flight(a.in_flight)
        .transforms(transforms)
        .output(output)
        .shuffle(0)
        .build()?;
    let mut rates = Vec::new();
    for epoch in 0..a.epochs {
        let t = Instant::now();
        let mut n = 0;
        for batch in loader.epoch(epoch) {
            n += batch?.len();
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        if !a.json {
            println!(
                "epoch {epoch}: {n} images in {:.2?}, {rate:.0} images/s",
                t.elapsed()
            );
        }
        rates.push(rate);
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let s: Stats = loader.stats();
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    Ok(Report {
        data: a.data.display().to_string(),
        jpeg_decoder: if cfg!(feature = "turbojpeg") {
            "libjpeg-turbo (crop window, DCT scaling)"
        } else {
            "zune-jpeg (pure Rust, full image)"
        },
        samples,
        batch_size: a.batch_size,
        image_size: a.image_size,
        workers: loader.workers(),
        prefetch: a.prefetch,
        transforms: a.transforms,
        output: a.output,
        epoch_images_per_sec: rates,
        median_images_per_sec: median,
        decoded_mb_per_sec: s.decoded_mb_per_sec(),
        read_us_per_sample: us(s.read_per_sample),
        decode_us_per_sample: us(s.decode_per_sample),
        transform_us_per_sample: us(s.transform_per_sample),
        upload_us_per_batch: us(s.upload_per_batch),
        consumer_wait_ms_per_batch: us(s.consumer_wait_per_batch) / 1e3,
        skipped: s.skipped.len(),
        peak_rss_mb: peak_rss_mb(),
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Bench(args) = cli.command;
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
                "{} samples, batch {}, {}x{}, {:?} transforms, {:?} output, {} workers, prefetch {}",
                r.samples, r.batch_size, r.image_size, r.image_size, r.transforms, r.output, r.workers, r.prefetch
            );
            println!("JPEG decoder: {}", r.jpeg_decoder);
            println!(
                "images/s (median of {} epochs): {:.0}",
                r.epoch_images_per_sec.len(),
                r.median_images_per_sec
            );
            println!("decoded: {:.1} MB/s", r.decoded_mb_per_sec);
            println!(
                "per sample (worker time): read {:.0} us, decode {:.0} us, transform {:.0} us; upload {:.0} us per batch",
                r.read_us_per_sample, r.decode_us_per_sample, r.transform_us_per_sample, r.upload_us_per_batch
            );
            println!(
                "consumer wait: {:.2} ms per batch",
                r.consumer_wait_ms_per_batch
            );
            if r.skipped > 0 {
                println!("skipped samples: {}", r.skipped);
            }
            match r.peak_rss_mb {
                Some(mb) => println!("peak RSS: {mb:.0} MB"),
                None => println!("peak RSS: not available on this platform"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprint!("wick: {e}");
            let mut cur = e.source();
            while let Some(c) = cur {
                eprint!(": {c}");
                cur = c.source();
            }
            eprintln!();
            ExitCode::FAILURE
        }
    }
}
