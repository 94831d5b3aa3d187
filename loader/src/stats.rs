//! Counters the pipeline updates as it runs, and the snapshot users read.

use crate::transform::SampleTimes;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Live counters, shared by the loader's threads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    samples: AtomicU64,
    read_ns: AtomicU64,
    decode_ns: AtomicU64,
    transform_ns: AtomicU64,
    decoded_bytes: AtomicU64,
    upload_ns: AtomicU64,
    batches_ready: AtomicU64,
    batches_delivered: AtomicU64,
    wait_ns: AtomicU64,
    wait_max_ns: AtomicU64,
    last_wait_ns: AtomicU64,
    in_flight: AtomicU64,
    skipped_keys: Mutex<Vec<String>>,
    clock: Mutex<Clock>,
}

/// Wall time during which an epoch was running.
#[derive(Debug, Default)]
struct Clock {
    finished: Duration,
    running_since: Option<Instant>,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Counters {
    pub(crate) fn sample(&self, read: Duration, t: &SampleTimes) {
        self.samples.fetch_add(1, Relaxed);
        self.read_ns.fetch_add(ns(read), Relaxed);
        self.decode_ns.fetch_add(ns(t.decode), Relaxed);
        self.transform_ns.fetch_add(ns(t.transform), Relaxed);
        self.decoded_bytes.fetch_add(t.decoded_bytes, Relaxed);
    }

    pub(crate) fn skipped(&self, key: String) {
        if let Ok(mut keys) = self.skipped_keys.lock() {
            keys.push(key);
        }
    }

    pub(crate) fn batch_started(&self) {
        self.in_flight.fetch_add(1, Relaxed);
    }

    pub(crate) fn batch_uploaded(&self, upload: Duration) {
        self.in_flight.fetch_sub(1, Relaxed);
        self.batches_ready.fetch_add(1, Relaxed);
        self.upload_ns.fetch_add(ns(upload), Relaxed);
    }

    pub(crate) fn batch_dropped(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    pub(crate) fn consumer_waited(&self, wait: Duration) {
        let w = ns(wait);
        self.batches_delivered.fetch_add(1, Relaxed);
        self.wait_ns.fetch_add(w, Relaxed);
        self.wait_max_ns.fetch_max(w, Relaxed);
        self.last_wait_ns.store(w, Relaxed);
    }

    pub(crate) fn epoch_started(&self) {
        if let Ok(mut c) = self.clock.lock() {
            c.running_since = Some(Instant::now());
        }
    }

    pub(crate) fn epoch_ended(&self) {
        if let Ok(mut c) = self.clock.lock() {
            if let Some(t) = c.running_since.take() {
                c.finished += t.elapsed();
            }
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let samples = self.samples.load(Relaxed);
        let wall = self.clock.lock().map_or(Duration::ZERO, |c| {
            c.finished + c.running_since.map_or(Duration::ZERO, |t| t.elapsed())
        });
        let per_sample = |ns: &AtomicU64| {
            Duration::from_nanos(ns.load(Relaxed).checked_div(samples).unwrap_or(0))
        };
        let delivered = self.batches_delivered.load(Relaxed);
        let ready = self.batches_ready.load(Relaxed);
        let wait = Duration::from_nanos(self.wait_ns.load(Relaxed));
        Stats {
            samples,
            batches: delivered,
            wall,
            samples_per_sec: if wall.is_zero() {
                0.0
            } else {
                samples as f64 / wall.as_secs_f64()
            },
            decoded_bytes: self.decoded_bytes.load(Relaxed),
            read_per_sample: per_sample(&self.read_ns),
            decode_per_sample: per_sample(&self.decode_ns),
            transform_per_sample: per_sample(&self.transform_ns),
            upload_per_batch: Duration::from_nanos(
                self.upload_ns.load(Relaxed).checked_div(ready).unwrap_or(0),
            ),
            batches_in_flight: self.in_flight.load(Relaxed),
            consumer_wait: wait,
            consumer_wait_per_batch: Duration::from_nanos(
                self.wait_ns
                    .load(Relaxed)
                    .checked_div(delivered)
                    .unwrap_or(0),
            ),
            consumer_wait_max: Duration::from_nanos(self.wait_max_ns.load(Relaxed)),
            consumer_wait_last: Duration::from_nanos(self.last_wait_ns.load(Relaxed)),
            skipped: self
                .skipped_keys
                .lock()
                .map(|k| k.clone())
                .unwrap_or_default(),
        }
    }
}

/// A snapshot of a loader's counters, summed over every epoch it ran.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Samples decoded and transformed.
    pub samples: u64,
    /// Batches handed to the consumer.
    pub batches: u64,
    /// Wall time during which epochs were running.
    pub wall: Duration,
    /// `samples / wall`.
    pub samples_per_sec: f64,
    /// Bytes of decoded RGB images (before cropping and resizing).
    pub decoded_bytes: u64,
    /// Mean time to read a sample's bytes from its source.
    pub read_per_sample: Duration,
    /// Mean time to decode a sample (worker time, not wall time).
    pub decode_per_sample: Duration,
    /// Mean time to crop, resize, flip and normalize a sample.
    pub transform_per_sample: Duration,
    /// Mean time to turn a host batch into device tensors.
    pub upload_per_batch: Duration,
    /// Batches being decoded or waiting for upload right now.
    pub batches_in_flight: u64,
    /// Total time the consumer spent blocked in `Epoch::next`.
    pub consumer_wait: Duration,
    /// Mean time the consumer waited per batch.
    pub consumer_wait_per_batch: Duration,
    /// Longest wait for one batch.
    pub consumer_wait_max: Duration,
    /// Wait for the most recent batch.
    pub consumer_wait_last: Duration,
    /// Keys of the samples left out under the skip policy, in the order
    /// they were found.
    pub skipped: Vec<String>,
}

impl Stats {
    /// Decoded megabytes (10^6 bytes) per second of wall time.
    pub fn decoded_mb_per_sec(&self) -> f64 {
        if self.wall.is_zero() {
            0.0
        } else {
            self.decoded_bytes as f64 / 1e6 / self.wall.as_secs_f64()
        }
    }
}
