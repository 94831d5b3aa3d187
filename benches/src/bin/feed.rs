//! The GPU feed benchmark: the loader feeding device tensors from an
//! ImageFolder, with and without a training step of known cost, beside the
//! same step with no loader in the process.
//!
//! ```text
//! cargo run --release -p benches --features cuda --bin feed -- DIR \
//!     [--device cuda|cpu] [--batch-size 256] [--image-size 224] [--epochs 3] \
//!     [--workers N]  (0 = AUTOTUNE, the default) \
//!     [--output u8|f32|bf16] [--transforms train|eval] \
//!     [--step none|matmul:N|cpu:MS] [--no-loader] [--json FILE]
//! ```
//!
//! Per epoch it prints (and appends to `--json` as one JSON line) images/s,
//! the consumer's wait share (time blocked in `next()`, the epoch's first
//! batch apart, as `first_batch_s`), and the median time of the step's own
//! work: on CUDA from events recorded on the consumer's stream around it,
//! on the CPU by the wall clock around it. `--no-loader` runs the
//! same step on a synthetic batch, with no loader in the process (on CUDA
//! with a second stream created first, so candle's event tracking is on as
//! it is beside the loader), for `--epochs` epochs of as many steps.
//!
//! The steps: `matmul:N`, N chained 4096x4096 f32 matmuls (scaled so the
//! values stay finite) and a loss read of one element (a fresh 1-element
//! tensor: `to_vec1` of a view would copy the view's whole storage);
//! `cpu:MS`, a CPU-bound loop on the consumer thread calibrated to MS
//! milliseconds alone. Each batch also gets a checksum, reduced along its
//! last axis first (candle's whole-tensor sum runs one CUDA block), summed
//! on the device and read once per epoch.

use candle_core::{DType, Device, Tensor, D};
use candle_wick::source::ImageFolder;
use candle_wick::{FloatType, Loader, NormalizeAt, Output, Setting, AUTOTUNE};
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    None,
    Matmul(usize),
    Cpu(f64),
}

impl Step {
    fn name(self) -> String {
        match self {
            Step::None => "none".into(),
            Step::Matmul(n) => format!("matmul:{n}"),
            Step::Cpu(ms) => format!("cpu:{ms}"),
        }
    }
}

struct Args {
    dir: String,
    cuda: bool,
    batch: usize,
    size: usize,
    epochs: usize,
    workers: usize,
    output: String,
    train: bool,
    step: Step,
    no_loader: bool,
    json: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        dir: String::new(),
        cuda: cfg!(feature = "cuda"),
        batch: 256,
        size: 224,
        epochs: 3,
        workers: 0,
        output: "u8".into(),
        train: true,
        step: Step::None,
        no_loader: false,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().ok_or(format!("{arg} needs a value"));
        let num = |v: String| v.parse::<usize>().map_err(|e| format!("{arg} {v}: {e}"));
        match arg.as_str() {
            "--device" => a.cuda = val()? == "cuda",
            "--batch-size" => a.batch = num(val()?)?,
            "--image-size" => a.size = num(val()?)?,
            "--epochs" => a.epochs = num(val()?)?,
            "--workers" => a.workers = num(val()?)?,
            "--output" => a.output = val()?,
            "--transforms" => a.train = val()? == "train",
            "--no-loader" => a.no_loader = true,
            "--json" => a.json = Some(val()?),
            "--step" => {
                let v = val()?;
                a.step = match v.split_once(':') {
                    None if v == "none" => Step::None,
                    Some(("matmul", n)) => Step::Matmul(num(n.into())?),
                    Some(("cpu", ms)) => Step::Cpu(ms.parse().map_err(|e| format!("{v}: {e}"))?),
                    _ => return Err(format!("--step {v}: none, matmul:N or cpu:MS")),
                }
            }
            s if s.starts_with("--") => return Err(format!("unknown option {s}")),
            s => a.dir = s.into(),
        }
    }
    if a.dir.is_empty() {
        return Err("usage: feed DIR [options] (see the source's header)".into());
    }
    Ok(a)
}

