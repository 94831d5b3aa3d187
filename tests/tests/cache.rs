//! `cache` and `cache_to`: the first epoch fills the cache, later epochs
//! read nothing from the source, batches are bit-identical to an uncached
//! run (keys included), and what does not fit the budget stays uncached (no eviction).

use candle_wick::source::{ImageFolder, Record};
use candle_wick::{CacheMode, Loader, Output, Source, Transforms};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A source that counts its reads.
struct Counting(ImageFolder, Arc<AtomicUsize>);

impl Source for Counting {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read(&self, i: usize) -> candle_wick::Result<Record> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.read(i)
    }
}

fn run(
    root: &std::path::Path,
    cache: Option<(CacheMode, Option<std::path::PathBuf>)>,
    budget: u64,
) -> (Vec<Vec<u8>>, Vec<usize>, u64) {
    let (images, reads, stats) = run_then(root, cache, budget, &|| {});
    (images, reads, stats.cache_bytes)
}

/// [`run`], calling `after_first` once epoch 0 has filled the cache.
fn run_then(
    root: &std::path::Path,
    cache: Option<(CacheMode, Option<std::path::PathBuf>)>,
    budget: u64,
    after_first: &dyn Fn(),
) -> (Vec<Vec<u8>>, Vec<usize>, candle_wick::stats::Stats) {
    let reads = Arc::new(AtomicUsize::new(0));
    let mut b = Loader::builder(Counting(ImageFolder::new(root).unwrap(), reads.clone()))
        .batch_size(4)
        .image_size(16)
        .transforms(Transforms::train())
        .output(Output::U8Nhwc)
        .shuffle(3)
        .shard(0, 1)
        .ram_budget(budget);
    match cache {
        Some((mode, None)) => b = b.cache(mode),
        Some((mode, Some(path))) => b = b.cache_to(path, mode),
        None => {}
    }
    let mut l = b.build().unwrap();
    let mut images = Vec::new();
    let mut per_epoch = Vec::new();
    for epoch in 0..3 {
        let before = reads.load(Ordering::Relaxed);
        for batch in l.epoch(epoch) {
            let batch = batch.unwrap();
            let mut seen = tests::pixels(&batch);
            // The keys too: a cache hit must name the sample as a read does
            // (`Counting` keeps `Source::key`'s default, not the path).
            seen.extend(batch.keys.join("\n").into_bytes());
            images.push(seen);
        }
        per_epoch.push(reads.load(Ordering::Relaxed) - before);
        if epoch == 0 {
            after_first();
        }
    }
    (images, per_epoch, l.stats())
}

/// 18 PNGs in 2 classes. PNG, because with the `turbojpeg` feature an
/// uncached JPEG is decoded crop-window-only by libjpeg-turbo while a
/// decoded cache holds the full decode: bit-identical batches hold for every
/// decoder only for PNGs. (wick's own window decoder resamples through the
/// same window either way: see the JPEG test below.)
fn png_folder(root: &std::path::Path) {
    for i in 0..18u32 {
        let dir = root.join(format!("class{}", i % 2));
        std::fs::create_dir_all(&dir).unwrap();
        let img = tests::pattern(30 + (i % 7) * 5, 26 + (i % 5) * 6, i);
        std::fs::write(
            dir.join(format!("{i:02}.png")),
            tests::encode(&img, image::ImageFormat::Png),
        )
        .unwrap();
    }
}

#[test]
fn cached_epochs_read_nothing_and_match_uncached_batches() {
    let dir = tempfile::tempdir().unwrap();
    png_folder(dir.path());
    let (plain, reads, _) = run(dir.path(), None, 1 << 30);
    assert_eq!(reads, [18, 18, 18]);
    for mode in [CacheMode::Encoded, CacheMode::Decoded] {
        let (imgs, reads, bytes) = run(dir.path(), Some((mode, None)), 1 << 30);
        assert_eq!(reads, [18, 0, 0], "{mode:?}");
        assert_eq!(imgs, plain, "{mode:?}: same batches as without a cache");
        assert!(bytes > 0);
        let file = dir.path().join(format!("{mode:?}.cache"));
        let (imgs, reads, _) = run(dir.path(), Some((mode, Some(file.clone()))), 1 << 30);
        assert_eq!(reads, [18, 0, 0], "{mode:?} on disk");
        assert_eq!(imgs, plain);
        assert!(std::fs::metadata(&file).unwrap().len() > 0);
    }
}

