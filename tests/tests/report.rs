//! The starvation report: the verdict says input-bound when the consumer is
//! faster than the loader and not input-bound when it is slower; the trace
//! holds every stage and the training loop on one timeline.

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::map_fn;
use candle_wick::source::ImageFolder;
use candle_wick::stats::{Stage, Verdict};
use candle_wick::{Loader, Output, Transforms};
use std::time::{Duration, Instant};

fn loader(root: &std::path::Path, trace: bool) -> Loader {
    Loader::builder(ImageFolder::new(root).unwrap())
        .batch_size(4)
        .image_size(16)
        .transforms(Transforms::eval(16))
        .output(Output::U8Nhwc)
        .workers(1)
        .prefetch(1)
        .batches_in_flight(2)
        .shard(0, 1)
        .trace(trace)
        .build()
        .unwrap()
}

#[test]
fn verdict_follows_who_waits() {
    let dir = tempfile::tempdir().unwrap();
    tests::image_folder(dir.path(), 2, 12);

    // A consumer that does nothing is faster than one decode worker.
    let mut fast = loader(dir.path(), false);
    for _ in 0..2 {
        for b in fast.epoch(0) {
            b.unwrap();
        }
    }
    let s = fast.stats();
    assert!(
        matches!(
            s.verdict,
            Verdict::InputBound {
                stage: Stage::Decode | Stage::Transform | Stage::Read,
                ..
            }
        ),
        "{}",
        s.report()
    );
    assert!(s.consumer_wait_share > 0.05 && s.consumer_wait_p50 > Duration::ZERO);

    // A 40 ms step is far slower than decoding four small images (well
    // under a millisecond): over 18 batches the loader keeps ahead. A
    // scheduling stall on a busy 2-core machine can leave the queue empty
    // once or twice, so the assertion is a share, not "never".
    let mut slow = loader(dir.path(), false);
    for epoch in 0..3 {
        for b in slow.epoch(epoch) {
            b.unwrap();
            std::thread::sleep(Duration::from_millis(40));
        }
    }
    let s = slow.stats();
    assert!(
        matches!(s.verdict, Verdict::NotInputBound { .. }),
        "{}",
        s.report()
    );
    assert_eq!(s.batches, 18);
    assert!(s.empty_queue_batches * 5 <= s.batches, "{}", s.report());
    assert!(s.report().contains("not input-bound"));
}

/// A batch that costs more than the loader's threads' hand-overs goes
/// through the feeder and the upload thread (a cheap one is filled and
/// handed over by a decode thread alone): a map of 300 µs a sample.
#[test]
fn chrome_trace_has_every_lane() {
    let dir = tempfile::tempdir().unwrap();
    tests::image_folder(&dir.path().join("data"), 2, 4);
    let map = map_fn(vec![Field::new("v", FieldType::U32, &[])], |s| {
        std::thread::sleep(Duration::from_micros(300));
        let label = s.record().label;
        s.take::<u32>(0)?[0] = label;
        Ok(())
    });
    let mut l = Loader::builder(ImageFolder::new(dir.path().join("data")).unwrap())
        .map(map)
        .batch_size(4)
        .workers(1)
        .prefetch(1)
        .batches_in_flight(2)
        .shard(0, 1)
        .trace(true)
        .build()
        .unwrap();
    let trace = l.trace().unwrap();
    for b in l.epoch(0) {
        b.unwrap();
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        trace.span("train step", t, Instant::now());
    }
    let path = dir.path().join("trace.json");
    l.trace().unwrap().write_chrome_json(&path).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let count = |name: &str| {
        events
            .iter()
            .filter(|e| e["name"] == name && e["ph"] == "X")
            .count()
    };
    assert_eq!(count("read+map"), 8);
    assert_eq!(count("upload"), 2);
    assert_eq!(count("wait for batch"), 2);
    assert_eq!(count("train step"), 2);
    // The feeder's waits for a batch buffer, one per batch (its lane was
    // named but never drawn).
    assert_eq!(count("wait for a batch buffer"), 2);
    let lanes: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    for lane in ["wick-feed", "wick-upload", "training loop", "wick-decode-0"] {
        assert!(lanes.contains(&lane), "{lanes:?}");
    }
}