/// The training step: its work enqueued on the consumer's stream, its
/// own time measured (device events on CUDA, the wall clock on the CPU),
/// and its loss read.
struct Stepper {
    step: Step,
    weights: Option<Tensor>,
    spins: u64,
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a timespec; the clock exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Work the optimizer cannot remove: `n` rounds of an xorshift.
fn spin(n: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

impl Stepper {
    fn new(step: Step, device: &Device) -> candle_core::Result<Self> {
        let weights = match step {
            Step::Matmul(_) => Some(Tensor::ones((4096, 4096), DType::F32, device)?),
            _ => None,
        };
        let spins = match step {
            Step::Cpu(ms) => {
                // Calibrated alone, before any loader exists.
                let n = 1 << 20;
                let t = thread_cpu();
                spin(n);
                let per = (thread_cpu() - t).as_secs_f64() / n as f64;
                (ms / 1e3 / per) as u64
            }
            _ => 0,
        };
        Ok(Self {
            step,
            weights,
            spins,
        })
    }

    /// Runs one step on `x`; returns the step's own time in ms (`None`
    /// for no step).
    fn run(&self) -> candle_core::Result<Option<f64>> {
        match self.step {
            Step::None => Ok(None),
            Step::Cpu(_) => {
                // Wall time: what the training loop loses when the thread
                // is descheduled or its caches are shared.
                let t = Instant::now();
                spin(self.spins);
                Ok(Some(t.elapsed().as_secs_f64() * 1e3))
            }
            Step::Matmul(n) => {
                let a = self.weights.as_ref().expect("matmul weights");
                let timer = Timer::start(a.device())?;
                let mut y = a.clone();
                for _ in 0..n {
                    y = (y.matmul(a)? * (1.0 / 4096.0))?;
                }
                // One element, freshly stored, to the host: the step's sync.
                let loss = y.narrow(0, 0, 1)?.narrow(1, 0, 1)?.sum_all()?;
                let ms = timer.stop()?;
                let v = loss.to_scalar::<f32>()?;
                if (v - 1.0).abs() > 1e-3 {
                    candle_core::bail!("matmul step: loss {v}, expected 1");
                }
                Ok(ms)
            }
        }
    }
}

/// The step's own device time: events on the consumer thread's stream.
enum Timer {
    Host(Instant),
    #[cfg(feature = "cuda")]
    Cuda(
        candle_core::cuda::cudarc::driver::CudaEvent,
        std::sync::Arc<candle_core::cuda::cudarc::driver::CudaStream>,
    ),
}

impl Timer {
    fn start(device: &Device) -> candle_core::Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = device {
            use candle_core::cuda::cudarc::driver::sys::CUevent_flags;
            use candle_core::cuda::WrapErr;
            let stream = d.cuda_stream();
            let e = stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .w()?;
            return Ok(Timer::Cuda(e, stream));
        }
        let _ = device;
        Ok(Timer::Host(Instant::now()))
    }

    /// Milliseconds from start to now (CUDA: waits for the step's work).
    fn stop(self) -> candle_core::Result<Option<f64>> {
        match self {
            Timer::Host(t) => Ok(Some(t.elapsed().as_secs_f64() * 1e3)),
            #[cfg(feature = "cuda")]
            Timer::Cuda(start, stream) => {
                use candle_core::cuda::cudarc::driver::sys::CUevent_flags;
                use candle_core::cuda::WrapErr;
                let end = stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .w()?;
                end.synchronize().w()?;
                Ok(Some(f64::from(start.elapsed_ms(&end).w()?)))
            }
        }
    }
}

/// A cheap multi-block checksum of a batch, left on the device.
fn checksum(x: &Tensor) -> candle_core::Result<Tensor> {
    x.to_dtype(DType::F32)?.sum_keepdim(D::Minus1)?.sum_all()
}

/// Per-thread CPU seconds of this process, from `/proc/self/task` (Linux;
/// empty elsewhere): (thread name, user + system seconds).
fn thread_cpu_times() -> Vec<(String, f64)> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
        // "tid (comm) state ...": fields after the comm's closing paren.
        let (head, rest) = stat.rsplit_once(") ")?;
        let name = head.split_once(" (")?.1.to_string();
        let f: Vec<&str> = rest.split(' ').collect();
        // utime and stime are fields 14 and 15 of the line (1-based), so
        // 12 and 13 after "state".
        let (u, s) = (
            f.get(11)?.parse::<f64>().ok()?,
            f.get(12)?.parse::<f64>().ok()?,
        );
        Some((name, (u + s) / ticks))
    })
    .collect()
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn output(a: &Args) -> Result<Output, String> {
    let imagenet = Output::imagenet();
    Ok(match a.output.as_str() {
        "u8" => Output::U8Nhwc,
        "f32" => imagenet.normalized_at(NormalizeAt::Device),
        "bf16" => imagenet
            .with_dtype(FloatType::BF16)
            .normalized_at(NormalizeAt::Device),
        o => return Err(format!("--output {o}: u8, f32 or bf16")),
    })
}

