//! A decoded cache does not change which damaged JPEGs decode nor their
//! pixels. Its own binary: the large decodes raise the process-wide decode
//! scratch that `cache.rs`'s small-budget test counts.

use candle_wick::{CacheMode, ImageFolder, Loader, Output, Transforms};

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
            let px = batch.images.flatten_all().unwrap().to_vec1::<u8>().unwrap();
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
