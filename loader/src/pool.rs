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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

struct State<B> {
    /// Buffers back in the pool, ready for reuse.
    free: Vec<B>,
    /// Permits taken and not yet given back (buffers out of the pool).
    out: usize,
    /// Buffers a keeping pool made (all kept).
    kept: usize,
    /// Threads blocked in `acquire`: a release wakes them only when there
    /// are any (a wake-up is a system call, once per batch otherwise).
    waiting: usize,
}

/// Makes one buffer (zeroed host memory, or page-locked memory: the device
/// module decides).
pub(crate) type Alloc<B> = Box<dyn Fn() -> Result<B> + Send + Sync>;

/// A bounded set of buffers, made by one allocator.
pub(crate) struct Pool<B> {
    capacity: std::sync::atomic::AtomicUsize,
    alloc: Alloc<B>,
    /// Every buffer is kept for the pool's life (page-locked memory).
    keep: bool,
    state: Mutex<State<B>>,
    cv: Condvar,
}

impl<B> std::fmt::Debug for Pool<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Pool")
            .field("capacity", &self.capacity)
            .field("keep", &self.keep)
            .field("free", &st.free.len())
            .field("out", &st.out)
            .finish()
    }
}

impl<B> Pool<B> {
    /// A pool of `capacity` buffers made by `alloc` on first use; with
    /// `keep`, `capacity` of them are made now, and every buffer is kept.
    pub(crate) fn new(capacity: usize, alloc: Alloc<B>, keep: bool) -> Result<Self> {
        let free = if keep {
            (0..capacity.max(1))
                .map(|_| alloc())
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        Ok(Self {
            capacity: capacity.max(1).into(),
            alloc,
            keep,
            state: Mutex::new(State {
                kept: free.len(),
                free,
                out: 0,
                waiting: 0,
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // The state stays consistent under a panic (two plain updates), so a
        // poisoned lock is still usable.
        crate::sync::lock(&self.state)
    }

    /// Takes a buffer, blocking while all are out. Returns `None` once
    /// `cancel` is set (call [`Pool::wake`] after setting it), an error when
    /// a pinned allocation failed (its permit is returned).
    pub(crate) fn acquire(&self, cancel: &AtomicBool) -> Option<Result<B>> {
        self.take(Some(cancel))
    }

    /// Takes a buffer if a permit is free, without waiting: `None` when
    /// all are out.
    pub(crate) fn try_acquire(&self) -> Option<Result<B>> {
        self.take(None)
    }

    /// Permits not taken (0 while all are out).
    pub(crate) fn free_permits(&self) -> usize {
        let st = self.lock();
        self.capacity.load(Ordering::Relaxed).saturating_sub(st.out)
    }

    /// `acquire` waiting until `cancel` (`Some`), or `try_acquire`.
    fn take(&self, wait: Option<&AtomicBool>) -> Option<Result<B>> {
        let mut st = self.lock();
        loop {
            if wait.is_some_and(|cancel| cancel.load(Ordering::Acquire)) {
                return None;
            }
            if st.out < self.capacity.load(Ordering::Relaxed) {
                st.out += 1;
                if let Some(buf) = st.free.pop() {
                    return Some(Ok(buf));
                }
                // Outside the lock: page-locking takes milliseconds.
                drop(st);
                let buf = (self.alloc)();
                let mut st = self.lock();
                match buf {
                    Ok(_) if self.keep => st.kept += 1,
                    Ok(_) => {}
                    Err(_) => st.out -= 1,
                }
                return Some(buf);
            }
            wait?;
            st = crate::sync::wait_counted(&self.cv, st, |s| &mut s.waiting);
        }
    }

    /// Gives a permit back, with its buffer when the buffer can be reused.
    /// A keeping pool's buffer is always reused, so `None` there means it
    /// was lost (an error or a panic dropped it).
    pub(crate) fn release(&self, buf: Option<B>) {
        let mut st = self.lock();
        st.out = st.out.saturating_sub(1);
        if buf.is_none() && self.keep {
            st.kept = st.kept.saturating_sub(1);
        }
        if let Some(b) = buf {
            st.free.push(b);
        }
        // The feeder is woken once half the permits are free, not for
        // each one: it then dispatches several batches in one turn, and
        // for a cheap map (a token batch is tens of microseconds) a
        // wake-up per batch is a good part of the batch's cost. Every
        // permit out comes back without the feeder (a batch in flight is
        // filled and uploaded by other threads), so the count reaches
        // that mark.
        let cap = self.capacity.load(Ordering::Relaxed);
        let wake = st.waiting > 0 && cap.saturating_sub(st.out) >= cap.div_ceil(2);
        drop(st);
        if wake {
            self.cv.notify_all();
        }
    }

    /// Changes how many buffers may be out at once (AUTOTUNE). Ordinary
    /// buffers above a lowered capacity are dropped; pinned ones are kept.
    pub(crate) fn set_capacity(&self, n: usize) {
        let mut st = self.lock();
        self.capacity.store(n.max(1), Ordering::Relaxed);
        if !self.keep {
            let keep = n.max(1).saturating_sub(st.out);
            st.free.truncate(keep);
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Buffers a keeping pool made so far (all still held by it or out).
    pub(crate) fn kept(&self) -> usize {
        self.lock().kept
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
        let pool = Arc::new(Pool::new(2, Box::new(|| Ok(vec![0u8; 4])), false).unwrap());
        let cancel = Arc::new(AtomicBool::new(false));
        let mut a = pool.acquire(&cancel).unwrap().unwrap();
        a[0] = 9;
        let _b = pool.acquire(&cancel).unwrap().unwrap();
        let (p, c) = (pool.clone(), cancel.clone());
        let waiter = std::thread::spawn(move || p.acquire(&c));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "third acquire must block");
        pool.release(Some(a));
        let reused = waiter.join().unwrap().unwrap().unwrap();
        assert_eq!(reused[0], 9);
        assert_eq!(pool.out(), 2);
    }

    #[test]
    fn try_acquire_takes_a_free_permit_and_never_waits() {
        let pool = Pool::new(2, Box::new(|| Ok(vec![0u8; 4])), false).unwrap();
        assert_eq!(pool.free_permits(), 2);
        let a = pool.try_acquire().unwrap().unwrap();
        let _b = pool.try_acquire().unwrap().unwrap();
        assert_eq!(pool.free_permits(), 0);
        assert!(pool.try_acquire().is_none(), "all out: no wait, no buffer");
        pool.release(Some(a));
        assert_eq!(pool.free_permits(), 1);
        assert!(pool.try_acquire().is_some());
    }

    #[test]
    fn cancel_unblocks_acquire() {
        let pool = Arc::new(Pool::new(1, Box::new(|| Ok(vec![0u8; 4])), false).unwrap());
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
        let alloc: Alloc<Vec<u8>> = Box::new(move || {
            m.fetch_add(1, Ordering::Relaxed);
            Ok(vec![7; 4])
        });
        let pool = Pool::new(2, alloc, true).unwrap();
        assert_eq!(
            made.load(Ordering::Relaxed),
            2,
            "the capacity is allocated up front"
        );
        let cancel = AtomicBool::new(false);
        let take = |n: usize| -> Vec<Vec<u8>> {
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
            assert!(held.iter().all(|b| b[0] == 7));
        }
        assert_eq!(
            made.load(Ordering::Relaxed),
            5,
            "no buffer freed and made again"
        );
        assert_eq!(pool.kept(), 5);
    }
}