struct Line<'a> {
    a: &'a Args,
    peer: &'a str,
    epoch: usize,
    images_per_sec: Option<f64>,
    wait_share: Option<f64>,
    step_ms: Option<f64>,
    first_batch_s: Option<f64>,
}

fn emit(l: &Line) -> std::io::Result<()> {
    let num = |v: Option<f64>| v.map_or("null".to_string(), |v| format!("{v:.6}"));
    let workers = match l.a.workers {
        0 => "auto".to_string(),
        n => n.to_string(),
    };
    let json = format!(
        "{{\"bench\":\"gpu-feed\",\"peer\":\"{}\",\"device\":\"{}\",\"workers\":\"{workers}\",\"output\":\"{}\",\"transforms\":\"{}\",\"step\":\"{}\",\"epoch\":{},\"images_per_sec\":{},\"wait_share\":{},\"step_ms\":{},\"step_alone_ms\":null,\"first_batch_s\":{}}}",
        l.peer,
        if l.a.cuda { "cuda" } else { "cpu" },
        l.a.output,
        if l.a.train { "train" } else { "eval" },
        l.a.step.name(),
        l.epoch,
        num(l.images_per_sec),
        num(l.wait_share),
        num(l.step_ms),
        num(l.first_batch_s),
    );
    println!(
        "{} epoch {}: {} images/s, wait {}, step {} ms, first batch {} s",
        l.peer,
        l.epoch,
        l.images_per_sec.map_or("-".into(), |v| format!("{v:.0}")),
        l.wait_share
            .map_or("-".into(), |v| format!("{:.1}%", v * 100.0)),
        l.step_ms.map_or("-".into(), |v| format!("{v:.2}")),
        l.first_batch_s.map_or("-".into(), |v| format!("{v:.2}")),
    );
    if let Some(path) = &l.a.json {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(f, "{json}")?;
    }
    Ok(())
}

fn device(a: &Args) -> candle_core::Result<Device> {
    if a.cuda {
        Device::new_cuda(0)
    } else {
        Ok(Device::Cpu)
    }
}