/// A cache file that fails under the loader (cut short, or giving other
/// bytes back) changes nothing in the batches: each entry that cannot be
/// read back, or fails its CRC, is read from the source as an uncached run
/// would, and counted.
#[test]
fn an_unreadable_disk_cache_entry_is_read_from_its_source() {
    let dir = tempfile::tempdir().unwrap();
    png_folder(dir.path());
    let (plain, _, _) = run(dir.path(), None, 1 << 30);
    let file = dir.path().join("damaged.cache");
    type Damage = fn(&std::path::Path);
    let cut: Damage = |f| {
        let len = std::fs::metadata(f).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(f)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
    };
    let flip: Damage = |f| {
        let mut bytes = std::fs::read(f).unwrap();
        for b in bytes.iter_mut().step_by(97) {
            *b ^= 0x5A;
        }
        // Written in place: the loader's open handle reads the new bytes.
        use std::io::{Seek, Write};
        let mut h = std::fs::OpenOptions::new().write(true).open(f).unwrap();
        h.seek(std::io::SeekFrom::Start(0)).unwrap();
        h.write_all(&bytes).unwrap();
    };
    for (name, damage) in [("cut", cut), ("flipped", flip)] {
        for mode in [CacheMode::Encoded, CacheMode::Decoded] {
            let cache = Some((mode, Some(file.clone())));
            let (imgs, reads, stats) = run_then(dir.path(), cache, 1 << 30, &|| damage(&file));
            assert_eq!(
                imgs, plain,
                "{name} {mode:?}: the batches of an uncached run"
            );
            assert!(
                reads[1] > 0 && reads[1] == reads[2],
                "{name} {mode:?}: {reads:?}"
            );
            assert_eq!(stats.cache_errors, 2 * reads[1] as u64, "{name} {mode:?}");
            let e = stats.cache_error.unwrap();
            assert!(e.contains("damaged.cache"), "{e}");
        }
    }
}

/// A decoded cache gives the batches of the uncached run (crop windows
/// only), bit for bit, in every build (with `turbojpeg` it keeps JPEGs
/// encoded and reads nothing more).
#[test]
fn cached_jpegs_match_uncached_window_decodes() {
    let dir = tempfile::tempdir().unwrap();
    tests::image_folder(dir.path(), 2, 9);
    let (plain, _, _) = run(dir.path(), None, 1 << 30);
    let (cached, reads, _) = run(dir.path(), Some((CacheMode::Decoded, None)), 1 << 30);
    assert_eq!(reads, [18, 0, 0]);
    assert_eq!(cached, plain);
}

#[test]
fn what_does_not_fit_stays_uncached() {
    let dir = tempfile::tempdir().unwrap();
    tests::image_folder(dir.path(), 2, 9);
    // Room for the batch buffers, the decode scratch (the JPEG decoder's
    // Huffman tables are ~27 KB a thread) and a few decoded 30..60 px
    // images only.
    let budget = 100_000;
    let (_, reads, bytes) = run(dir.path(), Some((CacheMode::Decoded, None)), budget);
    assert!(bytes > 0 && bytes < budget, "{bytes}");
    assert!(reads[1] > 0 && reads[1] < 18, "{reads:?}");
    assert_eq!(
        reads[1], reads[2],
        "no eviction: the same samples miss every epoch"
    );
}

/// Everything a run yields for damaged JPEGs under the skip policy: each
/// batch's pixels, keys and skipped keys, epochs 0..3.
fn damaged_run(
    root: &std::path::Path,
    cache: Option<CacheMode>,
) -> Vec<(Vec<u8>, Vec<String>, Vec<String>)> {
    let mut b = Loader::builder(ImageFolder::new(root).unwrap())
        .batch_size(4)
        .image_size(32)
        .transforms(Transforms::train())
        .output(Output::U8Nhwc)
        .shuffle(3)
        .shard(0, 1)
        .workers(2)
        .bad_samples(candle_wick::BadSamples::Skip);
    if let Some(mode) = cache {
        b = b.cache(mode);
    }
    let mut l = b.build().unwrap();
    let mut out = Vec::new();
    for epoch in 0..3 {
        for batch in l.epoch(epoch) {
            let batch = batch.unwrap();
            let px = tests::pixels(&batch);
            let skipped = batch.skipped.into_iter().map(|s| s.key).collect();
            out.push((px, batch.keys, skipped));
        }
    }
    out
}

/// JPEGs cut to 70% of their bytes: crop windows above the damage decode,
/// full decodes do not. A decoded cache must not change which samples
/// succeed nor their pixels (it caches the file's bytes for those).
#[test]
fn damaged_jpegs_give_the_same_batches_cached_or_not() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..18u32 {
        let d = dir.path().join(format!("class{}", i % 2));
        std::fs::create_dir_all(&d).unwrap();
        let img = tests::pattern(403, 354, i);
        let mut bytes = tests::encode(&img, image::ImageFormat::Jpeg);
        bytes.truncate(bytes.len() * 7 / 10);
        std::fs::write(d.join(format!("{i:02}.jpg")), bytes).unwrap();
    }
    let plain = damaged_run(dir.path(), None);
    let kept: usize = plain.iter().map(|b| b.1.len()).sum();
    assert!(kept > 0, "some crop windows decode");
    for mode in [CacheMode::Decoded, CacheMode::Encoded] {
        assert!(
            damaged_run(dir.path(), Some(mode)) == plain,
            "{mode:?}: batches differ"
        );
    }
}
