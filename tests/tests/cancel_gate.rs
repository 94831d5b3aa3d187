//! Dropping an epoch stops samples that were waiting for a worker slot
//! (AUTOTUNE starts with one active worker of the pool's threads): they are
//! not read after the drop. Its own binary, so no other test loads the
//! machine while it measures.

use candle_wick::source::Record;
use candle_wick::{Loader, Source};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tests::{encode, pattern};

struct Slow {
    png: Vec<u8>,
    dropping: Arc<AtomicBool>,
    late: Arc<AtomicUsize>,
}

impl Source for Slow {
    fn len(&self) -> usize {
        16
    }
    fn read(&self, index: usize) -> candle_wick::Result<Record> {
        if self.dropping.load(Ordering::SeqCst) {
            self.late.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(200));
        Ok(Record::encoded(format!("s{index}"), self.png.clone(), 0))
    }
}

#[test]
fn samples_waiting_for_a_worker_are_not_read_after_the_epoch_is_dropped() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return; // one pool thread: nothing waits at the gate
    }
    let (dropping, late) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let source = Slow {
        png: encode(&pattern(8, 8, 2), image::ImageFormat::Png),
        dropping: dropping.clone(),
        late: late.clone(),
    };
    // AUTOTUNE workers: one active, the other pool threads wait at the gate.
    let mut loader = Loader::builder(source)
        .batch_size(2)
        .image_size(8)
        .build()
        .unwrap();
    let mut epoch = loader.epoch(0);
    epoch.next().unwrap().unwrap();
    // Halfway through the next sample's read: the one after it waits.
    std::thread::sleep(Duration::from_millis(100));
    dropping.store(true, Ordering::SeqCst);
    drop(epoch);
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "samples were read after the drop"
    );
}