fn step_alone(a: &Args, files: usize) -> Result<(), Box<dyn std::error::Error>> {
    let device = device(a)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = &device {
        use candle_core::cuda::WrapErr;
        // As beside the loader (whose copy stream does this): the context
        // in multi-stream mode, candle's event tracking on.
        let _second = d.cuda_stream().context().new_stream().w()?;
    }
    let stepper = Stepper::new(a.step, &device)?;
    stepper.run()?;
    let steps = files.div_ceil(a.batch);
    for epoch in 0..a.epochs {
        let mut times = Vec::new();
        for _ in 0..steps {
            if let Some(ms) = stepper.run()? {
                times.push(ms);
            }
        }
        emit(&Line {
            a,
            peer: "step-alone",
            epoch,
            images_per_sec: None,
            wait_share: None,
            step_ms: median(&mut times),
            first_batch_s: None,
        })?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    if a.cuda && !cfg!(feature = "cuda") {
        return Err("--device cuda needs the cuda feature (--features cuda)".into());
    }
    let source = ImageFolder::new(&a.dir)?;
    let files = candle_wick::source::Source::len(&source);
    if a.no_loader {
        return step_alone(&a, files);
    }
    let device = device(&a)?;
    let stepper = Stepper::new(a.step, &device)?;
    let workers = match a.workers {
        0 => AUTOTUNE,
        n => Setting::Fixed(n),
    };
    let builder = Loader::builder(source)
        .batch_size(a.batch)
        .image_size(a.size)
        .shuffle(1)
        .workers(workers)
        .output(output(&a)?)
        .device(device.clone());
    let builder = if a.train {
        builder.train_transforms()
    } else {
        builder.eval_transforms()
    };
    let mut loader = builder.build()?;
    for epoch in 0..a.epochs {
        let (mut waited, mut first, mut times, mut images) = (Duration::ZERO, None, Vec::new(), 0);
        let mut sum: Option<Tensor> = None;
        let start = Instant::now();
        let mut batches = loader.epoch(epoch as u64);
        loop {
            let t = Instant::now();
            let Some(b) = batches.next() else { break };
            let b = b?;
            match first {
                None => first = Some(t.elapsed()),
                Some(_) => waited += t.elapsed(),
            }
            let x = b.images()?;
            images += b.len();
            let c = checksum(x)?;
            sum = Some(match sum {
                None => c,
                Some(s) => (s + c)?,
            });
            if let Some(ms) = stepper.run()? {
                times.push(ms);
            }
        }
        drop(batches);
        if let Some(s) = sum {
            // The epoch's work is done before its time is taken.
            let _ = s.to_scalar::<f32>()?;
        }
        let wall = start.elapsed();
        let first = first.unwrap_or_default();
        let steady = wall.saturating_sub(first).as_secs_f64();
        emit(&Line {
            a: &a,
            peer: "wick",
            epoch,
            images_per_sec: Some(images as f64 / wall.as_secs_f64()),
            wait_share: Some(if steady > 0.0 {
                waited.as_secs_f64() / steady
            } else {
                0.0
            }),
            step_ms: median(&mut times),
            first_batch_s: Some(first.as_secs_f64()),
        })?;
        println!("  workers {}", loader.stats().workers);
    }
    let stats = loader.stats();
    println!("{}", stats.report());
    // The loader's CPU: its threads are named wick-*; the consumer's is
    // `main` (or the process name).
    let threads = thread_cpu_times();
    let loader_cpu: f64 = threads
        .iter()
        .filter(|(n, _)| n.starts_with("wick-"))
        .map(|t| t.1)
        .sum();
    let count = threads
        .iter()
        .filter(|(n, _)| n.starts_with("wick-"))
        .count();
    let mut busiest: Vec<_> = threads.iter().filter(|t| t.1 > 0.0).collect();
    busiest.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!(
        "loader CPU: {loader_cpu:.2} s in {count} threads ({:.1} us per image over {} images); by thread: {}",
        loader_cpu * 1e6 / stats.samples.max(1) as f64,
        stats.samples,
        busiest
            .iter()
            .take(8)
            .map(|(n, c)| format!("{n} {c:.2}s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let history = loader.autotune_history();
    if !history.is_empty() {
        println!(
            "AUTOTUNE: {}",
            history
                .iter()
                .map(|s| format!("{:.2}s {}", s.at.as_secs_f64(), s.action))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(())
}
