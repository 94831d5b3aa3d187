//! Trains a CIFAR-style ResNet on candle-nn, fed by candle-wick.
//!
//! With no `--data` it trains on a built-in dataset of coloured shapes that
//! it writes once as JPEG files, so the whole input path runs: files, decode,
//! augmentation, batching, device upload. Each epoch prints the loss, the
//! accuracy, images/s and the share of step time spent waiting for data.
//!
//! `--data` takes any dataset the loader opens: an image folder, shards, a
//! Hugging Face dataset's Parquet (a file, its folder or its bucket prefix,
//! `s3://…`: the train split, and its validation or test split to evaluate);
//! `--hf-dataset org/name` reads one downloaded by `datasets` or
//! `huggingface-cli download` from the local Hugging Face cache, offline.
//!
//! With `--checkpoint DIR` it saves the weights, the step and the loader's
//! state every `--checkpoint-every` steps, at the end, and on Ctrl-C or
//! SIGTERM (the step running finishes, then it saves and exits 0; a second
//! Ctrl-C exits at once); `--resume DIR` continues from the latest one,
//! with exactly the batches the uninterrupted run would have trained on.

mod checkpoint;
mod model;
mod optim;
mod plot;
mod shapes;

use candle_core::{DType, Device, Tensor};
use candle_nn::{loss, ParamsAdamW, VarBuilder, VarMap};
use candle_wick::source::{detect, hub_files, DatasetKind, HubOptions, ImageFolder, Parquet};
use candle_wick::{open_path, Loader, Ranks, Setting, Source, Transforms};
use clap::Parser;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser, Debug)]
#[command(about = "Train a ResNet on candle-nn, fed by the wick loader")]
struct Args {
    /// ImageFolder to train on (`DIR/<class>/<image>`, or `DIR/train` and
    /// `DIR/val` beside each other). Default: the built-in shapes dataset.
    /// Or any dataset the loader opens (`candle_wick::open_path`): shards,
    /// Parquet files, a Hugging Face dataset's folder (its `train` split,
    /// its `validation` or `test` split to evaluate), a URL of any of them.
    #[arg(long, conflicts_with = "hf_dataset")]
    data: Option<PathBuf>,
    /// A Hugging Face image dataset (`org/name`) from the local Hugging Face
    /// cache (`$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`),
    /// read offline: its `train` split, and `validation` or `test`.
    #[arg(long)]
    hf_dataset: Option<String>,
    /// Classes of a dataset whose files do not name them (shards or Parquet
    /// with integer labels and no ClassLabel names).
    #[arg(long)]
    classes: Option<usize>,
    /// The class column of Parquet data (Hugging Face datasets name it
    /// `label`, `labels`, `fine_label`, ...); a dataset without it is an
    /// error that lists its columns.
    #[arg(long, default_value = "label")]
    label_column: String,
    /// Epochs to train.
    #[arg(long, default_value_t = 4)]
    epochs: u64,
    /// Stop each epoch after this many steps (0: the whole epoch).
    #[arg(long, default_value_t = 0)]
    steps: usize,
    /// Samples per step.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Training resolution.
    #[arg(long, default_value_t = 32)]
    image_size: usize,
    /// ResNet depth 6n+2: 8, 14, 20, 32, 44, 56.
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Base width of the ResNet (channels of the first stage).
    #[arg(long, default_value_t = 16)]
    width: usize,
    /// Decode workers (0: AUTOTUNE, which adds workers only while the
    /// training step waits for data, so a CPU trainer keeps its cores).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Batches prepared ahead.
    #[arg(long, default_value_t = 0)]
    prefetch: usize,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Seed of the shuffle, the augmentations and the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train on the CPU even where a GPU is available.
    #[arg(long)]
    cpu: bool,
    /// Write a Chrome trace (chrome://tracing, ui.perfetto.dev) of every
    /// batch's stages and the training steps.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Draw step time and data wait over the run as an SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write checkpoints here (model weights, step, loader state): every
    /// `--checkpoint-every` steps, at the end, and on Ctrl-C / SIGTERM.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end and on Ctrl-C).
    #[arg(long, default_value_t = 100)]
    checkpoint_every: u64,
    /// Continue the run checkpointed in this directory (its latest
    /// checkpoint); new checkpoints go there too unless `--checkpoint`
    /// names another. The other settings must be the run's (the loader
    /// refuses a state from other data or settings, saying what differs).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Append every trained sample's key to this file, a line each
    /// (`epoch<TAB>step<TAB>key`); on `--resume`, lines of steps after the
    /// checkpoint are dropped first, so the file lists what the whole run
    /// trained on.
    #[arg(long)]
    keys_log: Option<PathBuf>,
}

