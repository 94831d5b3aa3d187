//! What a user map costs, from alternating rounds (as the overhead bench):
//!
//! 1. **A user map against the built-in image map.** The map is written
//!    against the public blocks only (`ops::Resize::decode_into` with
//!    `ops::RandomResizedCrop::draw` from `Sample::rng`, the class into a
//!    `labels` field) and does what `train_transforms()` does:
//!    RandomResizedCrop 224 + flip, u8 and normalized f32, batch 64, two
//!    workers, on 500 ImageNet-like JPEGs (or the photos under
//!    `WICK_PHOTOS`, an ImageFolder). Its batches are checked equal to the
//!    built-in's first; the ratio of images/s is taken within each round.
//! 2. **Token windows against the limit.** A `TokenSource` over a raw
//!    `u16` file of 16 M tokens, seq_len 1024, batch 32, non-overlapping
//!    windows: the loader's tokens/s against a bare loop on this thread
//!    that copies the same windows (`seq_len + 1` tokens each) from the
//!    memory map into one reused buffer; and, for reference, against a loop
//!    on this thread that builds each batch's `input` and `target` tensors
//!    from the same windows as the loader does (each window's
//!    `seq_len + 1` tokens written once, `input` and `target` two narrowed
//!    views of them, as llm.c's loader points both into one buffer), and against
//!    the least any threaded loader does: two threads that each build
//!    whole batches' tensors and send them over a bounded channel to this
//!    thread (no keys, reorder, bad-sample policy, buffer pool or
//!    AUTOTUNE). Every batch is fresh memory there as in the loader (a CPU
//!    tensor owns its buffer), which the bare loop never touches.
//!
//! `WICK_BENCH_ONLY=maps` or `tokens` runs one half. For profiling the
//! token loader: `WICK_TOKEN_BATCH` (default 32), `WICK_TOKEN_WORKERS`
//! (fixed workers, with `WICK_TOKEN_IN_FLIGHT` and `WICK_TOKEN_PREFETCH`,
//! default 8 each; AUTOTUNE without it), `WICK_TOKEN_TRACE=out.json`
//! (the loader's Chrome trace), `WICK_TOKEN_HISTORY=1` (prints AUTOTUNE's
//! steps) and `WICK_TOKEN_LOADER_ONLY=1` (times the loader alone, for
//! `perf record`). Under AUTOTUNE the loader first runs epochs for 3 s
//! (0.3 s quick), so the rounds time the settings a long run settles on,
//! not the first ones; the minor page faults per batch of each variant
//! are printed beside the rates (a CPU batch is fresh memory). `WICK_BENCH_QUICK=1`
//! (what CI runs) takes 120 images, 4 M tokens and 3
//! rounds: a throughput line per change, too short for the claims.
//!
//! ```text
//! cargo bench -p benches --bench maps
//! ```

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Map, Sample, TokenWindowsMap};
use candle_wick::ops::{RandomResizedCrop, Resize, Slot};
use candle_wick::source::{ImageFolder, TokenFile, TokenSource, WindowOrder};
use candle_wick::{Loader, Output, Size, IMAGENET_MEAN, IMAGENET_STD};
use std::path::Path;
use std::time::Instant;

fn quick() -> bool {
    std::env::var_os("WICK_BENCH_QUICK").is_some()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The built-in train transform, rebuilt from the public blocks.
fn user_map(f32_out: bool) -> impl Map {
    let size = Size::square(224);
    let resize = if f32_out {
        Resize::normalized(size, IMAGENET_MEAN, IMAGENET_STD)
    } else {
        Resize::new(size)
    }
    .expect("resize");
    let rrc = RandomResizedCrop::default();
    let image = if f32_out {
        Field::new("images", FieldType::F32, &[3, 224, 224])
    } else {
        Field::new("images", FieldType::U8, &[224, 224, 3])
    };
    let fields = vec![image, Field::new("labels", FieldType::U32, &[])];
    map_fn(fields, move |s: &mut Sample<'_>| {
        let slot = if f32_out {
            Slot::F32(s.take::<f32>(0)?)
        } else {
            Slot::U8(s.take::<u8>(0)?)
        };
        s.take::<u32>(1)?[0] = s.record().label;
        let (r, rng) = (s.record(), s.rng());
        let plan = |w, h| rrc.draw(&mut rng.clone(), w, h);
        resize
            .decode_into(s.scratch(), &r.key, &r.bytes, plan, slot)
            .map(drop)
    })
}

