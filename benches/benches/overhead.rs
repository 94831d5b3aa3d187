//! The pipeline's own overhead and its parallel efficiency, from
//! alternating rounds on 500 ImageNet-like JPEGs (RandomResizedCrop 224 +
//! flip, u8, batch 64).
//!
//! Criterion (`loader` bench) times one configuration after another, so a
//! machine whose speed drifts between them (shared cloud cores) biases the
//! ratios. Here every round runs each configuration for one epoch, back to
//! back in a rotating order, a ratio is taken within each round, and the
//! median of the rounds is reported:
//! - overhead: loader (2 workers) / bare rayon `par_iter` on 2 threads with
//!   one reused slot per thread, and / the same into fresh batch buffers;
//! - efficiency: loader with 2 workers / twice the loader with 1.
//!
//! `WICK_BENCH_QUICK=1` (what CI runs) takes 120 images and 3 rounds: a
//! throughput line per change in seconds, too short for the 95% claim.

use candle_wick::__bench::ImageTransform;
use candle_wick::source::ImageFolder;
use std::time::Instant;

/// Images and rounds: the full run, or CI's quick one.
fn size() -> (usize, usize) {
    match std::env::var_os("WICK_BENCH_QUICK") {
        Some(_) => (120, 3),
        None => (500, 15),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (count, rounds) = size();
    let dir = benches::imagenet_like(&benches::data_root(), count).expect("bench dataset");
    let mut one = benches::rrc_u8_loader(&dir, 1);
    let mut two = benches::rrc_u8_loader(&dir, 2);
    let source = ImageFolder::new(&dir).expect("bench folder");
    let transform: ImageTransform = two.transform().expect("the built-in image map").clone();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("rayon pool");
    let names = [
        "loader, 1 worker",
        "loader, 2 workers",
        "bare par_iter, 2 threads",
        "bare par_iter into batches",
    ];
    // Images per second of each configuration, per round.
    let mut rates = vec![Vec::new(); names.len()];
    for round in 0..=rounds {
        let epoch = round as u64;
        let mut this = [0f64; 4];
        for k in 0..names.len() {
            let which = (k + round) % names.len();
            let t = Instant::now();
            match which {
                0 | 1 => {
                    let l = if which == 0 { &mut one } else { &mut two };
                    let n: usize = l.epoch(epoch).map(|b| b.expect("batch").len()).sum();
                    assert_eq!(n, count);
                }
                2 => benches::bare_par_iter(&pool, &source, &transform, epoch),
                _ => drop(benches::bare_par_iter_into_batches(
                    &pool, &source, &transform, epoch,
                )),
            }
            this[which] = count as f64 / t.elapsed().as_secs_f64();
        }
        // Round 0 warms caches, pools and the loaders' autotuning state.
        if round > 0 {
            for (r, v) in rates.iter_mut().zip(this) {
                r.push(v);
            }
        }
    }
    println!("{rounds} alternating rounds of one epoch ({count} images) each; medians:");
    for (name, r) in names.iter().zip(&rates) {
        println!("  {name:<28} {:>6.0} images/s", median(r.clone()));
    }
    let ratio = |a: usize, b: usize, k: f64| {
        median(
            rates[a]
                .iter()
                .zip(&rates[b])
                .map(|(x, y)| x / (k * y))
                .collect(),
        )
    };
    println!(
        "overhead: loader = {:.1}% of bare par_iter, {:.1}% of bare par_iter into batches",
        100.0 * ratio(1, 2, 1.0),
        100.0 * ratio(1, 3, 1.0)
    );
    println!(
        "parallel efficiency (2 workers / 2x 1 worker): {:.2}",
        ratio(1, 0, 2.0)
    );
}
