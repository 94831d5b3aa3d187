//! The live counters the loader's threads update as they run; a
//! [`Counters::snapshot`] is the [`Stats`] users read.

use super::{StageRates, Stats, Verdict, INPUT_BOUND_SHARE};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Time spent on one sample, by stage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SampleTimes {
    /// Decoding the encoded bytes to RGB.
    pub decode: Duration,
    /// Crop, resize, flip, layout and normalize.
    pub transform: Duration,
    /// Bytes of the decoded RGB image (`width * height * 3`).
    pub decoded_bytes: u64,
}

/// One worker's samples since it last added them to the [`Counters`].
#[derive(Debug, Default)]
pub(crate) struct SampleTally {
    samples: u64,
    read_ns: u64,
    decode_ns: u64,
    transform_ns: u64,
    decoded_bytes: u64,
}

impl SampleTally {
    /// Counts one sample, read in `read`.
    pub(crate) fn add(&mut self, read: Duration, t: &SampleTimes) {
        self.samples += 1;
        self.read_ns += ns(read);
        self.decode_ns += ns(t.decode);
        self.transform_ns += ns(t.transform);
        self.decoded_bytes += t.decoded_bytes;
    }

    /// Adds a run of samples timed as a whole (`took`), less what they
    /// timed themselves (a map's own decode and transform times), as
    /// reading (the share `read_share`) and the map's transform (the
    /// rest).
    pub(crate) fn add_run(&mut self, took: Duration, read_share: f64) {
        let timed = self.read_ns + self.decode_ns + self.transform_ns;
        let rest = ns(took).saturating_sub(timed);
        let read = (rest as f64 * read_share.clamp(0.0, 1.0)) as u64;
        self.read_ns += read;
        self.transform_ns += rest - read;
    }
}

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
    /// Reads tried again after a transient error.
    read_retries: AtomicU64,
    /// The consumer's wait for the loader's first batch, and the upload
    /// thread's time on it (0: not yet).
    first_batch_ns: AtomicU64,
    first_upload_ns: AtomicU64,
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
    /// Adds a worker's run of samples (one update of the shared counters
    /// per run, not per sample: with several workers each per-sample
    /// update moved the counters' cache line between cores, which cost a
    /// cheap map as much as its work).
    pub(crate) fn samples(&self, t: &SampleTally) {
        if t.samples == 0 {
            return;
        }
        self.samples.fetch_add(t.samples, Relaxed);
        self.read_ns.fetch_add(t.read_ns, Relaxed);
        self.decode_ns.fetch_add(t.decode_ns, Relaxed);
        self.transform_ns.fetch_add(t.transform_ns, Relaxed);
        self.decoded_bytes.fetch_add(t.decoded_bytes, Relaxed);
    }

    /// The share of reading in the samples' time so far (0 before any).
    pub(crate) fn read_share(&self) -> f64 {
        let read = self.read_ns.load(Relaxed) as f64;
        let work = (self.decode_ns.load(Relaxed) + self.transform_ns.load(Relaxed)) as f64;
        if read + work > 0.0 {
            read / (read + work)
        } else {
            0.0
        }
    }

    /// Mean time of a sample's map so far (decode and transform), if any
    /// sample was counted.
    pub(crate) fn mean_sample_work(&self) -> Option<Duration> {
        let n = self.samples.load(Relaxed);
        let work = self.decode_ns.load(Relaxed) + self.transform_ns.load(Relaxed);
        (n > 0).then(|| Duration::from_nanos(work / n))
    }

    /// Mean time of a sample's read and map so far, if any sample was
    /// counted: what a sample costs the thread that runs it.
    pub(crate) fn mean_sample_cost(&self) -> Option<Duration> {
        let n = self.samples.load(Relaxed);
        let all = self.read_ns.load(Relaxed)
            + self.decode_ns.load(Relaxed)
            + self.transform_ns.load(Relaxed);
        (n > 0).then(|| Duration::from_nanos(all / n))
    }

    /// A sample was left out under the skip policy. Its key is listed once
    /// however many epochs skip it, so the list stays as long as the
    /// dataset's bad samples.
    /// A read is tried again after a transient error.
    pub(crate) fn read_retried(&self) {
        self.read_retries.fetch_add(1, Relaxed);
    }

    pub(crate) fn skipped(&self, key: String) {
        self.skipped_total.fetch_add(1, Relaxed);
        let mut keys = crate::sync::lock(&self.skipped_keys);
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
        let _ = self
            .first_upload_ns
            .compare_exchange(0, ns(upload).max(1), Relaxed, Relaxed);
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
            let _ = self
                .first_batch_ns
                .compare_exchange(0, w.max(1), Relaxed, Relaxed);
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
    pub(crate) fn cache_error(&self, e: &crate::error::Error) {
        let mut c = crate::sync::lock(&self.cache_errors);
        c.0 += 1;
        c.1 = Some(crate::error::error_chain(e));
    }

    /// Total consumer wait so far, excluding the epochs' first batches.
    pub(crate) fn steady_wait(&self) -> Duration {
        Duration::from_nanos(self.wait_ns.load(Relaxed))
    }

    /// Total consumer wait so far, the epochs' first batches included.
    pub(crate) fn all_wait(&self) -> Duration {
        Duration::from_nanos(self.wait_ns.load(Relaxed) + self.startup_wait_ns.load(Relaxed))
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
        crate::sync::lock(&self.clock).running_since = Some(Instant::now());
    }

    pub(crate) fn epoch_ended(&self) {
        let mut c = crate::sync::lock(&self.clock);
        if let Some(t) = c.running_since.take() {
            c.finished += t.elapsed();
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let (cache_errors, cache_error) = crate::sync::lock(&self.cache_errors).clone();
        let samples = self.samples.load(Relaxed);
        let wall = {
            let c = crate::sync::lock(&self.clock);
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
            skipped: crate::sync::lock(&self.skipped_keys).0.clone(),
            skipped_samples: self.skipped_total.load(Relaxed),
            read_retries: self.read_retries.load(Relaxed),
            read_ahead: 0,
            consumer_step: Duration::from_nanos(
                ns(wall.saturating_sub(wait + startup))
                    .checked_div(delivered)
                    .unwrap_or(0),
            ),
            step_slowdown: None,
            first_batch: Duration::from_nanos(self.first_batch_ns.load(Relaxed)),
            first_upload: Duration::from_nanos(self.first_upload_ns.load(Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run timed as a whole adds what its samples did not time
    /// themselves, split between reading and the map by the given share.
    #[test]
    fn a_run_timed_as_a_whole_is_split_by_the_read_share() {
        let mut t = SampleTally::default();
        let own = SampleTimes {
            decode: Duration::from_nanos(20),
            transform: Duration::from_nanos(10),
            decoded_bytes: 0,
        };
        t.add(Duration::ZERO, &own);
        t.add(Duration::ZERO, &SampleTimes::default());
        t.add_run(Duration::from_nanos(130), 0.25);
        assert_eq!(t.samples, 2);
        assert_eq!((t.read_ns, t.decode_ns, t.transform_ns), (25, 20, 85));
        let c = Counters::default();
        assert_eq!(c.read_share(), 0.0);
        c.samples(&t);
        assert!((c.read_share() - 25.0 / 130.0).abs() < 1e-12);
    }

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
        let mut tally = SampleTally::default();
        for _ in 0..4 {
            tally.add(Duration::ZERO, &t);
        }
        c.samples(&tally);
        assert_eq!(c.mean_sample_work(), Some(Duration::from_millis(1)));
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
