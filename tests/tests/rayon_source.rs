//! A `Source` that uses rayon inside `read` (here `rayon::yield_now`, which
//! lets this pool thread run another of the loader's jobs while it waits)
//! does not deadlock the loader at its worker gate.

use candle_wick::source::Record;
use candle_wick::{Loader, Source};
use std::time::Duration;
use tests::{encode, pattern};

struct Yielding(Vec<u8>);

impl Source for Yielding {
    fn len(&self) -> usize {
        8
    }
    fn read(&self, index: usize) -> candle_wick::Result<Record> {
        if index == 0 {
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = rayon::yield_now();
        Ok(Record::encoded(format!("s{index}"), self.0.clone(), 0))
    }
}

#[test]
fn rayon_inside_a_source_does_not_deadlock() {
    let batches = tests::within(20, || {
        let source = Yielding(encode(&pattern(8, 8, 5), image::ImageFormat::Png));
        let mut loader = Loader::builder(source)
            .batch_size(2)
            .image_size(8)
            .workers(1)
            .batches_in_flight(2)
            .build()
            .unwrap();
        let n = loader.epoch(0).map(|b| b.unwrap().len()).sum::<usize>();
        // The loader's threads are stuck if this drop never returns.
        drop(loader);
        n
    });
    assert_eq!(batches, 8);
}
