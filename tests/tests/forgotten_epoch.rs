//! `mem::forget` on an `Epoch` is safe code: it must not confuse the next
//! epoch (a stale acknowledgement, batches of two epochs mixed, buffers
//! never returned) nor hang the loader's drop.

use candle_wick::source::Record;
use candle_wick::{Loader, Source};
use std::time::Duration;
use tests::{encode, pattern};

/// 64 PNGs, 20 ms per read.
struct Slow(Vec<u8>);

impl Source for Slow {
    fn len(&self) -> usize {
        64
    }
    fn read(&self, index: usize) -> candle_wick::Result<Record> {
        std::thread::sleep(Duration::from_millis(20));
        Ok(Record::encoded(format!("s{index}"), self.0.clone(), 0))
    }
}

fn loader() -> Loader {
    Loader::builder(Slow(encode(&pattern(8, 8, 6), image::ImageFormat::Png)))
        .batch_size(4)
        .image_size(8)
        .shuffle(9)
        .workers(2)
        .batches_in_flight(2)
        .prefetch(1)
        .build()
        .unwrap()
}

#[test]
fn a_forgotten_epoch_does_not_confuse_the_next_ones() {
    tests::within(60, || {
        let mut l = loader();
        // Fully consumed, then forgotten: its acknowledgement is never read.
        let mut e0 = l.epoch(0);
        for b in e0.by_ref() {
            b.unwrap();
        }
        std::mem::forget(e0);
        let mut e1 = l.epoch(1);
        e1.next().unwrap().unwrap();
        drop(e1);
        assert_eq!(
            l.stats().batches_in_flight,
            0,
            "the drop returned on a stale acknowledgement"
        );
        // Forgotten mid-epoch, with batches still being decoded.
        let mut e2 = l.epoch(2);
        e2.next().unwrap().unwrap();
        std::mem::forget(e2);
        let want = l.batches(3);
        let got: Vec<Vec<usize>> = l.epoch(3).map(|b| b.unwrap().indices).collect();
        assert_eq!(got, want, "epoch 3 delivered other batches");
    });
}

#[test]
fn the_loader_drops_after_a_forgotten_epoch() {
    tests::within(20, || {
        let mut l = loader();
        let mut e = l.epoch(0);
        e.next().unwrap().unwrap();
        std::mem::forget(e);
        drop(l);
    });
}
