//! Dropping a streamed epoch returns promptly, also while the feeder is
//! still reading past the batches before a resume point (`epoch_from`).
//! Its own binary, so no other test loads the machine while it measures.

use candle_wick::source::{Record, ShardInfo};
use candle_wick::{Loader, Source};
use std::time::{Duration, Instant};
use tests::{encode, pattern};

/// 2 shards of 256 records; every read takes 10 ms.
struct SlowShards {
    png: Vec<u8>,
    shards: Vec<ShardInfo>,
}

impl Source for SlowShards {
    fn len(&self) -> usize {
        512
    }
    fn read(&self, index: usize) -> candle_wick::Result<Record> {
        std::thread::sleep(Duration::from_millis(10));
        Ok(Record::encoded(format!("s{index}"), self.png.clone(), 0))
    }
    fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }
}

#[test]
fn dropping_a_resumed_stream_does_not_wait_for_the_skip() {
    let source = SlowShards {
        png: encode(&pattern(8, 8, 3), image::ImageFormat::Png),
        shards: tests::fake_shards(2, 256),
    };
    let mut loader = Loader::builder(source)
        .batch_size(64)
        .image_size(8)
        .interleave(1, 1)
        .build()
        .unwrap();
    // Batch 7 is 448 records in: reading past them takes 4.5 s.
    let epoch = loader.epoch_from(0, 7);
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    drop(epoch);
    let took = t.elapsed();
    assert!(took < Duration::from_millis(1500), "the drop took {took:?}");
}
