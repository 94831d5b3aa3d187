//! The fixed pool of host batch buffers: the loader's memory bound.
//!
//! At most `capacity` buffers exist between the dispatcher and the uploader;
//! the dispatcher blocks in [`Pool::acquire`] when all are out, which stops
//! decode work from running ahead of the consumer. A buffer is allocated the
//! first time a permit is used without a free buffer, then reused. Where the
//! uploader hands a buffer to the device tensor without copying (the CPU),
//! it returns only the permit and the next acquire allocates afresh.
//!
//! A pool with a pinned allocator (CUDA) allocates `capacity` buffers up
//! front, every later one from the same allocator (never ordinary memory),
//! and keeps every buffer for its life: page-locking and unlocking are slow
//! and may synchronize the device, so AUTOTUNE lowering the capacity only
//! leaves buffers idle.

use crate::error::Result;
use crate::transform::{Output, Slot};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// The storage of one batch's images.
#[derive(Debug)]
pub(crate) enum HostBuf {
    U8(Vec<u8>),
    F32(Vec<f32>),
    /// Page-locked memory for asynchronous copies to a CUDA device.
    #[cfg(feature = "cuda")]
    PinnedU8(crate::device::cuda::Pinned<u8>),
    #[cfg(feature = "cuda")]
    PinnedF32(crate::device::cuda::Pinned<f32>),
}

/// A buffer's elements, borrowed for writing.
enum View<'a> {
    U8(&'a mut [u8]),
    F32(&'a mut [f32]),
}

impl HostBuf {
    /// The elements; for a pinned buffer this first waits until the copy
    /// that last read it has completed.
    fn view(&mut self) -> Result<View<'_>> {
        Ok(match self {
            HostBuf::U8(v) => View::U8(v),
            HostBuf::F32(v) => View::F32(v),
            #[cfg(feature = "cuda")]
            HostBuf::PinnedU8(p) => View::U8(p.as_mut_slice()?),
            #[cfg(feature = "cuda")]
            HostBuf::PinnedF32(p) => View::F32(p.as_mut_slice()?),
        })
    }

    /// Waits until the buffer may be written (a pinned buffer's last copy
    /// to the device has completed). Called by the feeder, so decode workers
    /// never block on the device.
    pub(crate) fn wait_writable(&mut self) -> Result<()> {
        self.view().map(|_| ())
    }

    /// The slot of sample `i` in a buffer of `slot_len`-element slots.
    #[cfg(test)]
    pub(crate) fn slot(&mut self, i: usize, slot_len: usize) -> Slot<'_> {
        let r = i * slot_len..(i + 1) * slot_len;
        match self {
            HostBuf::U8(v) => Slot::U8(&mut v[r]),
            HostBuf::F32(v) => Slot::F32(&mut v[r]),
            #[cfg(feature = "cuda")]
            _ => unreachable!("tests use heap buffers"),
        }
    }

    /// The first `n` slots, one per sample, for parallel filling.
    pub(crate) fn slots(&mut self, n: usize, slot_len: usize) -> Result<Vec<Slot<'_>>> {
        Ok(match self.view()? {
            View::U8(v) => v[..n * slot_len]
                .chunks_exact_mut(slot_len)
                .map(Slot::U8)
                .collect(),
            View::F32(v) => v[..n * slot_len]
                .chunks_exact_mut(slot_len)
                .map(Slot::F32)
                .collect(),
        })
    }

    /// Moves slot `from` to slot `to` (`to < from`), closing a gap left by a
    /// skipped sample.
    pub(crate) fn move_slot(&mut self, from: usize, to: usize, slot_len: usize) -> Result<()> {
        let src = from * slot_len..(from + 1) * slot_len;
        match self.view()? {
            View::U8(v) => v.copy_within(src, to * slot_len),
            View::F32(v) => v.copy_within(src, to * slot_len),
        }
        Ok(())
    }
}

