//! A consumer that holds an epoch without taking batches (a long
//! evaluation, a checkpoint) costs the loader nothing: the upload thread
//! sleeps until a batch is taken, it does not poll. One test in this
//! binary, so the only upload thread is this test's.

use candle_wick::source::{MemorySource, Record};
use candle_wick::{Loader, Output};
use std::time::Duration;
use tests::{encode, pattern};

/// The upload thread's voluntary context switches so far (Linux).
fn upload_thread_switches() -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let name = std::fs::read_to_string(dir.join("comm")).ok()?;
        if name.trim() == "wick-upload" {
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let line = status
                .lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches:"))?;
            return line.split_whitespace().nth(1)?.parse().ok();
        }
    }
    None
}

#[test]
fn the_upload_thread_sleeps_while_the_consumer_holds_the_queue_full() {
    if !cfg!(target_os = "linux") {
        return;
    }
    let png = encode(&pattern(16, 16, 1), image::ImageFormat::Png);
    let records = (0..64)
        .map(|i| Record::encoded(format!("r{i}"), png.clone(), 0))
        .collect();
    // AUTOTUNE prefetch: a depth of 1 in a channel of 8, so the uploader
    // waits below the channel's capacity, where it polled.
    let mut loader = Loader::builder(MemorySource::new(records))
        .batch_size(4)
        .image_size(8)
        .output(Output::U8Nhwc)
        .shard(0, 1)
        .build()
        .unwrap();
    let mut epoch = loader.epoch(0);
    epoch.next().unwrap().unwrap();
    // Let the uploader fill the queue to its depth and settle.
    std::thread::sleep(Duration::from_millis(300));
    let before = upload_thread_switches().expect("the upload thread is named wick-upload");
    std::thread::sleep(Duration::from_millis(500));
    let after = upload_thread_switches().unwrap();
    // Polling every 200 us was ~2,500 wake-ups in this half second; a
    // sleeping thread wakes only for its 10 Hz backstop.
    assert!(
        after - before < 50,
        "the upload thread woke {} times in 500 ms while nothing changed",
        after - before
    );
    // And it still delivers once batches are taken again.
    assert_eq!(epoch.map(|b| b.unwrap().len()).sum::<usize>(), 60);
}
