//! Surviving a memory-mapped file that is truncated while it is read.
//!
//! Token files stay memory-mapped (a positioned read per window halves the
//! token loader's rate). When such a file is cut short, the kernel removes
//! the pages past its new end from every mapping, and the next read of one
//! raises `SIGBUS`, which ends the process. On Linux, a mapping registered
//! here is guarded: a `SIGBUS` handler (installed once, chaining to the
//! handler that was there before) sees that the faulting address lies in a
//! registered mapping, maps a page of zeros over the lost page so the read
//! completes, and marks the mapping damaged (before the `mmap`, so no
//! reader can see the zeros and an unmarked mapping). The reader checks
//! [`Guard::damaged`] before each read (a damaged mapping is not touched
//! again: every fault costs the process two more memory mappings, and
//! `vm.max_map_count` ends it after some 32,000) and after it, and
//! reports an error naming the file instead of the zeros it read. What
//! Java does for a `MappedByteBuffer` (an error instead of a crash),
//! without unwinding from a signal handler. The reader may also
//! [`clear`](Guard::clear) the mark once it has mapped the file anew (a
//! page that could not be read, not a truncation).
//!
//! The handler does only what a signal handler may: atomic loads and
//! stores of a fixed table, and the `mmap` system call. A fault outside
//! every registered mapping goes to the previous handler, or, when there
//! was none, restores the default action, so the fault, raised again when
//! the instruction is retried, ends the process as it would have (a
//! `SIGBUS` sent by a process is raised again under the default action,
//! or ignored when it was ignored before). The previous action is read
//! before ours is installed, and chained to as its flags say (its mask,
//! `SA_NODEFER`, `SA_RESETHAND`, `SA_SIGINFO`).
//!
//! Platform limits: a handler installed later by the program replaces this
//! one (the guard is then gone, as before it existed); a thread that
//! blocks `SIGBUS` gets the default action from the kernel on a fault,
//! so the loader's own threads unblock it ([`unblock`]) and a program
//! that reads token files on its own threads must not block it; at most
//! 4,096 mappings are guarded at once (a warning names the first one
//! that is not). Elsewhere than Linux nothing is guarded.

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
    /// The mark of a mapping without a slot (not guarded against faults,
    /// but a reader can still mark it: a cut seen by its size).
    marked: AtomicBool,
}

impl Guard {
    /// Guards the mapping `bytes` when a slot is free (on Linux); `None`
    /// otherwise, for a reader that then copies the file instead.
    pub(crate) fn try_new(bytes: &[u8]) -> Option<Self> {
        let g = Self::register(bytes);
        g.guarded().then_some(g)
    }

