//! Datasets for wick's benchmarks, generated on the fly and cached on disk.

use image::{codecs::jpeg::JpegEncoder, Rgb, RgbImage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// One "photo-like" image: a smooth four-corner colour field, a dozen
/// overlapping ellipses and rectangles with soft shading, and sensor-like
/// noise, so JPEG size and decode cost resemble a downscaled ImageNet photo
/// rather than a flat synthetic frame.
pub fn photo_like(width: u32, height: u32, seed: u64) -> RgbImage {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let corners: [[f32; 3]; 4] =
        std::array::from_fn(|_| std::array::from_fn(|_| rng.random_range(20.0..235.0)));
    let shapes: Vec<(bool, f32, f32, f32, f32, [f32; 3])> = (0..rng.random_range(6..14))
        .map(|_| {
            (
                rng.random_bool(0.5),
                rng.random_range(0.0..width as f32),
                rng.random_range(0.0..height as f32),
                rng.random_range(10.0..width as f32 / 3.0),
                rng.random_range(10.0..height as f32 / 3.0),
                std::array::from_fn(|_| rng.random_range(0.0..255.0)),
            )
        })
        .collect();
    let mut img = RgbImage::new(width, height);
    for (x, y, p) in img.enumerate_pixels_mut() {
        let (u, v) = (x as f32 / width as f32, y as f32 / height as f32);
        let mut c: [f32; 3] = std::array::from_fn(|i| {
            corners[0][i] * (1.0 - u) * (1.0 - v)
                + corners[1][i] * u * (1.0 - v)
                + corners[2][i] * (1.0 - u) * v
                + corners[3][i] * u * v
        });
        for &(ellipse, cx, cy, rx, ry, col) in &shapes {
            let (dx, dy) = ((x as f32 - cx) / rx, (y as f32 - cy) / ry);
            let inside = if ellipse {
                dx * dx + dy * dy <= 1.0
            } else {
                dx.abs() <= 1.0 && dy.abs() <= 1.0
            };
            if inside {
                let shade = 0.75 + 0.25 * (dx * 0.7 + dy * 0.3);
                c = std::array::from_fn(|i| col[i] * shade);
            }
        }
        let noise = rng.random_range(-6.0..6.0f32);
        *p = Rgb(c.map(|v| (v + noise + rng.random_range(-3.0..3.0f32)).clamp(0.0, 255.0) as u8));
    }
    img
}

/// An ImageFolder of `count` photo-like JPEGs (quality 90) in 10 classes,
/// sizes around 400x350 (300..500 x 250..450), under `root`. Written once;
/// a marker file makes later calls free.
pub fn imagenet_like(root: &Path, count: usize) -> std::io::Result<PathBuf> {
    let dir = root.join(format!("imagenet-like-{count}"));
    photo_folder(&dir, count, (300..=500, 250..=450), 1_000_000)
}

/// An ImageFolder of `count` large photo-like JPEGs (quality 90, 4:4:4:
/// the `image` crate's encoder does not subsample chroma; the peers'
/// `make_dataset.py large` writes 4:2:0 ones),
/// 2-3 MP (1,800..2,200 x 1,150..1,450: COCO and OpenImages originals,
/// phone photos sized for the web), under `root`. Written once.
pub fn large_photos(root: &Path, count: usize) -> std::io::Result<PathBuf> {
    let dir = root.join(format!("large-like-{count}"));
    photo_folder(&dir, count, (1800..=2200, 1150..=1450), 2_000_000)
}

/// `count` photo-like JPEGs of sizes drawn from `sizes` in 10 class
/// folders of `dir`, image `i` drawn from seed `seed + i`.
fn photo_folder(
    dir: &Path,
    count: usize,
    sizes: (std::ops::RangeInclusive<u32>, std::ops::RangeInclusive<u32>),
    seed: u64,
) -> std::io::Result<PathBuf> {
    let marker = dir.join(".complete");
    if marker.exists() {
        return Ok(dir.into());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    for c in 0..10 {
        std::fs::create_dir_all(dir.join(format!("n{c:02}")))?;
    }
    (0..count)
        .into_par_iter()
        .try_for_each(|i| -> std::io::Result<()> {
            let mut rng = ChaCha8Rng::seed_from_u64(i as u64);
            let (w, h) = (
                rng.random_range(sizes.0.clone()),
                rng.random_range(sizes.1.clone()),
            );
            let img = photo_like(w, h, i as u64 + seed);
            let path = dir.join(format!("n{:02}/{i:05}.jpg", i % 10));
            let file = std::io::BufWriter::new(std::fs::File::create(path)?);
            JpegEncoder::new_with_quality(file, 90)
                .encode_image(&img)
                .map_err(std::io::Error::other)
        })?;
    std::fs::write(marker, b"")?;
    Ok(dir.into())
}

/// Where benchmark datasets are cached: `target/bench-data` of the workspace.
pub fn data_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data")
}

/// The loader's per-sample work (read, decode, transform) with no pool,
/// queue or prefetch: a bare rayon `par_iter` over the samples of `source`
/// on `pool`, each thread writing into one reused slot.
pub fn bare_par_iter(
    pool: &rayon::ThreadPool,
    source: &impl candle_wick::Source,
    transform: &candle_wick::__bench::ImageTransform,
    epoch: u64,
) {
    pool.install(|| {
        (0..source.len()).into_par_iter().for_each_init(
            || vec![0u8; transform.slot_len()],
            |slot, i| {
                let r = source.read(i).expect("read");
                transform
                    .apply(
                        &r.key,
                        &r.bytes,
                        epoch,
                        i,
                        candle_wick::__bench::Slot::U8(slot),
                    )
                    .expect("transform");
            },
        )
    })
}

/// [`bare_par_iter`], but written into fresh buffers of 64 samples, as a
/// loader that hands every batch over as a tensor must: it pays for
/// first-touching new memory, which one reused slot per thread never does.
pub fn bare_par_iter_into_batches(
    pool: &rayon::ThreadPool,
    source: &impl candle_wick::Source,
    transform: &candle_wick::__bench::ImageTransform,
    epoch: u64,
) -> Vec<Vec<u8>> {
    let slot_len = transform.slot_len();
    let n = source.len();
    let mut batches: Vec<Vec<u8>> = (0..n.div_ceil(64))
        .map(|k| vec![0u8; (n - k * 64).min(64) * slot_len])
        .collect();
    pool.install(|| {
        batches
            .par_iter_mut()
            .enumerate()
            .flat_map(|(k, b)| {
                b.par_chunks_mut(slot_len)
                    .enumerate()
                    .map(move |(j, s)| (k * 64 + j, s))
            })
            .for_each(|(i, slot)| {
                let r = source.read(i).expect("read");
                transform
                    .apply(
                        &r.key,
                        &r.bytes,
                        epoch,
                        i,
                        candle_wick::__bench::Slot::U8(slot),
                    )
                    .expect("transform");
            })
    });
    batches
}

/// The benches' loader over the ImageFolder `dir`: batch 64,
/// RandomResizedCrop 224 + flip, u8, fixed shuffle seed, `workers` decode
/// workers (the other knobs on AUTOTUNE).
pub fn rrc_u8_loader(dir: &Path, workers: usize) -> candle_wick::Loader {
    candle_wick::Loader::builder(candle_wick::source::ImageFolder::new(dir).expect("bench folder"))
        .batch_size(64)
        .image_size(224)
        .train_transforms()
        .output(candle_wick::Output::U8Nhwc)
        .shuffle(0)
        .workers(workers)
        .build()
        .expect("bench loader")
}

/// This process's peak resident memory (`VmHWM` of `/proc/self/status`),
/// in MB; 0 where there is no such file.
pub fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

/// This process's private resident memory now (`RssAnon` of
/// `/proc/self/status`: the heap and stacks, not the pages of mapped
/// files, which the page cache shares between processes), in MB; 0 where
/// there is no such file.
pub fn anon_rss_mb() -> f64 {
    status_mb("RssAnon:")
}

/// The line of `/proc/self/status` starting with `key`, in MB.
fn status_mb(key: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}
