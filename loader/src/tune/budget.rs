//! The RAM budget: what a loader's settings hold in host memory, and
//! whether that fits the limit. Per loader (no process-global state): the
//! decode scratch counted is this loader's workers' own.

use crate::error::{Error, Result};
use crate::transform::ScratchPool;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A loader's memory bound and what its buffers cost.
#[derive(Debug)]
pub(crate) struct Budget {
    /// The limit, in bytes.
    pub(crate) bytes: u64,
    /// One host batch buffer.
    pub(crate) batch_bytes: u64,
    /// Host buffers are page-locked (CUDA): kept for the loader's life, and
    /// prefetched or held batches live in device memory, not host RAM.
    pub(crate) pinned: bool,
    /// The most batches in flight so far: with `pinned`, the buffers held.
    pub(crate) in_flight_high: AtomicUsize,
    /// The active workers' decode scratch.
    pub(crate) scratch: ScratchPool,
}

impl Budget {
    /// A limit of `bytes` for buffers of `batch_bytes`, starting with
    /// `in_flight` batches in flight.
    pub(crate) fn new(bytes: u64, batch_bytes: u64, pinned: bool, in_flight: usize) -> Self {
        Self {
            bytes,
            batch_bytes,
            pinned,
            in_flight_high: in_flight.into(),
            scratch: ScratchPool::default(),
        }
    }

    /// Host bytes held with these settings: the batches being filled, the
    /// ones prefetched, one being uploaded and one the consumer holds, the
    /// workers' decode scratch, and the cache. With pinned buffers: every
    /// buffer allocated so far (none is freed), and no prefetched batch
    /// (those are on the device).
    pub(crate) fn memory(
        &self,
        in_flight: usize,
        prefetch: usize,
        workers: usize,
        cache: u64,
    ) -> u64 {
        self.batch_memory(in_flight, prefetch) + self.scratch.memory(workers) + cache
    }

    /// Host bytes of the batch buffers alone, as [`memory`](Self::memory)
    /// counts them.
    fn batch_memory(&self, in_flight: usize, prefetch: usize) -> u64 {
        let batches = if self.pinned {
            in_flight.max(self.in_flight_high.load(Relaxed))
        } else {
            in_flight + prefetch + 2
        };
        batches as u64 * self.batch_bytes
    }

    /// The decoded bytes one of `workers` workers may hold for an image:
    /// the budget less the batch buffers, shared among the workers (the
    /// cache yields to decoding: it only fills what is left).
    pub(crate) fn decode_grant(&self, in_flight: usize, prefetch: usize, workers: usize) -> u64 {
        let batches = self.batch_memory(in_flight, prefetch);
        self.bytes.saturating_sub(batches) / workers.max(1) as u64
    }

    /// Whether the settings fit the budget.
    pub(crate) fn fits(
        &self,
        in_flight: usize,
        prefetch: usize,
        workers: usize,
        cache: u64,
    ) -> bool {
        self.memory(in_flight, prefetch, workers, cache) <= self.bytes
    }

    /// The settings a loader starts with fit, or an error saying what to
    /// change.
    pub(crate) fn check_start(&self, in_flight: usize, prefetch: usize) -> Result<()> {
        if self.fits(in_flight, prefetch, 0, 0) {
            return Ok(());
        }
        let held = if self.pinned {
            format!("{in_flight} page-locked, in flight")
        } else {
            format!("{in_flight} in flight, {prefetch} prefetched, one uploading, one held")
        };
        Err(Error::InvalidConfig(format!(
            "ram_budget of {} bytes cannot hold {} batches of {} bytes ({held}): raise it or \
             lower batch_size",
            self.bytes,
            self.memory(in_flight, prefetch, 0, 0) / self.batch_bytes.max(1),
            self.batch_bytes
        )))
    }
}

/// The default RAM budget: a quarter of the memory available now
/// (`MemAvailable`), or 4 GiB where that is not known.
pub(crate) fn default_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(4 << 30, |kb| kb * 1024 / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_buffers_count_while_held_and_prefetch_does_not() {
        let knobs = |pinned| Budget::new(4000, 1000, pinned, 2);
        let scratch = 0;
        let host = knobs(false);
        assert_eq!(host.memory(2, 1, 1, 0), 5000 + scratch);
        let cuda = knobs(true);
        // Prefetched batches are on the device; the pinned buffers held are
        // the most ever in flight, since none is freed.
        assert_eq!(cuda.memory(2, 3, 1, 0), 2000 + scratch);
        cuda.in_flight_high.fetch_max(4, Relaxed);
        assert_eq!(cuda.memory(2, 3, 1, 0), 4000 + scratch);
        assert_eq!(cuda.memory(5, 3, 1, 0), 5000 + scratch);
    }

    #[test]
    fn the_decode_grant_is_the_budget_less_the_batches_per_worker() {
        let host = Budget::new(10_000, 1000, false, 2);
        // 2 in flight + 1 prefetched + one uploading + one held.
        assert_eq!(host.decode_grant(2, 1, 1), 5000);
        assert_eq!(host.decode_grant(2, 1, 2), 2500);
        assert_eq!(
            host.decode_grant(8, 8, 2),
            0,
            "no room left: nothing granted"
        );
    }
}