/// Asks the kernel to back the 2 MiB-aligned part of `v` with transparent
/// huge pages (Linux; a no-op elsewhere or when THP is off).
fn advise_huge_pages<T>(v: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(v);
        let first = start.next_multiple_of(HUGE);
        let last = end & !(HUGE - 1);
        if last > first {
            // SAFETY: [first, last) lies inside `v`'s allocation, which we
            // borrow mutably; MADV_HUGEPAGE only changes how the kernel backs
            // those pages, never their contents, so no Rust invariant changes.
            // A failure (THP disabled) is harmless and ignored.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

#[derive(Debug)]
struct State {
    free: Vec<HostBuf>,
    out: usize,
    /// Buffers the pinned allocator made (all kept).
    pinned: usize,
}

/// Makes one page-locked buffer.
pub(crate) type PinnedAlloc = Box<dyn Fn() -> Result<HostBuf> + Send + Sync>;

/// A bounded set of batch buffers of one size and element type.
pub(crate) struct Pool {
    capacity: std::sync::atomic::AtomicUsize,
    elems: usize,
    output: Output,
    pinned: Option<PinnedAlloc>,
    state: Mutex<State>,
    cv: Condvar,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("capacity", &self.capacity)
            .field("pinned", &self.pinned.is_some())
            .field("state", &self.state)
            .finish()
    }
}

impl Pool {
    /// A pool of `capacity` buffers of `elems` elements each, allocated on
    /// first use; with `pinned`, `capacity` of them are allocated now by it
    /// and every later one too.
    pub(crate) fn new(
        capacity: usize,
        elems: usize,
        output: Output,
        pinned: Option<PinnedAlloc>,
    ) -> Result<Self> {
        let free = match &pinned {
            Some(alloc) => (0..capacity.max(1))
                .map(|_| alloc())
                .collect::<Result<_>>()?,
            None => Vec::new(),
        };
        Ok(Self {
            capacity: capacity.max(1).into(),
            elems,
            output,
            state: Mutex::new(State {
                pinned: free.len(),
                free,
                out: 0,
            }),
            pinned,
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent under a panic (two plain updates), so a
        // poisoned lock is still usable.
        crate::lock(&self.state)
    }

    /// Takes a buffer, blocking while all are out. Returns `None` once
    /// `cancel` is set (call [`Pool::wake`] after setting it), an error when
    /// a pinned allocation failed (its permit is returned).
    pub(crate) fn acquire(&self, cancel: &AtomicBool) -> Option<Result<HostBuf>> {
        let mut st = self.lock();
        loop {
            if cancel.load(Ordering::Acquire) {
                return None;
            }
            if st.out < self.capacity.load(Ordering::Relaxed) {
                st.out += 1;
                if let Some(buf) = st.free.pop() {
                    return Some(Ok(buf));
                }
                let Some(alloc) = &self.pinned else {
                    return Some(Ok(self.allocate()));
                };
                // Outside the lock: page-locking takes milliseconds.
                drop(st);
                let buf = alloc();
                let mut st = self.lock();
                match buf {
                    Ok(_) => st.pinned += 1,
                    Err(_) => st.out -= 1,
                }
                return Some(buf);
            }
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A new zeroed buffer. Large zeroed allocations are fresh mappings whose
    /// pages are faulted in by the first write; asking for huge pages makes
    /// that 512x fewer faults, which matters on the CPU where every batch is
    /// a new buffer (it becomes the tensor).
    fn allocate(&self) -> HostBuf {
        match self.output {
            Output::U8Nhwc => {
                let mut v = vec![0u8; self.elems];
                advise_huge_pages(&mut v);
                HostBuf::U8(v)
            }
            Output::F32Nchw { .. } => {
                let mut v = vec![0f32; self.elems];
                advise_huge_pages(&mut v);
                HostBuf::F32(v)
            }
        }
    }

    /// Gives a permit back, with its buffer when the buffer can be reused.
    /// A pinned pool's buffer is always reused, so `None` there means it was
    /// lost (an error or a panic dropped it).
    pub(crate) fn release(&self, buf: Option<HostBuf>) {
        let mut st = self.lock();
        st.out = st.out.saturating_sub(1);
        if buf.is_none() && self.pinned.is_some() {
            st.pinned = st.pinned.saturating_sub(1);
        }
        if let Some(b) = buf {
            st.free.push(b);
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Changes how many buffers may be out at once (AUTOTUNE). Ordinary
    /// buffers above a lowered capacity are dropped; pinned ones are kept.
    pub(crate) fn set_capacity(&self, n: usize) {
        let mut st = self.lock();
        self.capacity.store(n.max(1), Ordering::Relaxed);
        if self.pinned.is_none() {
            let keep = n.max(1).saturating_sub(st.out);
            st.free.truncate(keep);
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Pinned buffers allocated so far (all still held by the pool or out).
    pub(crate) fn pinned(&self) -> usize {
        self.lock().pinned
    }

    /// Wakes every blocked `acquire` so it can see a cancel flag.
    pub(crate) fn wake(&self) {
        let _guard = self.lock();
        self.cv.notify_all();
    }

    /// Buffers currently out of the pool.
    #[cfg(test)]
    pub(crate) fn out(&self) -> usize {
        self.lock().out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn blocks_at_capacity_and_reuses_buffers() {
        let pool = Arc::new(Pool::new(2, 4, Output::U8Nhwc, None).unwrap());
        let cancel = Arc::new(AtomicBool::new(false));
        let mut a = pool.acquire(&cancel).unwrap().unwrap();
        if let Slot::U8(s) = a.slot(0, 4) {
            s[0] = 9;
        }
        let _b = pool.acquire(&cancel).unwrap().unwrap();
        let (p, c) = (pool.clone(), cancel.clone());
        let waiter = std::thread::spawn(move || p.acquire(&c));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "third acquire must block");
        pool.release(Some(a));
        let reused = waiter.join().unwrap().unwrap().unwrap();
        assert!(matches!(&reused, HostBuf::U8(v) if v[0] == 9));
        assert_eq!(pool.out(), 2);
    }

    #[test]
    fn cancel_unblocks_acquire() {
        let pool = Arc::new(Pool::new(1, 4, Output::U8Nhwc, None).unwrap());
        let cancel = Arc::new(AtomicBool::new(false));
        let _a = pool.acquire(&cancel).unwrap().unwrap();
        let (p, c) = (pool.clone(), cancel.clone());
        let waiter = std::thread::spawn(move || p.acquire(&c));
        std::thread::sleep(Duration::from_millis(20));
        cancel.store(true, Ordering::Release);
        pool.wake();
        assert!(waiter.join().unwrap().is_none());
    }

    #[test]
    fn pinned_buffers_survive_autotune_and_growth_is_pinned() {
        // A stand-in for page-locked memory: every buffer the allocator
        // makes is marked, so a heap buffer would show.
        let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let m = made.clone();
        let alloc: PinnedAlloc = Box::new(move || {
            m.fetch_add(1, Ordering::Relaxed);
            Ok(HostBuf::U8(vec![7; 4]))
        });
        let pool = Pool::new(2, 4, Output::U8Nhwc, Some(alloc)).unwrap();
        assert_eq!(
            made.load(Ordering::Relaxed),
            2,
            "the capacity is allocated up front"
        );
        let cancel = AtomicBool::new(false);
        let take = |n: usize| -> Vec<HostBuf> {
            (0..n)
                .map(|_| pool.acquire(&cancel).unwrap().unwrap())
                .collect()
        };
        // Shrink while buffers are out, grow past the preallocation; twice.
        let mut held = take(2);
        for _ in 0..2 {
            pool.set_capacity(1);
            for b in held {
                pool.release(Some(b));
            }
            pool.set_capacity(5);
            held = take(5);
            assert!(held
                .iter()
                .all(|b| matches!(b, HostBuf::U8(v) if v[0] == 7)));
        }
        assert_eq!(
            made.load(Ordering::Relaxed),
            5,
            "no buffer freed and made again"
        );
        assert_eq!(pool.pinned(), 5);
    }
}