    /// Guards the mapping `bytes` (when a slot is free, on Linux).
    pub(crate) fn new(bytes: &[u8]) -> Self {
        let g = Self::register(bytes);
        if !g.guarded() && !bytes.is_empty() && imp::install() {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "wick: more than {SLOTS} memory-mapped token files are open: the ones past \
                     it are not guarded, and a truncation while they are read is SIGBUS"
                )
            });
        }
        g
    }

    /// Registers the mapping `bytes` in a free slot, if any.
    fn register(bytes: &[u8]) -> Self {
        let marked = AtomicBool::new(false);
        if bytes.is_empty() || !imp::install() {
            return Self { slot: None, marked };
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
        Self { slot, marked }
    }

    /// Whether a read of the mapping met a page the file no longer has
    /// or could not read (what was read there is zeros, not the file), or
    /// the reader marked it.
    pub(crate) fn damaged(&self) -> bool {
        self.marked.load(Ordering::Acquire)
            || self
                .slot
                .is_some_and(|i| TABLE[i].damaged.load(Ordering::Acquire))
    }

    /// Marks the mapping damaged (the reader saw the file cut short).
    pub(crate) fn mark(&self) {
        self.marked.store(true, Ordering::Release);
    }

    /// Clears the mark, once the reader has mapped the file anew over the
    /// whole mapping (no page of zeros is left in it).
    pub(crate) fn clear(&self) {
        self.marked.store(false, Ordering::Release);
        if let Some(i) = self.slot {
            TABLE[i].damaged.store(false, Ordering::Release);
        }
    }

    /// Whether the mapping is guarded.
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
    // mask, written once before the handler is installed and only read
    // after.
    unsafe impl Sync for Previous {}
    // SAFETY: as for `Sync`.
    unsafe impl Send for Previous {}

    /// Set before our handler is installed, so the handler always finds
    /// it (a fault on another thread during the installation included).
    static PREVIOUS: OnceLock<Previous> = OnceLock::new();
    static INSTALLED: OnceLock<bool> = OnceLock::new();

    /// Installs the handler once; whether it is installed.
    pub(super) fn install() -> bool {
        *INSTALLED.get_or_init(|| {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            // SAFETY: a zeroed sigaction is a valid value (no handler, no
            // flags, an empty mask); `sigaction` with a null new action
            // only reads the current one into `old`.
            let old = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                    return false;
                }
                old
            };
            if PREVIOUS.set(Previous(old)).is_err() {
                return false;
            }
            // SAFETY: as above, the action is filled in before use; the
            // handler is an `extern "C"` function of the SA_SIGINFO
            // signature. (A handler the program installs between the read
            // above and this call would be replaced unchained: the program
            // installs its own before or after the loader, not during.)
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0
            }
        })
    }

    /// Unblocks `SIGBUS` on the calling thread: a fault on a thread that
    /// blocks it takes the default action whatever the handler.
    pub(crate) fn unblock() {
        // SAFETY: a set built by sigemptyset/sigaddset, passed to
        // pthread_sigmask, which changes only this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
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
            // Marked before the page of zeros exists, so a reader that
            // reads it also sees the mark.
            slot.damaged.store(true, Ordering::SeqCst);
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
                return;
            }
        }
        chain(sig, code, info, ctx);
    }

    /// Hands a signal that is not ours to the action before ours.
    fn chain(
        sig: libc::c_int,
        code: libc::c_int,
        info: *mut libc::siginfo_t,
        ctx: *mut libc::c_void,
    ) {
        let prev = PREVIOUS.get().map(|p| &p.0);
        let sent = code <= 0;
        match prev {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                // SAFETY: sigaction, pthread_sigmask, sigaddset and
                // sigdelset are async-signal-safe. The previous handler
                // runs with the mask it asked for (its sa_mask, plus the
                // signal unless SA_NODEFER), and SA_RESETHAND resets the
                // action first, as the kernel would have.
                unsafe {
                    if p.sa_flags & libc::SA_RESETHAND != 0 {
                        let mut dfl: libc::sigaction = std::mem::zeroed();
                        dfl.sa_sigaction = libc::SIG_DFL;
                        libc::sigaction(sig, &dfl, std::ptr::null_mut());
                    }
                    let mut old: libc::sigset_t = std::mem::zeroed();
                    libc::pthread_sigmask(libc::SIG_BLOCK, &p.sa_mask, &mut old);
                    if p.sa_flags & libc::SA_NODEFER != 0 {
                        let mut own: libc::sigset_t = std::mem::zeroed();
                        libc::sigemptyset(&mut own);
                        libc::sigaddset(&mut own, sig);
                        libc::pthread_sigmask(libc::SIG_UNBLOCK, &own, std::ptr::null_mut());
                    }
                    if p.sa_flags & libc::SA_SIGINFO != 0 {
                        // SAFETY: with SA_SIGINFO the previous handler has
                        // this signature (it was installed so).
                        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                            std::mem::transmute(p.sa_sigaction);
                        f(sig, info, ctx);
                    } else {
                        // SAFETY: without SA_SIGINFO it is a plain handler.
                        let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                        f(sig);
                    }
                    libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                }
            }
            // Ignored before: a sent SIGBUS stays ignored (and the guard
            // stays). A fault cannot be ignored (the instruction would
            // fault forever): the default action below, as the kernel
            // forces it.
            Some(p) if p.sa_sigaction == libc::SIG_IGN && sent => {}
            _ => {
                // The default action: a fault, raised again when the read
                // is retried, takes it; a sent signal is raised again (it
                // stays pending while this handler runs, and is delivered
                // to the default action when it returns).
                // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default
                // action; sigaction and raise are async-signal-safe.
                unsafe {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &dfl, std::ptr::null_mut());
                    if sent {
                        libc::raise(sig);
                    }
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

    /// Nothing to unblock for.
    pub(crate) fn unblock() {}
}

pub(crate) use imp::unblock;

#[cfg(all(test, target_os = "linux"))]
#[path = "mmap_tests.rs"]
mod tests;
