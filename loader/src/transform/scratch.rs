//! The decode workers' reusable buffers, one set per active worker, and
//! their count in the RAM budget.

use super::resize::Resampler;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Decode and resample buffers reused across samples, so steady-state work
/// allocates nothing of its own: the loader keeps one per active worker
/// (and counts it in the RAM budget). A map gets its worker's from
/// [`Sample::scratch`](crate::map::Sample::scratch) for [`crate::ops`];
/// `Scratch::default()` makes one for use outside a loader.
#[derive(Default)]
pub struct Scratch {
    pub(super) resampler: Resampler,
    /// The decoded image.
    pub(super) decoded: Vec<u8>,
    /// The resized image, for outputs that are not written by the resizer.
    pub(super) resized: Vec<u8>,
    /// The window decoder's tables and planes.
    pub(super) jpeg: crate::decode::jpeg::Scratch,
    /// What one decode may take: the loader's pixel limit and what the RAM
    /// budget grants this worker (set each time a worker takes it).
    pub(crate) limits: crate::decode::Limits,
    /// The byte buffer of the next record read with this scratch.
    read: Vec<u8>,
    /// The bytes this scratch held when last counted by its pool.
    counted: u64,
    /// The thread that last used it: its buffers are in that core's cache.
    last_thread: Option<std::thread::ThreadId>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("decoded", &self.decoded.capacity())
            .field("resized", &self.resized.capacity())
            .field("read", &self.read.capacity())
            .finish_non_exhaustive()
    }
}

/// Read buffers above this size are not kept: one huge file must not pin
/// its size on every worker.
const MAX_KEPT_READ: usize = 8 << 20;

impl Scratch {
    /// The byte buffer for the next record read (empty at first); see
    /// [`crate::Source::read_reusing`].
    pub(crate) fn take_read_buffer(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.read)
    }

    /// Keeps a record's byte buffer for the next read with this scratch.
    pub(crate) fn recycle_read_buffer(&mut self, bytes: Vec<u8>) {
        if bytes.capacity() <= MAX_KEPT_READ {
            self.read = bytes;
        }
    }

    /// The heap bytes this scratch holds.
    fn bytes(&self) -> u64 {
        (self.decoded.capacity()
            + self.resized.capacity()
            + self.read.capacity()
            + self.jpeg.bytes()
            + self.resampler.bytes()) as u64
    }
}

/// The loader's decode scratch: one [`Scratch`] per worker running a
/// batch's samples, taken after the worker gate and given back when the
/// worker has no sample of the batch left to claim, so
/// the scratch held is the active workers' (the gate's limit), not one per
/// pool thread, and what is held is what is counted in the RAM budget.
#[derive(Default)]
pub(crate) struct ScratchPool {
    /// Scratches not in use, and how many exist (in use or not). Boxed: a
    /// set holds the JPEG decoder's tables inline, moved per sample.
    #[allow(clippy::vec_box)]
    free: Mutex<(Vec<Box<Scratch>>, usize)>,
    /// Heap bytes held by every scratch of the pool, as counted when each
    /// was last given back.
    held: AtomicU64,
    /// The most one scratch has held.
    largest: AtomicU64,
}

impl std::fmt::Debug for ScratchPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScratchPool")
            .field("held", &self.held)
            .field("largest", &self.largest)
            .finish_non_exhaustive()
    }
}

/// A scratch taken from a [`ScratchPool`]; goes back when dropped (a
/// panic in the sample included).
pub(crate) struct PooledScratch<'a> {
    pool: &'a ScratchPool,
    keep: usize,
    scratch: Option<Box<Scratch>>,
}

impl std::ops::Deref for PooledScratch<'_> {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        self.scratch.as_deref().expect("taken until drop")
    }
}

impl std::ops::DerefMut for PooledScratch<'_> {
    fn deref_mut(&mut self) -> &mut Scratch {
        self.scratch.as_deref_mut().expect("taken until drop")
    }
}