fn image_loaders(dir: &Path, f32_out: bool) -> (Loader, Loader) {
    let output = if f32_out {
        Output::imagenet()
    } else {
        Output::U8Nhwc
    };
    let src = || ImageFolder::new(dir).expect("bench folder");
    let builtin = Loader::builder(src())
        .batch_size(64)
        .image_size(224)
        .train_transforms()
        .output(output)
        .shuffle(0)
        .workers(2)
        .build()
        .expect("built-in loader");
    let user = Loader::builder(src())
        .map(user_map(f32_out))
        .batch_size(64)
        .shuffle(0)
        .workers(2)
        .build()
        .expect("user-map loader");
    (builtin, user)
}

fn maps_against_builtin(dir: &Path, count: usize, rounds: usize) {
    for f32_out in [false, true] {
        let (mut builtin, mut user) = image_loaders(dir, f32_out);
        // The same bytes first: the user map is the built-in's work.
        let a = builtin.epoch(0).next().expect("a batch").expect("batch");
        let b = user.epoch(0).next().expect("a batch").expect("batch");
        let bits = |t: &candle_core::Tensor| {
            let t = t.flatten_all().expect("flatten");
            if f32_out {
                t.to_vec1::<f32>()
                    .expect("f32")
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            } else {
                let v = t.to_vec1::<u8>().expect("u8");
                v.iter().map(|&x| u32::from(x)).collect()
            }
        };
        assert!(
            bits(a.images().expect("images")) == bits(b.images().expect("images")),
            "the user map's images differ from the built-in's"
        );
        let mut ratios = Vec::new();
        let mut rates = [Vec::new(), Vec::new()];
        for round in 0..=rounds {
            let mut this = [0f64; 2];
            for k in 0..2 {
                let which = (k + round) % 2;
                let l = if which == 0 { &mut builtin } else { &mut user };
                let t = Instant::now();
                let n: usize = l
                    .epoch(round as u64 + 1)
                    .map(|b| b.expect("batch").len())
                    .sum();
                assert_eq!(n, count);
                this[which] = n as f64 / t.elapsed().as_secs_f64();
            }
            if round > 0 {
                ratios.push(this[1] / this[0]);
                rates[0].push(this[0]);
                rates[1].push(this[1]);
            }
        }
        let name = if f32_out { "f32" } else { "u8" };
        println!(
            "{name}: built-in {:.0} images/s, user map {:.0} images/s: user map = {:.1}% of the \
             built-in (median of {rounds} rounds, same bytes)",
            median(rates[0].clone()),
            median(rates[1].clone()),
            100.0 * median(ratios)
        );
    }
}

