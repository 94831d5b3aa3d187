//! Two loaders in one process (a train and a val loader) keep their own
//! accounting: the decode scratch one holds for large photos is not counted
//! in the other's memory, which decodes small images.

use candle_wick::source::{MemorySource, Record};
use candle_wick::{Loader, Output};

fn loader(side: u32, n: u32) -> Loader {
    let records = (0..n)
        .map(|i| {
            let png = tests::encode(&tests::pattern(side, side, i), image::ImageFormat::Png);
            Record::encoded(format!("{side}-{i}"), png, 0)
        })
        .collect();
    Loader::builder(MemorySource::new(records))
        .batch_size(4)
        .image_size(16)
        .output(Output::U8Nhwc)
        .shard(0, 1)
        .build()
        .unwrap()
}

#[test]
fn each_loader_counts_its_own_decode_scratch() {
    let mut train = loader(800, 8);
    let mut val = loader(20, 8);
    for epoch in 0..2 {
        for b in train.epoch(epoch) {
            b.unwrap();
        }
        for b in val.epoch(epoch) {
            b.unwrap();
        }
    }
    let (t, v) = (train.stats(), val.stats());
    // 800x800 RGB is 1.9 MB decoded; 20x20 is 1.2 KB.
    assert!(t.decode_scratch_bytes > 1_900_000, "{}", t.report());
    assert!(v.decode_scratch_bytes < 200_000, "{}", v.report());
    assert!(
        v.memory_peak < 1_000_000,
        "val's memory is its own: {}",
        v.report()
    );
}