/// CUDA (the GPU of this rank's local rank when a launcher started one
/// process per GPU), then Metal, then the CPU; says how to get a GPU build.
fn pick_device(force_cpu: bool, ranks: &Ranks) -> Res<Device> {
    if !force_cpu && candle_core::utils::cuda_is_available() {
        if ranks.world_size() > 1 {
            return Ok(ranks.cuda_device()?);
        }
        return Ok(Device::new_cuda(0)?);
    }
    if !force_cpu && candle_core::utils::metal_is_available() {
        return Ok(Device::new_metal(0)?);
    }
    if !force_cpu {
        println!(
            "device: CPU (this build has no GPU backend: use `cargo run --release --features cuda` \
             on NVIDIA or `--features metal` on Apple silicon)"
        );
    }
    Ok(Device::Cpu)
}

/// A training or validation source.
type Data = Arc<dyn Source>;

/// The validation splits of a Hugging Face dataset, in the order tried.
const VAL_SPLITS: [&str; 3] = ["validation", "val", "test"];

/// The train and optional validation sources, and the class count.
fn datasets(args: &Args) -> Res<(Data, Option<Data>, usize)> {
    let mut hub = HubOptions::default();
    hub.parquet.label_column = Some(args.label_column.clone());
    let parquet = |p: Parquet| -> Res<(Data, usize)> {
        let classes = match (p.classes(), args.classes) {
            (_, Some(n)) => n,
            (Some(names), None) => names.len(),
            (None, None) => {
                return Err(
                    "the Parquet files name no classes (no ClassLabel): give --classes".into(),
                )
            }
        };
        println!(
            "data: Parquet, {} rows in {} row groups, {classes} classes",
            p.len(),
            p.row_groups()
        );
        Ok((Arc::new(p), classes))
    };
    // A Hugging Face dataset's train split, and its first validation split.
    let splits = |open: &dyn Fn(&str) -> candle_wick::Result<Parquet>| {
        let (train, classes) = parquet(open("train")?)?;
        let val = VAL_SPLITS
            .iter()
            .find_map(|split| open(split).ok())
            .map(|p| Arc::new(p) as Data);
        Res::Ok((train, val, classes))
    };
    if let Some(repo) = &args.hf_dataset {
        return splits(&|split| Parquet::from_hf_cache(repo, split, &hub));
    }
    let folder = |train: &Path, val: Option<PathBuf>| -> Res<(Data, Option<Data>, usize)> {
        let train = ImageFolder::new(train)?;
        let classes = train.classes().len();
        let val = val.map(ImageFolder::new).transpose()?;
        Ok((Arc::new(train), val.map(|v| Arc::new(v) as Data), classes))
    };
    let Some(path) = &args.data else {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wick-data/shapes-v1");
        let t = Instant::now();
        let (train, val) = shapes::ensure(&root, 200, 50)?;
        // Shown from the working directory when it is under it
        // (`target/wick-data/shapes-v1` from the repository's root).
        let root = root.canonicalize().unwrap_or(root);
        let shown = std::env::current_dir()
            .ok()
            .and_then(|cwd| root.strip_prefix(cwd).ok().map(|p| p.to_path_buf()))
            .unwrap_or_else(|| root.clone());
        println!(
            "data: built-in shapes, 10 classes, 2000 train + 500 val JPEGs {}x{} in {} ({:.1?})",
            shapes::SIDE,
            shapes::SIDE,
            shown.display(),
            t.elapsed()
        );
        return folder(&train, Some(val));
    };
    if path.join("train").is_dir() {
        let val = ["val", "validation", "test"]
            .iter()
            .map(|v| path.join(v))
            .find(|p| p.is_dir());
        return folder(&path.join("train"), val);
    }
    let found = detect(path)?;
    println!("data: {} ({})", found.kind.name(), found.why);
    match found.kind {
        DatasetKind::ImageFolder => folder(path, None),
        DatasetKind::Parquet => {
            // A Hugging Face dataset's folder or prefix: its own splits.
            if hub_files(path, "train", &hub).is_ok() {
                return splits(&|split| Parquet::hub(path, split, &hub));
            }
            let (train, classes) = parquet(Parquet::open_with(found.paths, hub.parquet.clone())?)?;
            Ok((train, None, classes))
        }
        _ => {
            let classes = args
                .classes
                .ok_or("shards do not name their classes: give --classes")?;
            Ok((Arc::from(open_path(path)?), None, classes))
        }
    }
}