impl Drop for PooledScratch<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            self.pool.give_back(s, self.keep);
        }
    }
}

impl ScratchPool {
    /// A scratch for one sample; `keep` is how many the pool keeps once it
    /// is back (the gate's limit then): a surplus one, left by a lowered
    /// limit or a nested sample, is freed.
    pub(crate) fn take(&self, keep: usize) -> PooledScratch<'_> {
        let scratch = {
            let mut free = crate::sync::lock(&self.free);
            // The set this thread used last, if free: its buffers are warm
            // in this core's cache.
            let me = Some(std::thread::current().id());
            let mine = free.0.iter().rposition(|s| s.last_thread == me);
            match mine.map(|i| free.0.swap_remove(i)).or_else(|| free.0.pop()) {
                Some(s) => s,
                None => {
                    free.1 += 1;
                    Box::default()
                }
            }
        };
        PooledScratch {
            pool: self,
            keep,
            scratch: Some(scratch),
        }
    }

    fn give_back(&self, mut s: Box<Scratch>, keep: usize) {
        let bytes = s.bytes();
        let mut free = crate::sync::lock(&self.free);
        if free.1 > keep.max(1) {
            free.1 -= 1;
            self.held.fetch_sub(s.counted, Relaxed);
            drop(free);
            return;
        }
        self.held.fetch_add(bytes, Relaxed);
        self.held.fetch_sub(s.counted, Relaxed);
        self.largest.fetch_max(bytes, Relaxed);
        s.counted = bytes;
        s.last_thread = Some(std::thread::current().id());
        free.0.push(s);
    }

    /// Heap bytes the pool will hold with `workers` active workers: what
    /// its scratches hold now, plus the largest one's size for each worker
    /// beyond them.
    pub(crate) fn memory(&self, workers: usize) -> u64 {
        let made = crate::sync::lock(&self.free).1;
        self.held.load(Relaxed) + self.largest.load(Relaxed) * workers.saturating_sub(made) as u64
    }

    /// How many scratches exist now.
    pub(crate) fn count(&self) -> usize {
        crate::sync::lock(&self.free).1
    }
}

thread_local! {
    /// This thread's scratch for direct calls of [`ImageTransform::apply`]
    /// (the loader's workers use its [`ScratchPool`]).
    pub(super) static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_pool_holds_one_set_per_active_worker_and_counts_it() {
        let pool = ScratchPool::default();
        {
            // Two workers at once (limit 2), each growing its buffers.
            let mut a = pool.take(2);
            let mut b = pool.take(2);
            a.decoded.reserve_exact(1000);
            b.decoded.reserve_exact(3000);
            assert_eq!(pool.count(), 2);
        }
        let largest = pool.largest.load(Relaxed);
        assert!(largest >= 3000, "the largest set is counted: {largest}");
        assert!(
            pool.memory(0) >= 4000,
            "both sets are counted: {}",
            pool.memory(0)
        );
        // A third worker would add the largest set once more.
        assert_eq!(pool.memory(3), pool.memory(0) + largest);
        // The limit drops to 1: the set given back beyond it is freed and
        // uncounted; the one kept is reused, not duplicated.
        let held = pool.memory(0);
        drop(pool.take(1));
        assert_eq!(pool.count(), 1);
        assert!(pool.memory(0) < held, "{} < {held}", pool.memory(0));
        let one = pool.memory(0);
        for _ in 0..5 {
            drop(pool.take(1));
        }
        assert_eq!((pool.count(), pool.memory(0)), (1, one));
        // A read buffer kept for the next read counts too.
        {
            let mut s = pool.take(1);
            s.recycle_read_buffer(Vec::with_capacity(5000));
        }
        assert!(pool.memory(0) >= one + 5000);
        // And goes back to no set at all only if the pool is dropped.
        assert_eq!(pool.count(), 1);
    }
}
