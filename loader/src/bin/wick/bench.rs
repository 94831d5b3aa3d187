//! `wick bench`: the loader over a dataset with no model attached, its
//! throughput, per-stage times and peak memory; `--sweep` for a table of
//! fixed settings against AUTOTUNE.

use candle_wick::map::TokenWindowsMap;
use candle_wick::source::{detect, DatasetKind, DocumentWindows, Megatron};
use candle_wick::stats::Stats;
use candle_wick::storage::RemoteCache;
use candle_wick::{CacheMode, Loader, Output, Setting, ShardBlocks, Source, Transforms};
use clap::ValueEnum;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// An ImageFolder (`DIR/<class>/<image>`), a CSV/TSV file list,
    /// TFRecord / WebDataset tar / safetensors / Parquet shards (a file, a
    /// folder, a Hugging Face dataset folder or a URL), or a Megatron
    /// indexed dataset (a `.idx`/`.bin` file or a folder of them: give
    /// `--seq-len`).
    pub(crate) data: PathBuf,
    /// Windows of SEQ_LEN + 1 tokens from a Megatron dataset, packed across
    /// documents (Megatron's GPT dataset); the rate is then windows/s and
    /// tokens/s, and the image options do not apply.
    #[arg(long)]
    pub(crate) seq_len: Option<usize>,
    /// With `--seq-len`: the token put between packed documents.
    #[arg(long, requires = "seq_len")]
    pub(crate) eos: Option<u32>,
    /// Streaming mode: read shards sequentially, CYCLE at a time, BLOCK
    /// records from each in turn (tf.data interleave), as `CYCLE,BLOCK`.
    #[arg(long, value_parser = parse_pair)]
    pub(crate) interleave: Option<(usize, usize)>,
    /// Shuffle buffer of the streaming mode (records).
    #[arg(long)]
    pub(crate) shuffle_buffer: Option<usize>,
    /// Random access by shard blocks (`LoaderBuilder::shard_blocks`):
    /// shards read a window at a time, remote ones in 32 MiB requests.
    #[arg(long, conflicts_with = "interleave")]
    pub(crate) shard_blocks: bool,
    /// With `--shard-blocks`: the samples a part is shuffled within
    /// (default: from the RAM budget, or the remote cache directory).
    #[arg(long, requires = "shard_blocks")]
    pub(crate) window: Option<usize>,
    /// With `--shard-blocks`: the parts an epoch is cut into (default: the
    /// world size the launcher's variables give, 1 for one process).
    #[arg(long, requires = "shard_blocks")]
    pub(crate) partitions: Option<usize>,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// Output image side.
    #[arg(long, default_value_t = 224)]
    pub(crate) image_size: usize,
    /// Decode workers (0: AUTOTUNE).
    #[arg(long, default_value_t = 0)]
    pub(crate) workers: usize,
    /// Batches prepared ahead of the consumer (0: AUTOTUNE).
    #[arg(long, default_value_t = 0)]
    pub(crate) prefetch: usize,
    /// Host batch buffers in flight (0: AUTOTUNE).
    #[arg(long, default_value_t = 0)]
    pub(crate) in_flight: usize,
    /// Epochs to run; each is timed on its own.
    #[arg(long, default_value_t = 3)]
    pub(crate) epochs: u64,
    /// `train`: RandomResizedCrop + flip; `eval`: resize + centre crop.
    #[arg(long, value_enum, default_value_t = Mode::Train)]
    pub(crate) transforms: Mode,
    /// `u8` NHWC or `f32` NCHW normalized.
    #[arg(long, value_enum, default_value_t = Format::U8)]
    pub(crate) output: Format,
    /// A simulated training step after each batch, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    /// How the simulated step spends its time: `sleep` (a GPU step: the
    /// CPU is free) or `spin` (a CPU step: one core busy).
    #[arg(long, value_enum, default_value_t = StepKind::Sleep)]
    pub(crate) step_kind: StepKind,
    /// RAM budget in MB of 10^6 bytes, the unit the reports print (default:
    /// a quarter of the available memory).
    #[arg(long)]
    pub(crate) ram_budget_mb: Option<u64>,
    /// Cache samples in memory after the first epoch.
    #[arg(long, value_enum)]
    pub(crate) cache: Option<CacheArg>,
    /// Keep remote objects (a URL dataset's shards and files) in a memory
    /// cache of this many MB (storage::RemoteCache).
    #[arg(long)]
    pub(crate) remote_cache_mb: Option<u64>,
    /// Also keep remote objects as files in this directory (reused by
    /// later runs), up to `--remote-cache-dir-mb`.
    #[arg(long)]
    pub(crate) remote_cache_dir: Option<PathBuf>,
    /// The limit of `--remote-cache-dir`, in MB.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) remote_cache_dir_mb: u64,
    /// Print AUTOTUNE's decisions over time.
    #[arg(long)]
    pub(crate) autotune: bool,
    /// Run a sweep of fixed workers x prefetch x in-flight settings, then
    /// AUTOTUNE, on the same data, and print the table.
    #[arg(long)]
    pub(crate) sweep: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StepKind {
    Sleep,
    Spin,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CacheArg {
    Encoded,
    Decoded,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    Train,
    Eval,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Format {
    U8,
    F32,
}

#[derive(Serialize, Debug)]
pub(crate) struct Report {
    pub(crate) data: String,
    pub(crate) jpeg_decoder: &'static str,
    pub(crate) samples: usize,
    pub(crate) batch_size: usize,
    pub(crate) image_size: usize,
    pub(crate) workers: usize,
    pub(crate) in_flight: usize,
    pub(crate) prefetch: usize,
    pub(crate) transforms: Mode,
    pub(crate) output: Format,
    pub(crate) step_ms: f64,
    /// Samples per second of each epoch: images, or token windows.
    pub(crate) epoch_images_per_sec: Vec<f64>,
    pub(crate) median_images_per_sec: f64,
    /// What a sample is: `images`, or `windows` of a token corpus.
    pub(crate) unit: &'static str,
    /// Tokens per window (`--seq-len` + 1) of a token corpus.
    pub(crate) window_tokens: Option<usize>,
    /// Tokens per second (median epoch) of a token corpus.
    pub(crate) tokens_per_sec: Option<f64>,
    /// CPU time of the whole process over each epoch's wall time: the
    /// cores it kept busy (decode workers, I/O threads, everything).
    pub(crate) epoch_cpu_cores: Vec<f64>,
    /// Records read ahead of the workers at the end (remote data).
    pub(crate) read_ahead: usize,
    pub(crate) decoded_mb_per_sec: f64,
    pub(crate) read_us_per_sample: f64,
    pub(crate) decode_us_per_sample: f64,
    pub(crate) transform_us_per_sample: f64,
    pub(crate) upload_us_per_batch: f64,
    pub(crate) consumer_wait_ms_per_batch: f64,
    pub(crate) consumer_wait_share: f64,
    consumer_wait_p50_ms: f64,
    consumer_wait_p99_ms: f64,
    pub(crate) verdict: String,
    pub(crate) loader_memory_peak_mb: f64,
    pub(crate) skipped: usize,
    pub(crate) autotune: Vec<TuneRow>,
    pub(crate) peak_rss_mb: Option<f64>,
    #[serde(skip)]
    pub(crate) report: String,
}

#[derive(Serialize, Debug)]
pub(crate) struct TuneRow {
    pub(crate) at_s: f64,
    pub(crate) workers: usize,
    pub(crate) in_flight: usize,
    pub(crate) prefetch: usize,
    pub(crate) batches_per_sec: f64,
    pub(crate) wait_share: f64,
    pub(crate) action: String,
}

/// CPU time (user and system) of this process's threads so far (zero
/// where not measured).
#[cfg(not(target_os = "linux"))]
pub(crate) fn cpu_time() -> Duration {
    Duration::ZERO
}

/// CPU time (user and system) of this process's threads so far.
#[cfg(target_os = "linux")]
pub(crate) fn cpu_time() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `u` is a valid, writable rusage; getrusage fills it and
    // reads nothing else.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    // SAFETY: zeroed is a valid rusage (plain integers), and getrusage
    // succeeded.
    let u = unsafe { u.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Peak resident set size of this process (Linux `VmHWM`).
pub(crate) fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

pub(crate) fn parse_pair(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once(',').ok_or("expected CYCLE,BLOCK")?;
    Ok((
        a.trim().parse().map_err(|_| "bad CYCLE")?,
        b.trim().parse().map_err(|_| "bad BLOCK")?,
    ))
}

/// The simulated training step.
pub(crate) fn step(a: &BenchArgs) {
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
pub(crate) fn bench_with(
    a: &BenchArgs,
    data: &Data,
    (workers, in_flight, prefetch): (usize, usize, usize),
    quiet: bool,
) -> Result<Report, Box<dyn std::error::Error>> {
    let source = data.source.clone();
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
        .workers(Setting::auto_if_zero(workers))
        .prefetch(Setting::auto_if_zero(prefetch))
        .batches_in_flight(Setting::auto_if_zero(in_flight))
        .shuffle(0);
    builder = match &data.tokens {
        Some(m) => builder.map(TokenWindowsMap::megatron(m)),
        None => builder
            .image_size(a.image_size)
            .transforms(transforms)
            .output(output),
    };
    if let Some((cycle, block)) = a.interleave {
        builder = builder.interleave(cycle, block);
    }
    let unit = if data.tokens.is_some() {
        "windows"
    } else {
        "images"
    };
    if let Some(n) = a.shuffle_buffer {
        builder = builder.shuffle_buffer(n);
    }
    if a.shard_blocks {
        let mut blocks = ShardBlocks::new();
        if let Some(w) = a.window {
            blocks = blocks.window(w);
        }
        if let Some(p) = a.partitions {
            blocks = blocks.partitions(p);
        }
        builder = builder.shard_blocks(blocks);
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
    if a.remote_cache_mb.is_some() || a.remote_cache_dir.is_some() {
        let mut cache = RemoteCache::memory(a.remote_cache_mb.unwrap_or(0) * 1_000_000);
        if let Some(dir) = &a.remote_cache_dir {
            cache = cache.disk(dir, a.remote_cache_dir_mb * 1_000_000);
        }
        builder = builder.remote_cache(cache);
    }
    let mut loader = builder.build()?;
    let mut rates = Vec::new();
    let mut cores = Vec::new();
    for epoch in 0..a.epochs {
        let t = Instant::now();
        let cpu = cpu_time();
        let mut n = 0;
        for batch in loader.epoch(epoch) {
            n += batch?.len();
            step(a);
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        cores.push((cpu_time() - cpu).as_secs_f64() / t.elapsed().as_secs_f64());
        if !quiet {
            let (f, p) = loader.queue_depths();
            println!(
                "epoch {epoch}: {n} {unit} in {:.2?}, {rate:.0} {unit}/s (workers {}, in flight {f}, prefetch {p})",
                t.elapsed(),
                loader.workers()
            );
        }
        rates.push(rate);
    }
    let median = median(&rates).unwrap_or(0.0);
    let s: Stats = loader.stats();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (in_flight, prefetch) = loader.queue_depths();
    Ok(Report {
        data: a.data.display().to_string(),
        jpeg_decoder: candle_wick::__bench::JPEG_DECODER,
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
        unit,
        window_tokens: data.tokens.as_ref().map(|m| m.seq_len() + 1),
        tokens_per_sec: data
            .tokens
            .as_ref()
            .map(|m| median * (m.seq_len() + 1) as f64),
        epoch_cpu_cores: cores,
        read_ahead: s.read_ahead,
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
                action: t.action.to_string(),
            })
            .collect(),
        peak_rss_mb: peak_rss_mb(),
        report: s.report(),
    })
}

/// What a bench reads: the source, and the Megatron dataset whose token
/// windows it gives (with `--seq-len`).
pub(crate) struct Data {
    pub(crate) source: Arc<dyn Source>,
    pub(crate) tokens: Option<Megatron>,
}

pub(crate) fn open_shared(a: &BenchArgs) -> Result<Data, Box<dyn std::error::Error>> {
    let found = detect(&a.data)?;
    if found.kind == DatasetKind::Megatron || a.seq_len.is_some() {
        if found.kind != DatasetKind::Megatron {
            return Err(format!(
                "--seq-len reads a Megatron dataset, but {} holds {}",
                a.data.display(),
                found.kind.name()
            )
            .into());
        }
        let Some(seq_len) = a.seq_len else {
            return Err(format!(
                "{} is a Megatron dataset: give the window length with --seq-len",
                a.data.display()
            )
            .into());
        };
        let m = Megatron::open(found.paths, seq_len, DocumentWindows::Packed { eos: a.eos })?;
        return Ok(Data {
            source: Arc::new(m.clone()),
            tokens: Some(m),
        });
    }
    let source = found.kind.open(&found.paths)?;
    for d in source.damage() {
        eprintln!(
            "wick: left out damaged {:?} from byte {}: {}",
            d.path, d.offset, d.reason
        );
    }
    Ok(Data {
        source: Arc::from(source),
        tokens: None,
    })
}

/// Fixed settings against AUTOTUNE on the same data.
pub(crate) fn sweep(a: &BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let source = open_shared(a)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = Vec::new();
    for workers in 1..=cores {
        for in_flight in [2, 4] {
            for prefetch in [1, 2, 4] {
                let r = bench_with(a, &source, (workers, in_flight, prefetch), true)?;
                println!(
                    "fixed workers {workers} in flight {in_flight} prefetch {prefetch}: {:.0} {}/s",
                    r.median_images_per_sec, r.unit
                );
                rows.push((
                    format!("{workers} | {in_flight} | {prefetch}"),
                    r.median_images_per_sec,
                ));
            }
        }
    }
    let auto = bench_with(a, &source, (0, 0, 0), true)?;
    let best = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    println!(
        "\n| workers | in flight | prefetch | {}/s | vs best |",
        auto.unit
    );
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

pub(crate) fn bench(a: &BenchArgs) -> Result<Report, Box<dyn std::error::Error>> {
    let source = open_shared(a)?;
    bench_with(a, &source, (a.workers, a.in_flight, a.prefetch), a.json)
}

/// Prints a bench report as text (what `main` shows without `--json`).
pub(crate) fn print_text(r: &Report, autotune: bool) {
    if let Some(w) = r.window_tokens {
        println!(
            "{} windows of {w} tokens, batch {}, step {} ms",
            r.samples, r.batch_size, r.step_ms
        );
    } else {
        println!(
            "{} samples, batch {}, {}x{}, {:?} transforms, {:?} output, step {} ms",
            r.samples, r.batch_size, r.image_size, r.image_size, r.transforms, r.output, r.step_ms
        );
        println!("JPEG decoder: {}", r.jpeg_decoder);
    }
    println!(
        "{}/s (median of {} epochs): {:.0}",
        r.unit,
        r.epoch_images_per_sec.len(),
        r.median_images_per_sec
    );
    if let Some(t) = r.tokens_per_sec {
        println!("tokens/s: {t:.0}");
    }
    println!(
            "per sample (worker time): read {:.0} us, decode {:.0} us, transform {:.0} us; upload {:.0} us per batch",
            r.read_us_per_sample, r.decode_us_per_sample, r.transform_us_per_sample, r.upload_us_per_batch
        );
    println!("{}", r.report);
    if autotune {
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
    if let Some(c) = median(&r.epoch_cpu_cores).filter(|c| *c > 0.0) {
        println!("CPU: {c:.2} cores busy (median over epochs)");
    }
    if r.read_ahead > 0 {
        println!("read ahead: {} records", r.read_ahead);
    }
    if r.skipped > 0 {
        println!("skipped samples: {}", r.skipped);
    }
    match r.peak_rss_mb {
        Some(mb) => println!("peak RSS: {mb:.0} MB"),
        None => println!("peak RSS: not available on this platform"),
    }
}

/// The median of `v` (the upper one of an even count).
fn median(v: &[f64]) -> Option<f64> {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}
