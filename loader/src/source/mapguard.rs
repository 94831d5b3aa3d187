//! Surviving a memory-mapped file that is truncated while it is read.
//!
//! Token files stay memory-mapped (a positioned read per window halves the
//! token loader's rate). When such a file is cut short, the kernel removes
//! the pages past its new end from every mapping, and the next read of one
//! raises `SIGBUS`, which ends the process. On Linux, a mapping registered
//! here is guarded: a `SIGBUS` handler (installed once, chaining to the
//! handler that was there before) sees that the faulting address lies in a
//! registered mapping, maps a page of zeros over the lost page so the read
//! completes, and marks the mapping damaged. The reader checks
//! [`Guard::damaged`] after each read and reports an error naming the file
//! instead of the zeros it read. What Java does for a `MappedByteBuffer`
//! (an error instead of a crash), without unwinding from a signal handler.
//!
//! The handler does only what a signal handler may: atomic loads and
//! stores of a fixed table, and the `mmap` system call. A fault outside
//! every registered mapping goes to the previous handler, or, when there
//! was none, restores the default action, so the fault, raised again when
//! the instruction is retried, ends the process as it would have. A
//! handler installed later by the program replaces this one (the guard is
//! then gone, as before it existed). Elsewhere than Linux nothing is
//! guarded.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Mappings guarded at once; a mapping beyond them is not guarded.
const SLOTS: usize = 4096;

/// One registered mapping: `[start, end)`, empty when `end` is 0.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    taken: AtomicBool,
    damaged: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    taken: AtomicBool::new(false),
    damaged: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

/// A registered mapping; unregistered when dropped (drop it before the
/// mapping is unmapped).
#[derive(Debug)]
pub(crate) struct Guard {
    slot: Option<usize>,
}

impl Guard {
    /// Guards the mapping `bytes` (when a slot is free, on Linux).
    pub(crate) fn new(bytes: &[u8]) -> Self {
        if bytes.is_empty() || !imp::install() {
            return Self { slot: None };
        }
        let slot = TABLE.iter().position(|s| {
            s.taken
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        if let Some(i) = slot {
            let s = &TABLE[i];
            let start = bytes.as_ptr() as usize;
            s.damaged.store(false, Ordering::Release);
            s.start.store(start, Ordering::Release);
            s.end.store(start + bytes.len(), Ordering::Release);
        }
        Self { slot }
    }

    /// Whether a read of the mapping met a page the file no longer has
    /// (what was read there is zeros, not the file).
    pub(crate) fn damaged(&self) -> bool {
        self.slot
            .is_some_and(|i| TABLE[i].damaged.load(Ordering::Acquire))
    }

    /// Whether the mapping is guarded.
    #[cfg(test)]
    pub(crate) fn guarded(&self) -> bool {
        self.slot.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let s = &TABLE[i];
            // The range is empty before the slot can be taken again.
            s.end.store(0, Ordering::Release);
            s.start.store(0, Ordering::Release);
            s.taken.store(false, Ordering::Release);
        }
    }
}

/// The registered mapping holding `addr`, if any (async-signal-safe:
/// atomic loads only).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn slot_of(addr: usize) -> Option<&'static Slot> {
    TABLE.iter().find(|s| {
        let end = s.end.load(Ordering::Acquire);
        let start = s.start.load(Ordering::Acquire);
        start != 0 && start <= addr && addr < end
    })
}

#[cfg(target_os = "linux")]
mod imp {
    use super::slot_of;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    static PAGE: AtomicUsize = AtomicUsize::new(4096);

    /// The action before ours, for faults that are not ours.
    struct Previous(libc::sigaction);
    // SAFETY: a plain C struct of a handler address, flags and a signal
    // mask, written once before the handler can run and only read after.
    unsafe impl Sync for Previous {}
    // SAFETY: as for `Sync`.
    unsafe impl Send for Previous {}

    static PREVIOUS: OnceLock<Option<Previous>> = OnceLock::new();

    /// Installs the handler once; whether it is installed.
    pub(super) fn install() -> bool {
        PREVIOUS
            .get_or_init(|| {
                // SAFETY: sysconf has no preconditions.
                let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
                if page > 0 {
                    PAGE.store(page as usize, Ordering::Relaxed);
                }
                // SAFETY: a zeroed sigaction is a valid value (no handler,
                // no flags, an empty mask), filled in before use; the handler
                // is an `extern "C"` function of the SA_SIGINFO signature;
                // `old` receives the action replaced. PREVIOUS is set only
                // after the handler is installed, and the handler reads it
                // only after a fault, when `get_or_init` has returned for
                // the registering thread (no mapping is registered before).
                unsafe {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
                    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                    libc::sigemptyset(&mut action.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(libc::SIGBUS, &action, &mut old) != 0 {
                        return None;
                    }
                    Some(Previous(old))
                }
            })
            .is_some()
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO
        // handler; for a fault (si_code > 0: BUS_ADRERR and the like)
        // si_addr is the faulting address. A SIGBUS sent by a process
        // (si_code <= 0) carries no address and is never taken for ours.
        let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
        if let Some(slot) = (code > 0).then(|| slot_of(addr)).flatten() {
            let page = PAGE.load(Ordering::Relaxed);
            let at = addr & !(page - 1);
            // SAFETY: `at` is a page of a registered mapping, which is alive
            // (a guard is dropped before its mapping is unmapped) and read
            // only through `&[u8]` slices of it; MAP_FIXED replaces that one
            // page with a private page of zeros, readable as the old one
            // was, so the faulting read completes (with zeros, which the
            // reader discards on seeing `damaged`). mmap is a plain system
            // call, safe in a signal handler.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                slot.damaged.store(true, Ordering::Release);
                return;
            }
        }
        chain(sig, info, ctx);
    }

    /// Hands a fault that is not ours to the action before ours.
    fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let prev = PREVIOUS.get().and_then(Option::as_ref).map(|p| &p.0);
        match prev {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    // SAFETY: with SA_SIGINFO the previous handler has this
                    // signature (it was installed so).
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig, info, ctx);
                } else {
                    // SAFETY: without SA_SIGINFO it is a plain handler.
                    let f: extern "C" fn(libc::c_int) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig);
                }
            }
            _ => {
                // No handler before ours: the default action, which the
                // fault, raised again when the read is retried, takes.
                // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default
                // action; sigaction is async-signal-safe.
                unsafe {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &dfl, std::ptr::null_mut());
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    /// Nothing is guarded here.
    pub(super) fn install() -> bool {
        false
    }
}
