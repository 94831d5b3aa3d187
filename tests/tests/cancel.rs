//! Dropping an epoch after one batch returns promptly, and dropping the
//! loader leaves no loader thread alive. One test in this binary, so no
//! other test's threads are counted.

use candle_wick::Loader;
use std::time::{Duration, Instant};
use tests::{encode, pattern, wick_threads, Slow};

#[test]
fn dropping_an_epoch_mid_way_is_prompt_and_loader_drop_joins_every_thread() {
    let png = encode(&pattern(16, 16, 1), image::ImageFormat::Png);
    let mut loader = Loader::builder(Slow(png))
        .batch_size(16)
        .image_size(8)
        .workers(2)
        .prefetch(2)
        .build()
        .unwrap();
    if cfg!(target_os = "linux") {
        // feed, upload and 2 decoders; threads name themselves as they start.
        let t = Instant::now();
        while wick_threads().len() < 4 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let names = wick_threads();
        assert_eq!(names.len(), 4, "{names:?}");
    }
    let mut epoch = loader.epoch(0);
    assert_eq!(epoch.len(), 250);
    let first = epoch.next().unwrap().unwrap();
    assert_eq!(first.len(), 16);
    let t = Instant::now();
    drop(epoch);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1), "epoch drop took {took:?}");
    assert_eq!(loader.stats().batches_in_flight, 0);

    // The loader is reusable after a cancelled epoch.
    let mut epoch = loader.epoch(1);
    assert_eq!(epoch.next().unwrap().unwrap().indices[0], 0);
    drop(epoch);

    drop(loader);
    if cfg!(target_os = "linux") {
        let left = tests::wick_threads_settled(0);
        assert!(left.is_empty(), "threads still alive: {left:?}");
    }
}