fn tokens_against_bare_loop(root: &Path, tokens: usize, rounds: usize) {
    const SEQ: usize = 1024;
    let path = root.join(format!("tokens-{tokens}.bin"));
    if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(2 * tokens as u64) {
        std::fs::create_dir_all(root).expect("bench data dir");
        let bytes: Vec<u8> = (0..tokens)
            .flat_map(|i| (((i * 2_654_435_761) % 50_257) as u16).to_le_bytes())
            .collect();
        std::fs::write(&path, bytes).expect("token file");
    }
    let src = TokenSource::new(
        vec![TokenFile::open(&path).expect("token file")],
        SEQ,
        WindowOrder::NonOverlapping,
    )
    .expect("token source");
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let batch = env("WICK_TOKEN_BATCH").unwrap_or(32);
    let mut b = Loader::builder(src.clone())
        .map(TokenWindowsMap::new(&src))
        .batch_size(batch)
        .shuffle(1);
    if let Some(w) = env("WICK_TOKEN_WORKERS") {
        b = b
            .workers(w)
            .batches_in_flight(env("WICK_TOKEN_IN_FLIGHT").unwrap_or(8))
            .prefetch(env("WICK_TOKEN_PREFETCH").unwrap_or(8));
    }
    let trace = std::env::var_os("WICK_TOKEN_TRACE");
    let loader_only = std::env::var_os("WICK_TOKEN_LOADER_ONLY").is_some();
    let mut loader = b.trace(trace.is_some()).build().expect("token loader");
    // A run that lasts hours sees AUTOTUNE's steady state, not its first
    // settings (one worker, two batches in flight, one prefetched): its
    // windows are at least 0.2 s, and a round here is tens of
    // milliseconds, so the loader runs whole epochs for a while first.
    let warm = std::time::Duration::from_millis(if quick() { 300 } else { 3000 });
    let t = Instant::now();
    let mut warm_epochs = 0u64;
    while t.elapsed() < warm && env("WICK_TOKEN_WORKERS").is_none() {
        warm_epochs += 1;
        for b in loader.epoch(1000 + warm_epochs) {
            std::hint::black_box(b.expect("batch"));
        }
    }
    let (f, p) = loader.queue_depths();
    if std::env::var_os("WICK_TOKEN_HISTORY").is_some() {
        for step in loader.autotune_history() {
            println!("  {step:?}");
        }
    }
    println!(
        "tokens: AUTOTUNE warmed up for {warm_epochs} epochs ({:.1} s): {} workers, {f} batches \
         in flight, prefetch {p}",
        t.elapsed().as_secs_f64(),
        loader.workers()
    );
    let mut buf = vec![0u32; SEQ + 1];
    // Per round: the bare loop (the limit), the loader, and a loop on this
    // thread that builds each batch's `input` and `target` tensors itself
    // (as the loader does), for reference.
    let mut ratios = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut rates = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    // Minor page faults per batch, by variant: a CPU batch is fresh memory
    // (it becomes the tensor), and how much of it the allocator faults in
    // anew (memory it gave back to the kernel) moves the rates a lot.
    let mut faults = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    // One batch's `input` and `target` tensors, built on the calling
    // thread as the loader builds them: each window's `seq_len + 1` tokens
    // written once into a `[n, seq_len + 1]` tensor, and `input` / `target`
    // its two narrowed views.
    let build = |epoch: u64, indices: &[usize]| {
        let n = indices.len();
        let mut tokens = vec![0u32; n * (SEQ + 1)];
        for (row, &i) in tokens.chunks_exact_mut(SEQ + 1).zip(indices) {
            let w = src.window(1, epoch, i).expect("window");
            src.files()[w.file].read_into(w.token, row).expect("read");
        }
        let dev = &candle_core::Device::Cpu;
        let t = candle_core::Tensor::from_vec(tokens, (n, SEQ + 1), dev).expect("tokens");
        let x = t.narrow(1, 0, SEQ).expect("x");
        let y = t.narrow(1, 1, SEQ).expect("y");
        (x, y)
    };
    for round in 0..=rounds {
        let epoch = round as u64;
        let plan = loader.batches(epoch);
        let windows: Vec<usize> = plan.iter().flatten().copied().collect();
        let mut this = [0f64; 4];
        for k in 0..4 {
            let which = (k + round) % 4;
            if loader_only && which != 1 {
                continue;
            }
            let (t, f0) = (Instant::now(), minor_faults());
            match which {
                0 => {
                    for &i in &windows {
                        let w = src.window(1, epoch, i).expect("window");
                        src.files()[w.file]
                            .read_into(w.token, &mut buf)
                            .expect("read");
                        std::hint::black_box(&buf);
                    }
                }
                1 => {
                    let n: usize = loader
                        .epoch(epoch)
                        .map(|b| std::hint::black_box(b.expect("batch")).len())
                        .sum();
                    assert_eq!(n, windows.len());
                }
                2 => {
                    for indices in &plan {
                        std::hint::black_box(build(epoch, indices));
                    }
                }
                _ => {
                    // Two producers take batches in turn from a counter;
                    // this thread takes what they send.
                    let next = std::sync::atomic::AtomicUsize::new(0);
                    let (tx, rx) = crossbeam_channel::bounded(8);
                    let got = std::thread::scope(|s| {
                        for _ in 0..2 {
                            let (tx, next, plan, build) = (tx.clone(), &next, &plan, &build);
                            s.spawn(move || loop {
                                let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let Some(indices) = plan.get(b) else { break };
                                if tx.send(build(epoch, indices)).is_err() {
                                    break;
                                }
                            });
                        }
                        drop(tx);
                        rx.iter()
                            .map(|b| std::hint::black_box(b).0.dims()[0])
                            .sum::<usize>()
                    });
                    assert_eq!(got, windows.len());
                }
            }
            this[which] = (windows.len() * SEQ) as f64 / t.elapsed().as_secs_f64();
            if let (Some(a), Some(b)) = (f0, minor_faults()) {
                faults[which].push(b.saturating_sub(a) as f64 / plan.len() as f64);
            }
        }
        if round > 0 {
            ratios[0].push(this[1] / this[0]);
            ratios[1].push(this[1] / this[2]);
            ratios[2].push(this[3] / this[0]);
            ratios[3].push(this[1] / this[3]);
            for (r, v) in rates.iter_mut().zip(this) {
                r.push(v);
            }
        }
    }
    if let (Some(path), Some(trace)) = (trace, loader.trace()) {
        trace.write_chrome_json(path).expect("writing the trace");
    }
    let m = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            median(v.to_vec())
        }
    };
    println!(
        "tokens: minor page faults per batch (medians): bare loop {:.1}, loader {:.1}, one thread \
         {:.1}, two threads {:.1}; the loader ran with {} workers, {:?} (in flight, prefetch)",
        m(&faults[0]),
        m(&faults[1]),
        m(&faults[2]),
        m(&faults[3]),
        loader.workers(),
        loader.queue_depths()
    );
    if loader_only {
        println!(
            "tokens (seq_len {SEQ}, batch {batch}, {tokens} tokens), the loader alone: {:.0} M \
             tokens/s ({} workers at the end; median of {rounds} rounds)",
            m(&rates[1]) / 1e6,
            loader.workers()
        );
        return;
    }
    println!(
        "tokens (seq_len {SEQ}, batch {batch}, {tokens} tokens): bare loop {:.0} M tokens/s, loader \
         {:.0} M tokens/s ({} workers at the end): loader = {:.1}% of the bare loop (median of \
         {rounds} rounds)",
        m(&rates[0]) / 1e6,
        m(&rates[1]) / 1e6,
        loader.workers(),
        100.0 * m(&ratios[0])
    );
    println!(
        "tokens, for reference: one thread building each batch's input and target tensors {:.0} M \
         tokens/s: loader = {:.1}% of it (median of {rounds} rounds)",
        m(&rates[2]) / 1e6,
        100.0 * m(&ratios[1])
    );
    println!(
        "tokens, the ceiling of a threaded loader here: two threads building whole batches for \
         this one {:.0} M tokens/s = {:.1}% of the bare loop; the loader = {:.1}% of it (medians \
         of {rounds} rounds)",
        m(&rates[3]) / 1e6,
        100.0 * m(&ratios[2]),
        100.0 * m(&ratios[3])
    );
}

/// This process's minor page faults so far (Linux; `None` elsewhere).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 10 (minflt), counted after the command name's closing paren.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(7)?.parse().ok()
}

fn main() {
    let (count, tokens, rounds) = if quick() {
        (120, 4 << 20, 3)
    } else {
        (500, 16 << 20, 9)
    };
    let root = benches::data_root();
    let (dir, count) = match std::env::var_os("WICK_PHOTOS") {
        Some(dir) => {
            let dir = std::path::PathBuf::from(dir);
            let n = candle_wick::Source::len(&ImageFolder::new(&dir).expect("WICK_PHOTOS"));
            (dir, n)
        }
        None => (
            benches::imagenet_like(&root, count).expect("bench dataset"),
            count,
        ),
    };
    // `WICK_BENCH_ONLY=maps` or `tokens` runs one half (for profiling).
    let only = std::env::var("WICK_BENCH_ONLY").unwrap_or_default();
    if only != "tokens" {
        maps_against_builtin(&dir, count, rounds);
    }
    if only != "maps" {
        tokens_against_bare_loop(&root, tokens, rounds);
    }
}
