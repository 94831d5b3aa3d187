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

/// The default RAM budget: a quarter of the memory available now, shared
/// by the node's ranks: the smaller of `MemAvailable` and what the
/// process's cgroup (its container) has left under its limit, over 4,
/// over the node's local ranks ([`local_ranks`]); 4 GiB over the local
/// ranks where neither is known. Each loader of a rank takes this much, so
/// 8 ranks with a train and a val loader each hold at most half of the
/// memory between them.
pub(crate) fn default_budget() -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| meminfo_available(&m));
    let cgroup = cgroup_memory_left(&|p| std::fs::read_to_string(p).ok());
    let memory = match (available, cgroup) {
        (Some(a), Some(c)) => a.min(c),
        (a, c) => a.or(c).unwrap_or(16 << 30),
    };
    memory / 4 / local_ranks(&|k| std::env::var(k).ok()) as u64
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// Bytes the process's memory cgroup has left under its limit (v2:
/// `memory.max` less `memory.current` of the cgroup `/proc/self/cgroup`
/// names; v1: `memory.limit_in_bytes` less `memory.usage_in_bytes`);
/// `None` without a limit. `read` reads a file.
fn cgroup_memory_left(read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let num = |p: &str| read(p).and_then(|t| t.trim().parse::<u64>().ok());
    let groups = read("/proc/self/cgroup").unwrap_or_default();
    let v2 = groups.lines().find_map(|l| l.strip_prefix("0::"));
    let (limit, used) = match v2 {
        Some(path) => {
            let dir = format!("/sys/fs/cgroup{}", path.trim_end_matches('/'));
            (
                num(&format!("{dir}/memory.max")),
                num(&format!("{dir}/memory.current")),
            )
        }
        None => (
            num("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
            num("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
        ),
    };
    // v1 writes "no limit" as a number near 2^63.
    let limit = limit.filter(|&l| l < 1 << 60)?;
    Some(limit.saturating_sub(used.unwrap_or(0)))
}

/// The ranks of this job on this node: `LOCAL_WORLD_SIZE` (torchrun,
/// Accelerate, DeepSpeed), `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI),
/// `MPI_LOCALNRANKS` (MPICH), `SLURM_NTASKS_PER_NODE` (`8` or `8(x4)`);
/// else 1. `var` reads an environment variable.
pub(crate) fn local_ranks(var: &dyn Fn(&str) -> Option<String>) -> usize {
    [
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|k| {
        let v = var(k)?;
        let n = v.split('(').next()?.trim().parse::<usize>().ok()?;
        (n > 0).then_some(n)
    })
    .unwrap_or(1)
}

/// The cores AUTOTUNE may grow a loader's workers to: those this process
/// may run on (its CPU affinity and its cgroup's CPU quota, as
/// `available_parallelism` reads them) shared by the node's local ranks,
/// at least 1.
pub(crate) fn core_ceiling() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / local_ranks(&|k| std::env::var(k).ok())).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_shared_by_its_ranks_and_its_cgroup() {
        let vars = |set: &'static [(&'static str, &'static str)]| {
            move |k: &str| set.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
        };
        assert_eq!(local_ranks(&vars(&[])), 1);
        assert_eq!(local_ranks(&vars(&[("LOCAL_WORLD_SIZE", "8")])), 8);
        assert_eq!(local_ranks(&vars(&[("SLURM_NTASKS_PER_NODE", "4(x2)")])), 4);
        assert_eq!(local_ranks(&vars(&[("LOCAL_WORLD_SIZE", "0")])), 1);
        fn files<'a>(set: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
            move |p: &str| set.iter().find(|f| f.0 == p).map(|f| f.1.to_string())
        }
        let v2 = [
            ("/proc/self/cgroup", "0::/kubepods/pod1/rank3\n"),
            (
                "/sys/fs/cgroup/kubepods/pod1/rank3/memory.max",
                "8589934592\n",
            ),
            (
                "/sys/fs/cgroup/kubepods/pod1/rank3/memory.current",
                "1073741824\n",
            ),
        ];
        assert_eq!(cgroup_memory_left(&files(&v2)), Some(7 << 30));
        let unlimited = [
            ("/proc/self/cgroup", "0::/\n"),
            ("/sys/fs/cgroup/memory.max", "max\n"),
        ];
        assert_eq!(cgroup_memory_left(&files(&unlimited)), None);
        let v1 = [
            ("/proc/self/cgroup", "12:memory:/docker/abc\n"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "4294967296"),
            ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "1073741824"),
        ];
        assert_eq!(cgroup_memory_left(&files(&v1)), Some(3 << 30));
        let v1_unlimited = [
            ("/proc/self/cgroup", "12:memory:/\n"),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712",
            ),
        ];
        assert_eq!(cgroup_memory_left(&files(&v1_unlimited)), None);
        assert_eq!(
            meminfo_available("MemTotal: 100 kB\nMemAvailable:  2048 kB\n"),
            Some(2 << 20)
        );
    }

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