fn main() -> Res<()> {
    let args = Args::parse();
    // One process per GPU under torchrun, mpirun or srun: each trains on
    // its share of every epoch (the model's gradients are not all-reduced
    // here: that is the training code's, e.g. with NCCL).
    let ranks = Ranks::from_env()?;
    if ranks.world_size() > 1 {
        println!(
            "rank {} of {} ({}), local rank {:?}",
            ranks.rank(),
            ranks.world_size(),
            ranks.launcher().unwrap_or("explicit"),
            ranks.local_rank()
        );
    }
    let device = pick_device(args.cpu, &ranks)?;
    if !device.is_cpu() {
        println!("device: {device:?}");
    }
    let (train_set, val_set, classes) = datasets(&args)?;
    let workers = args.workers;
    let builder = |src: Data| {
        Loader::builder(src)
            .batch_size(args.batch_size)
            .image_size(args.image_size)
            .workers(Setting::auto_if_zero(workers))
            .prefetch(Setting::auto_if_zero(args.prefetch))
            .device(device.clone())
            .ranks(ranks)
    };
    let train_tf = if args.data.is_none() && args.hf_dataset.is_none() {
        // Small synthetic images: milder crops than ImageNet's 8% minimum.
        Transforms::RandomResizedCrop {
            scale: (0.5, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip: true,
        }
    } else {
        Transforms::train()
    };
    // Every rank resumes from the one checkpoint (its loader state is the
    // run's, for any world size: an elastic resume), which rank 0 alone
    // writes, as data-parallel training saves its replicas' one model.
    let resumed = args.resume.as_deref().map(checkpoint::latest).transpose()?;
    let mut train = builder(train_set)
        .transforms(train_tf)
        .shuffle(args.seed)
        .trace(args.trace.is_some());
    if let Some((_, saved)) = &resumed {
        train = train.resume(saved.loader.clone());
    }
    let mut train = train.build()?;
    let trace = train.trace();
    let mut val = match val_set {
        Some(v) => Some(builder(v).eval_transforms().build()?),
        None => None,
    };

    let mut varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    if args.depth < 8 || (args.depth - 2) % 6 != 0 {
        return Err(format!("--depth must be 6n+2 (8, 14, 20, ...), got {}", args.depth).into());
    }
    let model = model::ResNet::new((args.depth - 2) / 6, args.width, classes, vb)?;
    let mut step = 0;
    if let Some((folder, saved)) = &resumed {
        varmap.load(folder.join("model.safetensors"))?;
        step = saved.step;
        if let Some(log) = &args.keys_log {
            checkpoint::truncate_keys_log(log, step)?;
        }
        println!(
            "resumed: {} at step {step}, epoch {} batch {}",
            folder.display(),
            saved.loader.epoch,
            saved.loader.batch
        );
    }
    let checkpoints = args
        .checkpoint
        .clone()
        .or(args.resume.clone())
        .filter(|_| ranks.rank() == 0);
    let mut keys_log = match &args.keys_log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
        None => None,
    };
    // Ctrl-C / SIGTERM ask the loop to stop after the step running; a
    // second one exits at once.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())?;
        signal_hook::flag::register(signal, stop.clone())?;
    }
    let mut opt = optim::AdamW::new(
        &varmap,
        ParamsAdamW {
            lr: args.lr,
            weight_decay: 5e-4,
            ..Default::default()
        },
    )?;
    if let Some((folder, saved)) = &resumed {
        // One optimizer step a training step: its count is the step.
        let path = folder.join(checkpoint::OPTIMIZER);
        opt.load(&path, saved.step)
            .map_err(|e| format!("checkpoint {}: {e}", path.display()))?;
    }
    let steps_per_epoch = if args.steps == 0 {
        train.len()
    } else {
        args.steps.min(train.len())
    };
    println!(
        "model: ResNet-{} width {}, {} classes; {} train images, batch {}, {} steps/epoch, decode workers {}",
        args.depth,
        args.width,
        classes,
        train.batches(0).iter().map(Vec::len).sum::<usize>(),
        args.batch_size,
        steps_per_epoch,
        if workers == 0 { "AUTOTUNE".to_string() } else { workers.to_string() }
    );
    let mut timeline = plot::Timeline::default();

    // Where the loader resumes: the state's own point, which an elastic
    // resume (another world size) moves; `train.epoch(e)` starts there for
    // the saved epoch.
    let (first_epoch, first_batch) = if resumed.is_some() {
        let at = train.state();
        (at.epoch, at.batch)
    } else {
        (0, 0)
    };
    let mut last_state = None;
    // The step of the last checkpoint this run saved, and its folder.
    let mut last_saved = None;
    for epoch in first_epoch..args.epochs {
        let (mut wait, mut compute) = (Duration::ZERO, Duration::ZERO);
        let (mut loss_sum, mut correct, mut seen) = (0.0f64, 0u64, 0u64);
        let start = Instant::now();
        let first = if epoch == first_epoch { first_batch } else { 0 };
        let mut batches = train.epoch(epoch);
        for _ in first..steps_per_epoch {
            let t0 = Instant::now();
            let Some(batch) = batches.next() else { break };
            let batch = batch?;
            let t1 = Instant::now();
            wait += t1 - t0;
            let logits = model.forward_t(batch.images()?, true)?;
            let loss = loss::cross_entropy(&logits, batch.labels()?)?;
            opt.backward_step(&loss)?;
            // Reading the scalars waits for the device, so the step time is real.
            loss_sum += loss.to_scalar::<f32>()? as f64 * batch.len() as f64;
            correct += count_correct(&logits, batch.labels()?)?;
            seen += batch.len() as u64;
            let t2 = Instant::now();
            compute += t2 - t1;
            if let Some(trace) = &trace {
                trace.span("train step", t1, t2);
            }
            timeline.push(epoch, t1 - t0, t2 - t1);
            if let Some(log) = keys_log.as_mut() {
                let lines: String = batch
                    .keys
                    .iter()
                    .map(|k| format!("{epoch}\t{step}\t{k}\n"))
                    .collect();
                log.write_all(lines.as_bytes())?;
            }
            step += 1;
            let state = batch.state();
            let interrupted = stop.load(std::sync::atomic::Ordering::Relaxed);
            if let Some(dir) = &checkpoints {
                let every = args.checkpoint_every;
                if interrupted || (every > 0 && step % every == 0) {
                    let saved = checkpoint::Saved {
                        step,
                        loader: state.clone(),
                    };
                    last_saved = Some((step, checkpoint::save(dir, &varmap, &opt, &saved)?));
                }
            }
            if interrupted {
                match &checkpoints {
                    Some(dir) => println!(
                        "interrupted: checkpoint at step {step} in {} (continue with --resume {})",
                        dir.display(),
                        dir.display()
                    ),
                    None => println!("interrupted at step {step} (no --checkpoint: nothing saved)"),
                }
                return Ok(());
            }
            last_state = Some(state);
        }
        drop(batches);
        let elapsed = start.elapsed();
        let val_acc = match val.as_mut() {
            Some(v) => Some(evaluate(&model, v)?),
            None => None,
        };
        let steps = seen.div_ceil(args.batch_size as u64).max(1);
        println!(
            "epoch {epoch}: loss {:.3}  train acc {:.1}%  {}images/s {:.0}  step {:.1} ms  data wait {:.1}% of step time",
            loss_sum / seen.max(1) as f64,
            100.0 * correct as f64 / seen.max(1) as f64,
            val_acc.map_or(String::new(), |a| format!("val acc {:.1}%  ", 100.0 * a)),
            seen as f64 / elapsed.as_secs_f64(),
            1e3 * compute.as_secs_f64() / steps as f64,
            100.0 * wait.as_secs_f64() / (wait + compute).as_secs_f64().max(1e-9),
        );
        let (f, p) = train.queue_depths();
        println!(
            "  loader: {} workers, {f} in flight, prefetch {p}; {}",
            train.workers(),
            train.stats().verdict
        );
    }
    if let (Some(dir), Some(state)) = (&checkpoints, last_state) {
        // Not saved again when the last periodic save was this step.
        let folder = match last_saved {
            Some((saved, folder)) if saved == step => folder,
            _ => {
                let saved = checkpoint::Saved {
                    step,
                    loader: state,
                };
                checkpoint::save(dir, &varmap, &opt, &saved)?
            }
        };
        println!("checkpoint: {}", folder.display());
    }
    println!("loader report:\n{}", train.stats().report());
    if let (Some(path), Some(trace)) = (&args.trace, &trace) {
        trace.write_chrome_json(path)?;
        println!(
            "trace: {} (open in chrome://tracing or ui.perfetto.dev)",
            path.display()
        );
    }
    if let Some(path) = &args.plot {
        timeline.draw(path, &format!("ResNet-{} on {:?}", args.depth, device))?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

fn count_correct(logits: &Tensor, labels: &Tensor) -> candle_core::Result<u64> {
    let pred = logits.argmax(1)?;
    pred.eq(labels)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()
        .map(|v| v as u64)
}

fn evaluate(model: &model::ResNet, loader: &mut Loader) -> Res<f64> {
    let (mut correct, mut seen) = (0u64, 0u64);
    for batch in loader.epoch(0) {
        let batch = batch?;
        let logits = model.forward_t(batch.images()?, false)?;
        correct += count_correct(&logits, batch.labels()?)?;
        seen += batch.len() as u64;
    }
    Ok(correct as f64 / seen.max(1) as f64)
}
