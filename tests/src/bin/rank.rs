//! One rank of a data-parallel job, as a launcher starts it: reads its
//! rank from the environment (torchrun, Open MPI, PMI or SLURM variables),
//! loads `DATA` and prints one JSON line with what it saw, for the
//! multi-process tests (tests/tests/ranks_processes.rs).
//!
//! ```text
//! rank DATA [batch=N] [shuffle=SEED] [epoch=E] [take=K] [save=FILE]
//!           [resume=FILE] [interleave=CYCLE] [remainder=split|drop|pad]
//! ```
//!
//! `take=K` stops after K batches; `save` writes the loader's state there
//! (`{rank}` in the name is replaced by the rank); `resume` starts from a
//! saved state. The line is
//! `{"rank":r,"world_size":w,"launcher":..,"batches":[[index,..],..],"state":{..}}`.

use candle_wick::{Loader, LoaderState, Ranks, Remainder};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rank: {}", candle_wick::error_chain(&*e));
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn run() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let data = args.next().ok_or("usage: rank DATA [key=value ..]")?;
    let mut opt = std::collections::HashMap::new();
    for a in args {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| format!("{a:?}: not key=value"))?;
        opt.insert(k.to_string(), v.to_string());
    }
    let num = |k: &str, default: u64| -> Res<u64> {
        Ok(opt
            .get(k)
            .map(|v| v.parse())
            .transpose()?
            .unwrap_or(default))
    };
    let ranks = Ranks::from_env()?;
    let mut b = Loader::builder(candle_wick::open_path(&data)?)
        .batch_size(num("batch", 4)? as usize)
        .image_size(8)
        .workers(1)
        .ranks(ranks);
    if let Some(seed) = opt.get("shuffle") {
        b = b.shuffle(seed.parse()?);
    }
    if let Some(cycle) = opt.get("interleave") {
        b = b.interleave(cycle.parse()?, 1);
    }
    b = b.remainder(match opt.get("remainder").map(String::as_str) {
        None | Some("split") => Remainder::Split,
        Some("drop") => Remainder::Drop,
        Some("pad") => Remainder::Pad,
        Some(other) => return Err(format!("remainder={other}: split, drop or pad").into()),
    });
    if let Some(file) = opt.get("resume") {
        let state: LoaderState = serde_json::from_str(&std::fs::read_to_string(file)?)?;
        b = b.resume(state);
    }
    let mut loader = b.build()?;
    let take = num("take", u64::MAX)? as usize;
    let mut batches = Vec::new();
    let epoch = opt.get("epoch").map(|e| e.parse()).transpose()?;
    let iter = match epoch {
        Some(e) => loader.epoch(e),
        None => loader.next_epoch(),
    };
    for batch in iter.take(take) {
        batches.push(batch?.indices);
    }
    let state = loader.state();
    if let Some(file) = opt.get("save") {
        let file = file.replace("{rank}", &ranks.rank().to_string());
        std::fs::write(file, serde_json::to_string(&state)?)?;
    }
    let line = serde_json::json!({
        "rank": ranks.rank(),
        "world_size": ranks.world_size(),
        "local_rank": ranks.local_rank(),
        "launcher": ranks.launcher(),
        "batches": batches,
        "state": state,
    });
    println!("{line}");
    Ok(())
}
