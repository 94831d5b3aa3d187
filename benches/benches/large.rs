//! Large photos on one core: 24 photo-like JPEGs of 2-3 MP (quality 90,
//! 4:4:4 baseline; `benches::large_photos`), each round timing, per image:
//!
//! - the full decode by wick's own decoder and, in a build with
//!   `--features candle-wick/turbojpeg`, by libjpeg-turbo (the anchor of
//!   the entropy decoder's speed);
//! - RandomResizedCrop 224 + flip and resize 256 + centre crop 224, u8 and
//!   f32, decode included (the default build decodes the crop's window at
//!   a DCT scale; the turbojpeg build hands the same to libjpeg-turbo).
//!
//! Rounds alternate the measurements; the medians of 7 rounds (3 quick)
//! are printed as images/s and as ratios. Run it in both builds to compare
//! the default with libjpeg-turbo's crop + DCT-scaling path:
//!
//! ```text
//! cargo bench -p benches --bench large
//! cargo bench -p benches --bench large --features turbojpeg
//! ```
//!
//! `WICK_BENCH_ONLY=wick` (or `turbo`) runs one decoder's full decode
//! alone for 10 s, for `perf record`; `WICK_BENCH_ONLY="eval f32"` one
//! pipeline. `WICK_LARGE_DIR=DIR` reads the
//! photos of `DIR`'s class folders `n00`..`n09` instead (for example the
//! 4:2:0 set `benches/peers/run.sh COUNT large` writes to
//! `target/bench-data/large-COUNT`).

use candle_wick::__bench::{decode_rgb_into, HostLayout, ImageTransform, Slot, JPEG_DECODER};
use candle_wick::{Size, Transforms, IMAGENET_MEAN, IMAGENET_STD};
use std::hash::{Hash, Hasher};
use std::time::Instant;

fn quick() -> bool {
    std::env::var_os("WICK_BENCH_QUICK").is_some()
}

fn load(count: usize) -> Vec<Vec<u8>> {
    let dir = match std::env::var_os("WICK_LARGE_DIR") {
        Some(dir) => dir.into(),
        None => benches::large_photos(&benches::data_root(), count).expect("bench dataset"),
    };
    let mut files: Vec<_> = (0..10)
        .flat_map(|c| std::fs::read_dir(dir.join(format!("n{c:02}"))).expect("class folder"))
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect()
}

/// Images per second of `f` over every photo.
fn rate(jpegs: &[Vec<u8>], mut f: impl FnMut(usize, &[u8])) -> f64 {
    let t = Instant::now();
    for (i, j) in jpegs.iter().enumerate() {
        f(i, j);
    }
    jpegs.len() as f64 / t.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (count, rounds) = if quick() { (6, 3) } else { (24, 7) };
    let jpegs = load(count);
    let mb = jpegs.iter().map(Vec::len).sum::<usize>() as f64 / jpegs.len() as f64 / 1e6;
    println!(
        "large photos: {} JPEGs, mean {mb:.2} MB; JPEG decoder: {JPEG_DECODER}; one thread",
        jpegs.len()
    );
    let float = HostLayout::F32Nchw {
        mean: IMAGENET_MEAN,
        std: IMAGENET_STD,
    };
    let size = Size::new(224, 224);
    let t = |tr, out| ImageTransform::new(tr, out, size, 0).expect("transform");
    let pipelines = [
        ("RRC u8", t(Transforms::train(), HostLayout::U8Nhwc)),
        ("RRC f32", t(Transforms::train(), float)),
        ("eval u8", t(Transforms::eval(224), HostLayout::U8Nhwc)),
        ("eval f32", t(Transforms::eval(224), float)),
    ];
    let mut names = vec!["full decode, wick"];
    if cfg!(feature = "turbojpeg") {
        names.push("full decode, libjpeg-turbo");
    }
    names.extend(pipelines.iter().map(|(n, _)| *n));
    let mut rates = vec![Vec::new(); names.len()];
    let mut px = Vec::new();
    let mut u8s = vec![0u8; 224 * 224 * 3];
    let mut f32s = vec![0f32; 224 * 224 * 3];
    // For profiling: `WICK_BENCH_ONLY=wick` (or `turbo`, in a turbojpeg
    // build) runs only that full decode, and `WICK_BENCH_ONLY="RRC u8"`
    // (any pipeline's name) only that pipeline, for 10 s. It prints a
    // digest of the first pass's output, to check that a change to the
    // decoder keeps its output.
    let only = std::env::var("WICK_BENCH_ONLY").unwrap_or_default();
    if !only.is_empty() {
        let pipeline = pipelines.iter().find(|(n, _)| *n == only).map(|(_, p)| p);
        let t = Instant::now();
        let mut n = 0usize;
        let mut digest = std::hash::DefaultHasher::new();
        while t.elapsed().as_secs() < 10 {
            for (i, j) in jpegs.iter().enumerate() {
                let first = n < jpegs.len();
                match (only.as_str(), pipeline) {
                    (_, Some(p)) => {
                        let slot = if only.ends_with("u8") {
                            Slot::U8(&mut u8s)
                        } else {
                            Slot::F32(&mut f32s)
                        };
                        p.apply("large", j, i as u64, i, slot).expect("transform");
                        if first {
                            u8s.hash(&mut digest);
                            f32s.iter().for_each(|v| v.to_bits().hash(&mut digest));
                        }
                    }
                    #[cfg(feature = "turbojpeg")]
                    ("turbo", None) => {
                        let (w, h) = candle_wick::__bench::turbo_whole(j, &mut px).expect("decode");
                        if first {
                            px[..w * h * 3].hash(&mut digest);
                        }
                    }
                    ("wick", None) => {
                        let s = decode_rgb_into("large", j, &mut px).expect("decode");
                        if first {
                            px[..s.width * s.height * 3].hash(&mut digest);
                        }
                    }
                    (other, None) => panic!("WICK_BENCH_ONLY={other}: wick, turbo or a pipeline"),
                }
                n += 1;
            }
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        let digest = digest.finish();
        println!("large photos, {only} only: {rate:.1} images/s (output digest {digest:016x})");
        return;
    }
    for round in 0..rounds {
        let mut k = 0;
        rates[k].push(rate(&jpegs, |_, j| {
            decode_rgb_into("large", j, &mut px).expect("decode");
        }));
        k += 1;
        #[cfg(feature = "turbojpeg")]
        {
            rates[k].push(rate(&jpegs, |_, j| {
                candle_wick::__bench::turbo_whole(j, &mut px).expect("libjpeg-turbo decode");
            }));
            k += 1;
        }
        for (name, p) in &pipelines {
            let r = rate(&jpegs, |i, j| {
                let slot = if name.ends_with("u8") {
                    Slot::U8(&mut u8s)
                } else {
                    Slot::F32(&mut f32s)
                };
                p.apply("large", j, round as u64, i, slot)
                    .expect("transform");
            });
            rates[k].push(r);
            k += 1;
        }
    }
    let meds: Vec<f64> = rates.iter_mut().map(|r| median(r)).collect();
    for (name, m) in names.iter().zip(&meds) {
        println!("large photos, {name}: {m:.1} images/s (median of {rounds} rounds)");
    }
    if cfg!(feature = "turbojpeg") {
        println!(
            "large photos: wick's full decode = {:.1}% of libjpeg-turbo's speed",
            100.0 * meds[0] / meds[1]
        );
    }
}
