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
    copy_ns: AtomicU64,
    copies: AtomicU64,
    copy_bytes: AtomicU64,
    batches_ready: AtomicU64,
    batches_delivered: AtomicU64,
    wait_ns: AtomicU64,
    wait_max_ns: AtomicU64,
    last_wait_ns: AtomicU64,
    in_flight: AtomicU64,
    startup_wait_ns: AtomicU64,
    ready_sum: AtomicU64,
    ready_when_asked_empty: AtomicU64,
    wait_hist: WaitHistogram,
    memory: AtomicU64,
    memory_peak: AtomicU64,
    workers: AtomicU64,
    cache_bytes: AtomicU64,
    cache_hits: AtomicU64,
    /// Cache entries that could not be read back, and the last such error.
    cache_errors: Mutex<(u64, Option<String>)>,
    /// Distinct skipped keys in first-seen order, and the set of them.
    skipped_keys: Mutex<(Vec<String>, std::collections::HashSet<String>)>,
    skipped_total: AtomicU64,
    clock: Mutex<Clock>,
}

/// Buckets of consumer waits: bucket `k` holds waits in
/// `[1.1^(k-1), 1.1^k)` microseconds (bucket 0: under 1 µs), so percentiles
/// are exact to 10% without storing every wait.
#[derive(Debug)]
struct WaitHistogram([AtomicU64; HIST_BUCKETS]);

const HIST_BUCKETS: usize = 260;

impl Default for WaitHistogram {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl WaitHistogram {
    fn bucket(d: Duration) -> usize {
        let us = d.as_secs_f64() * 1e6;
        if us < 1.0 {
            0
        } else {
            ((us.ln() / 1.1f64.ln()).floor() as usize + 1).min(HIST_BUCKETS - 1)
        }
    }

    fn record(&self, d: Duration) {
        self.0[Self::bucket(d)].fetch_add(1, Relaxed);
    }

    /// The `q` quantile (0..=1): the upper bound of its bucket.
    fn quantile(&self, q: f64) -> Duration {
        let counts: Vec<u64> = self.0.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (k, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return if k == 0 {
                    Duration::from_micros(1)
                } else {
                    Duration::from_secs_f64(1.1f64.powi(k as i32) * 1e-6)
                };
            }
        }
        Duration::MAX
    }
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

