//! What a loader measured: the [`Stats`] snapshot with its per-stage rates
//! and starvation [`Verdict`], and the Chrome-trace timeline ([`Trace`]).

mod counters;
pub(crate) mod trace;

#[doc(hidden)]
pub use counters::SampleTimes;
pub(crate) use counters::{Counters, SampleTally};
use std::time::Duration;
pub use trace::Trace;

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
    /// Reads tried again after a transient error
    /// ([`LoaderBuilder::retry`](crate::LoaderBuilder::retry)).
    pub read_retries: u64,
    /// Records a remote source keeps read or being read ahead of the
    /// workers now, as tuned from the measured read latency (0: local data,
    /// the streaming mode, or none read yet).
    pub read_ahead: usize,
    /// The training loop's own time per batch: from taking a batch to
    /// asking for the next, waits excluded (its step, as the loader sees
    /// it).
    pub consumer_step: Duration,
    /// How much longer the step is beside the loader's workers now than
    /// it was at the fewest workers AUTOTUNE measured (`None` with fixed
    /// workers, or before two counts were measured).
    pub step_slowdown: Option<StepSlowdown>,
    /// The consumer's wait for the loader's first batch (zero before it).
    pub first_batch: Duration,
    /// The upload thread's time on the first batch it made ready: on
    /// CUDA it includes one-time setup (loading kernels, which the driver
    /// compiles from PTX on a process's first use).
    pub first_upload: Duration,
}

/// The consumer's step beside the loader's workers against its time at
/// fewer workers, as AUTOTUNE measured them.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct StepSlowdown {
    /// The step now over the step at `workers`.
    pub ratio: f64,
    /// The fewest workers measured.
    pub workers: usize,
    /// The mean step at that count.
    pub step: Duration,
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
    fn step_line(&self) -> String {
        match self.step_slowdown {
            Some(s) => format!(
                "{:.2?} per batch, {:.2}x its {:.2?} at {} worker{} (AUTOTUNE keeps no worker that lengthens it by more than it shortens the wait)",
                self.consumer_step,
                s.ratio,
                s.step,
                s.workers,
                if s.workers == 1 { "" } else { "s" }
            ),
            None => format!("{:.2?} per batch", self.consumer_step),
        }
    }

    fn first_batch_line(&self) -> String {
        if self.first_batch.is_zero() {
            return String::new();
        }
        let mean = self.upload_per_batch;
        let setup = self.first_upload > Duration::from_millis(250) && self.first_upload > 10 * mean;
        format!(
            "; first batch after {:.2?}{}",
            self.first_batch,
            if setup {
                format!(
                    ", {:.2?} of it the first upload against {:.2?} for later ones: one-time device setup (on CUDA, the driver compiles PTX kernels on a process's first use and caches them in ~/.nv/ComputeCache for later runs)",
                    self.first_upload, mean
                )
            } else {
                String::new()
            }
        )
    }

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
             training step: {}{}\n\
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
            self.step_line(),
            self.first_batch_line(),
            self.verdict
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_states_the_step_its_slowdown_and_a_slow_first_batch() {
        let ms = Duration::from_millis;
        let mut s = Stats {
            consumer_step: ms(41),
            first_batch: ms(1900),
            first_upload: ms(1500),
            upload_per_batch: ms(2),
            ..Stats::default()
        };
        let r = s.report();
        assert!(r.contains("training step: 41.00ms per batch"), "{r}");
        assert!(
            r.contains("first batch after 1.90s, 1.50s of it the first upload"),
            "{r}"
        );
        assert!(r.contains("one-time device setup"), "{r}");
        s.step_slowdown = Some(StepSlowdown {
            ratio: 1.08,
            workers: 1,
            step: ms(38),
        });
        s.first_upload = ms(3);
        let r = s.report();
        assert!(r.contains("1.08x its 38.00ms at 1 worker"), "{r}");
        assert!(!r.contains("one-time"), "a first upload like the rest: {r}");
    }
}
