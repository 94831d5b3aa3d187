//! A panic in user code is an error naming the sample, never an abort or a
//! dead loader: a `Source` whose `read` and `key` panic for one index (the
//! key is asked for on the error path), and one that panics while streamed
//! by the feeder thread; the loader goes on with the next epoch.

use candle_wick::source::{Record, ShardInfo};
use candle_wick::{Error, Loader, Source};
use tests::{encode, pattern};

/// 8 PNGs; index `bad` panics in `read` and in `key`, and records
/// are grouped in 2 shards of 4 for the streaming mode.
struct Panicky {
    png: Vec<u8>,
    bad: usize,
    shards: Vec<ShardInfo>,
}

impl Panicky {
    fn new(bad: usize) -> Self {
        Self {
            png: encode(&pattern(8, 8, 1), image::ImageFormat::Png),
            bad,
            shards: tests::fake_shards(2, 4),
        }
    }
}

impl Source for Panicky {
    fn len(&self) -> usize {
        8
    }
    fn read(&self, index: usize) -> candle_wick::Result<Record> {
        assert!(index != self.bad, "boom at {index}");
        Ok(Record::encoded(self.key(index), self.png.clone(), 0))
    }
    fn key(&self, index: usize) -> String {
        assert!(index != self.bad, "no key for {index}");
        format!("s{index}")
    }
    fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }
}

fn outcome(b: &candle_wick::Result<candle_wick::Batch>) -> String {
    match b {
        Ok(b) => format!("ok {}", b.len()),
        Err(Error::WorkerPanic { message, .. }) => format!("panic {message}"),
        Err(e) => format!("error {e}"),
    }
}

#[test]
fn a_panicking_key_on_the_error_path_is_an_error_not_an_abort() {
    let mut loader = Loader::builder(Panicky::new(3))
        .batch_size(4)
        .image_size(8)
        .workers(2)
        .build()
        .unwrap();
    for epoch in 0..2 {
        let got: Vec<String> = loader.epoch(epoch).map(|b| outcome(&b)).collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].starts_with("panic") && got[0].contains("boom"),
            "{got:?}"
        );
        assert_eq!(got[1], "ok 4");
    }
}

#[test]
fn a_panic_in_a_streamed_read_is_an_error_and_the_loader_survives() {
    let mut loader = Loader::builder(Panicky::new(5))
        .batch_size(4)
        .image_size(8)
        .interleave(1, 1)
        .build()
        .unwrap();
    // Epoch 0 reads shard 0 then shard 1 (record 5 panics); epoch 1 deals
    // the shards rotated, so the panic comes first. Either way the panic is
    // the error, and a later epoch still runs (the feeder lived on).
    for epoch in 0..3 {
        let got: Vec<String> = loader.epoch(epoch).map(|b| outcome(&b)).collect();
        let at = got
            .iter()
            .position(|g| g.starts_with("panic") && g.contains("boom"));
        assert!(at.is_some(), "epoch {epoch}: {got:?}");
        assert!(
            got[..at.unwrap()].iter().all(|g| g == "ok 4"),
            "epoch {epoch}: {got:?}"
        );
    }
}