    /// A sample was left out under the skip policy. Its key is listed once
    /// however many epochs skip it, so the list stays as long as the
    /// dataset's bad samples.
    pub(crate) fn skipped(&self, key: String) {
        self.skipped_total.fetch_add(1, Relaxed);
        let mut keys = crate::lock(&self.skipped_keys);
        if keys.1.insert(key.clone()) {
            keys.0.push(key);
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

    /// A host-to-device copy of `bytes` took `time` on the device (CUDA:
    /// measured with events on the copy stream).
    pub(crate) fn batch_copied(&self, time: Duration, bytes: u64) {
        self.copies.fetch_add(1, Relaxed);
        self.copy_ns.fetch_add(ns(time), Relaxed);
        self.copy_bytes.fetch_add(bytes, Relaxed);
    }

    /// Upload time summed over the batches made ready: the upload thread's
    /// own time, or the device copies' where those took longer.
    fn upload_total(&self) -> u64 {
        let host = self.upload_ns.load(Relaxed);
        let copies = self.copies.load(Relaxed);
        let copy = (self.copy_ns.load(Relaxed) as u128
            * u128::from(self.batches_ready.load(Relaxed)))
        .checked_div(u128::from(copies))
        .unwrap_or(0);
        host.max(copy.min(u128::from(u64::MAX)) as u64)
    }

    pub(crate) fn batch_dropped(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    /// The consumer got a batch after waiting `wait`; `ready` batches were
    /// waiting when it asked. The first batch of an epoch
    /// (`first`) waits for the pipeline to fill: its wait is kept apart.
    pub(crate) fn consumer_waited(&self, wait: Duration, ready: usize, first: bool) {
        let w = ns(wait);
        self.batches_delivered.fetch_add(1, Relaxed);
        self.last_wait_ns.store(w, Relaxed);
        self.ready_sum.fetch_add(ready as u64, Relaxed);
        if first {
            self.startup_wait_ns.fetch_add(w, Relaxed);
            return;
        }
        self.wait_ns.fetch_add(w, Relaxed);
        self.wait_max_ns.fetch_max(w, Relaxed);
        self.wait_hist.record(wait);
        if ready == 0 {
            self.ready_when_asked_empty.fetch_add(1, Relaxed);
        }
    }

    /// Host memory the loader holds now (batch buffers, cache, decode
    /// scratch), and its peak.
    pub(crate) fn set_memory(&self, bytes: u64) {
        self.memory.store(bytes, Relaxed);
        self.memory_peak.fetch_max(bytes, Relaxed);
    }

    pub(crate) fn set_workers(&self, n: usize) {
        self.workers.store(n as u64, Relaxed);
    }

    pub(crate) fn cache_stored(&self, bytes: u64) {
        self.cache_bytes.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn cache_hit(&self) {
        self.cache_hits.fetch_add(1, Relaxed);
    }

    /// A cache entry that could not be read back (the sample is read from
    /// its source instead).
    pub(crate) fn cache_error(&self, e: &crate::Error) {
        let mut c = crate::lock(&self.cache_errors);
        c.0 += 1;
        c.1 = Some(crate::error::error_chain(e));
    }

    /// Total consumer wait so far, excluding the epochs' first batches.
    pub(crate) fn steady_wait(&self) -> Duration {
        Duration::from_nanos(self.wait_ns.load(Relaxed))
    }

    /// Whether the one upload thread, not the decode workers, sets the
    /// pace: per sample it takes longer than the `workers` together need
    /// to read, decode and transform one.
    pub(crate) fn upload_bound(&self, workers: usize) -> bool {
        let samples = self.samples.load(Relaxed);
        if samples == 0 || self.batches_ready.load(Relaxed) == 0 {
            return false;
        }
        let work = self.read_ns.load(Relaxed)
            + self.decode_ns.load(Relaxed)
            + self.transform_ns.load(Relaxed);
        let upload = self.upload_total();
        // work / samples / workers < upload / samples
        work < upload.saturating_mul(workers as u64)
    }

    pub(crate) fn delivered(&self) -> u64 {
        self.batches_delivered.load(Relaxed)
    }

    pub(crate) fn epoch_started(&self) {
        crate::lock(&self.clock).running_since = Some(Instant::now());
    }

    pub(crate) fn epoch_ended(&self) {
        let mut c = crate::lock(&self.clock);
        if let Some(t) = c.running_since.take() {
            c.finished += t.elapsed();
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let (cache_errors, cache_error) = crate::lock(&self.cache_errors).clone();
        let samples = self.samples.load(Relaxed);
        let wall = {
            let c = crate::lock(&self.clock);
            c.finished + c.running_since.map_or(Duration::ZERO, |t| t.elapsed())
        };
        let per_sample = |ns: &AtomicU64| {
            Duration::from_nanos(ns.load(Relaxed).checked_div(samples).unwrap_or(0))
        };
        let delivered = self.batches_delivered.load(Relaxed);
        let ready = self.batches_ready.load(Relaxed);
        let wait = Duration::from_nanos(self.wait_ns.load(Relaxed));
        let startup = Duration::from_nanos(self.startup_wait_ns.load(Relaxed));
        let share = |d: Duration| {
            if wall.is_zero() {
                0.0
            } else {
                d.as_secs_f64() / wall.as_secs_f64()
            }
        };
        let workers = self.workers.load(Relaxed).max(1) as f64;
        let rate = |per: Duration| {
            if per.is_zero() {
                f64::INFINITY
            } else {
                workers / per.as_secs_f64()
            }
        };
        let (read, decode, transform) = (
            per_sample(&self.read_ns),
            per_sample(&self.decode_ns),
            per_sample(&self.transform_ns),
        );
        let upload = Duration::from_nanos(self.upload_total().checked_div(ready).unwrap_or(0));
        let copies = self.copies.load(Relaxed);
        let copy_ns = self.copy_ns.load(Relaxed);
        let copy_per_batch = Duration::from_nanos(copy_ns.checked_div(copies).unwrap_or(0));
        let copy_gbps = if copy_ns == 0 {
            0.0
        } else {
            self.copy_bytes.load(Relaxed) as f64 / copy_ns as f64
        };
        let batch = samples.checked_div(ready).unwrap_or(0) as f64;
        let stage_rates = StageRates {
            read: rate(read),
            decode: rate(decode),
            transform: rate(transform),
            workers: rate(read + decode + transform),
            upload: if upload.is_zero() {
                f64::INFINITY
            } else {
                batch / upload.as_secs_f64()
            },
        };
        let wait_share = share(wait);
        let verdict = if delivered < 2 {
            Verdict::Unknown
        } else if wait_share > INPUT_BOUND_SHARE {
            Verdict::InputBound {
                stage: stage_rates.slowest(),
                wait_share,
            }
        } else {
            Verdict::NotInputBound { wait_share }
        };
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
            read_per_sample: read,
            decode_per_sample: decode,
            transform_per_sample: transform,
            upload_per_batch: upload,
            pinned_buffers: 0,
            decode_scratches: 0,
            decode_scratch_bytes: 0,
            copy_per_batch,
            copy_gbps,
            batches_in_flight: self.in_flight.load(Relaxed),
            consumer_wait: wait,
            consumer_wait_share: wait_share,
            consumer_wait_p50: self.wait_hist.quantile(0.5),
            consumer_wait_p99: self.wait_hist.quantile(0.99),
            startup_wait: startup,
            mean_ready_batches: self.ready_sum.load(Relaxed) as f64 / delivered.max(1) as f64,
            empty_queue_batches: self.ready_when_asked_empty.load(Relaxed),
            stage_rates,
            verdict,
            memory: self.memory.load(Relaxed),
            memory_peak: self.memory_peak.load(Relaxed),
            workers: self.workers.load(Relaxed) as usize,
            cache_bytes: self.cache_bytes.load(Relaxed),
            cache_hits: self.cache_hits.load(Relaxed),
            cache_errors,
            cache_error,
            consumer_wait_per_batch: Duration::from_nanos(
                self.wait_ns
                    .load(Relaxed)
                    .checked_div(delivered)
                    .unwrap_or(0),
            ),
            consumer_wait_max: Duration::from_nanos(self.wait_max_ns.load(Relaxed)),
            consumer_wait_last: Duration::from_nanos(self.last_wait_ns.load(Relaxed)),
            skipped: crate::lock(&self.skipped_keys).0.clone(),
            skipped_samples: self.skipped_total.load(Relaxed),
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
    /// Mean time to turn a host batch into device tensors: the upload
    /// thread's time, or on CUDA the device copy's where that is longer.
    pub upload_per_batch: Duration,
    /// CUDA: page-locked host batch buffers the loader holds (allocated
    /// once each, kept while AUTOTUNE tunes; zero elsewhere).
    pub pinned_buffers: usize,
    /// Decode scratch sets the workers hold (decoded image, resize and read
    /// buffers): one per active worker, never one per pool thread.
    pub decode_scratches: usize,
    /// Bytes those scratch sets hold, counted in [`Self::memory`].
    pub decode_scratch_bytes: u64,
    /// CUDA: mean device time of a batch's host-to-device copy, measured
    /// with events on the loader's copy stream (zero elsewhere).
    pub copy_per_batch: Duration,
    /// CUDA: bytes copied host-to-device per nanosecond of copy time, i.e.
    /// GB/s (zero elsewhere).
    pub copy_gbps: f64,
    /// Batches being decoded or waiting for upload right now.
    pub batches_in_flight: u64,
    /// Total time the consumer spent blocked in `Epoch::next`, not counting
    /// the first batch of each epoch (see [`Self::startup_wait`]).
    pub consumer_wait: Duration,
    /// `consumer_wait / wall`: the share of the run the training loop
    /// starved.
    pub consumer_wait_share: f64,
    /// Median wait per batch (within 10%).
    pub consumer_wait_p50: Duration,
    /// 99th percentile wait per batch (within 10%).
    pub consumer_wait_p99: Duration,
    /// Waits for the first batch of each epoch, while the pipeline fills.
    pub startup_wait: Duration,
    /// Mean number of batches ready when the consumer asked for one: the
    /// prefetch queue's occupancy.
    pub mean_ready_batches: f64,
    /// Batches the consumer asked for with the prefetch queue empty.
    pub empty_queue_batches: u64,
    /// Samples per second each stage could give with the current workers.
    pub stage_rates: StageRates,
    /// Whether the consumer starved, and which stage to blame.
    pub verdict: Verdict,
    /// Host memory held now: batch buffers, cache and decode scratch.
    pub memory: u64,
    /// Peak of [`Self::memory`]; never above the loader's RAM budget.
    pub memory_peak: u64,
    /// Decode workers active now (AUTOTUNE changes it).
    pub workers: usize,
    /// Bytes held by the cache.
    pub cache_bytes: u64,
    /// Samples served from the cache.
    pub cache_hits: u64,
    /// Cache entries that could not be read back (a disk cache's read
    /// error, or bytes that fail their CRC): each such sample was read from
    /// its source instead, so batches are unchanged.
    pub cache_errors: u64,
    /// The last of those errors, with its cause chain.
    pub cache_error: Option<String>,
    /// Mean time the consumer waited per batch.
    pub consumer_wait_per_batch: Duration,
    /// Longest wait for one batch.
    pub consumer_wait_max: Duration,
    /// Wait for the most recent batch.
    pub consumer_wait_last: Duration,
    /// Keys of the samples left out under the skip policy, each once, in
    /// the order they were first found.
    pub skipped: Vec<String>,
    /// Samples left out under the skip policy, counted every time (a bad
    /// sample skipped in 50 epochs counts 50).
    pub skipped_samples: u64,
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

/// Consumer wait share above which a run is called input-bound.
pub(crate) const INPUT_BOUND_SHARE: f64 = 0.05;

/// Samples per second each pipeline stage could sustain (worker stages
/// scaled by the active workers; upload by its one thread).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageRates {
    /// Reading encoded bytes from the source.
    pub read: f64,
    /// Decoding.
    pub decode: f64,
    /// Crop, resize, flip, normalize.
    pub transform: f64,
    /// Read + decode + transform: what the workers give together.
    pub workers: f64,
    /// Turning host batches into device tensors.
    pub upload: f64,
}

/// A pipeline stage, for the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// Reading from the source.
    Read,
    /// Decoding.
    Decode,
    /// Crop, resize, flip, normalize.
    Transform,
    /// Host to device.
    Upload,
}

impl StageRates {
    /// The stage that limits the pipeline: the upload thread if it is
    /// slower than the workers, else the worker stage taking most time.
    pub fn slowest(&self) -> Stage {
        if self.upload < self.workers {
            return Stage::Upload;
        }
        let stages = [
            (Stage::Read, self.read),
            (Stage::Decode, self.decode),
            (Stage::Transform, self.transform),
        ];
        stages
            .into_iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(Stage::Decode, |s| s.0)
    }
}

/// Whether the training loop starved; [`Stats::verdict`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum Verdict {
    /// Too few batches yet.
    #[default]
    Unknown,
    /// The consumer waited more than 5% of the wall time: the loader sets
    /// the pace, and `stage` is where its time goes.
    InputBound {
        /// The limiting stage.
        stage: Stage,
        /// Share of wall time the consumer waited.
        wait_share: f64,
    },
    /// The consumer (the training step) sets the pace.
    NotInputBound {
        /// Share of wall time the consumer waited.
        wait_share: f64,
    },
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Unknown => write!(f, "not enough batches for a verdict"),
            Verdict::InputBound { stage, wait_share } => write!(
                f,
                "INPUT-BOUND: the training loop waited {:.1}% of the time; {} limits the loader",
                wait_share * 100.0,
                match stage {
                    Stage::Read => "reading the source",
                    Stage::Decode => "decoding",
                    Stage::Transform => "the transforms",
                    Stage::Upload => "the host-to-device upload",
                }
            ),
            Verdict::NotInputBound { wait_share } => write!(
                f,
                "not input-bound: the training loop waited {:.1}% of the time",
                wait_share * 100.0
            ),
        }
    }
}

impl Stats {
    /// A few lines: throughput, the consumer's waits, per-stage rates,
    /// queue occupancy, memory, and the verdict.
    pub fn report(&self) -> String {
        let r = &self.stage_rates;
        let fmt_rate = |x: f64| {
            if x.is_finite() {
                format!("{x:.0}/s")
            } else {
                "-".into()
            }
        };
        format!(
            "{:.0} samples/s, {} workers; consumer wait p50 {:.2?} p99 {:.2?} total {:.2?} ({:.1}% of {:.2?}), startup {:.2?}\n\
             stages (samples/s at this worker count): read {}, decode {}, transform {}, workers {}, upload {}\n\
             prefetch queue: {:.1} batches ready on average, {} batches found it empty; memory {:.1} MB (peak {:.1} MB; decode scratch {:.1} MB in {}){}{}\n\
             verdict: {}",
            self.samples_per_sec,
            self.workers,
            self.consumer_wait_p50,
            self.consumer_wait_p99,
            self.consumer_wait,
            self.consumer_wait_share * 100.0,
            self.wall,
            self.startup_wait,
            fmt_rate(r.read),
            fmt_rate(r.decode),
            fmt_rate(r.transform),
            fmt_rate(r.workers),
            fmt_rate(r.upload),
            self.mean_ready_batches,
            self.empty_queue_batches,
            self.memory as f64 / 1e6,
            self.memory_peak as f64 / 1e6,
            self.decode_scratch_bytes as f64 / 1e6,
            self.decode_scratches,
            if self.cache_bytes > 0 || self.cache_hits > 0 {
                format!(
                    ", cache {:.1} MB, {} hits{}",
                    self.cache_bytes as f64 / 1e6,
                    self.cache_hits,
                    match &self.cache_error {
                        Some(e) => format!(
                            ", {} entries unreadable and read from the source (last: {e})",
                            self.cache_errors
                        ),
                        None => String::new(),
                    }
                )
            } else {
                String::new()
            },
            if self.copy_per_batch > Duration::ZERO {
                format!(
                    "\nhost-to-device copies: {:.2?} per batch, {:.1} GB/s (copy-stream events); {} pinned buffers",
                    self.copy_per_batch, self.copy_gbps, self.pinned_buffers
                )
            } else {
                String::new()
            },
            self.verdict
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_copies_count_as_upload_time_when_longer() {
        let c = Counters::default();
        c.batch_started();
        c.batch_started();
        c.batch_uploaded(Duration::from_millis(1));
        c.batch_uploaded(Duration::from_millis(1));
        let s = c.snapshot();
        assert_eq!(s.upload_per_batch, Duration::from_millis(1));
        assert_eq!((s.copy_per_batch, s.copy_gbps), (Duration::ZERO, 0.0));
        // One copy of 20 MB took 4 ms on the device: 5 GB/s, and the upload
        // stage is bound by it, not by the thread's 1 ms of enqueueing.
        c.batch_copied(Duration::from_millis(4), 20_000_000);
        let s = c.snapshot();
        assert_eq!(s.copy_per_batch, Duration::from_millis(4));
        assert!((s.copy_gbps - 5.0).abs() < 1e-9, "{}", s.copy_gbps);
        assert_eq!(s.upload_per_batch, Duration::from_millis(4));
        assert!(s.report().contains("5.0 GB/s"), "{}", s.report());
    }

    #[test]
    fn upload_bound_compares_the_upload_thread_with_the_workers() {
        let c = Counters::default();
        assert!(!c.upload_bound(2), "nothing measured yet");
        let t = SampleTimes {
            decode: Duration::from_micros(900),
            transform: Duration::from_micros(100),
            decoded_bytes: 0,
        };
        for _ in 0..4 {
            c.sample(Duration::ZERO, &t);
        }
        c.batch_started();
        // 4 samples uploaded in 1 ms: 250 us per sample.
        c.batch_uploaded(Duration::from_millis(1));
        assert!(!c.upload_bound(2), "2 workers give one sample per 500 us");
        assert!(c.upload_bound(8), "8 workers give one per 125 us");
    }

    #[test]
    fn wait_quantiles_are_within_ten_percent() {
        let h = WaitHistogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).as_secs_f64() * 1e6;
        let p99 = h.quantile(0.99).as_secs_f64() * 1e6;
        assert!((500.0..=550.0).contains(&p50), "{p50}");
        assert!((990.0..=1089.0).contains(&p99), "{p99}");
        assert_eq!(WaitHistogram::default().quantile(0.5), Duration::ZERO);
    }
}
