//! AUTOTUNE: the loader sizes its own parallelism, batches in flight and
//! prefetch depth from what it measures, within a RAM budget.
//!
//! Like tf.data's autotuner it is a hill climb, but driven by the numbers
//! that matter, the consumer's wait and its own step time: while the
//! training loop waits (more than 5% of a window), grow one knob (decode
//! workers first, in proportion to the wait, up to 4x a step, unless the
//! measured per-stage times say the upload thread is the slower stage;
//! then batches in flight, then prefetch, each doubled). A worker count is
//! kept only if the batch cycle (the consumer's step plus its wait) got 3%
//! shorter: a worker that lengthens the step by more than it shortens the
//! wait is undone, and a count that did not help caps the next tries,
//! which halve the gap to it, for 50 windows. More buffers are kept (they
//! cost memory within the budget, no CPU). While the consumer never waits,
//! give workers back, a quarter of the surplus at a time, and keep that
//! only if throughput held, never going below a count once grown past
//! because the consumer waited. Windows are at least 8 batches and 0.2 s,
//! or 2 batches and 0.5 s at low rates, and run across epochs. Explicit
//! settings are left alone.

mod budget;
mod policy;

use crate::stats::Counters;
pub(crate) use budget::{core_ceiling, default_budget, local_ranks, Budget};
use policy::{Policy, Window};
pub use policy::{TuneAction, TuneKnob};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How one of the loader's parallelism settings is chosen: by AUTOTUNE
/// (the default), or fixed. A plain number is a fixed setting:
/// `.workers(4)`, `.workers(AUTOTUNE)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Setting {
    /// The loader tunes it while it runs.
    #[default]
    Auto,
    /// Exactly this many (at least 1: `build` rejects 0).
    Fixed(usize),
}

/// [`Setting::Auto`], named as tf.data names it.
pub const AUTOTUNE: Setting = Setting::Auto;

impl Setting {
    /// The command-line convention: `0` is AUTOTUNE, any other number that
    /// many (what `wick --workers 0` and the training example's flags mean).
    pub fn auto_if_zero(n: usize) -> Self {
        match n {
            0 => AUTOTUNE,
            n => Setting::Fixed(n),
        }
    }
}

impl From<usize> for Setting {
    fn from(n: usize) -> Self {
        Setting::Fixed(n)
    }
}

/// A window is at least this many batches and [`WINDOW_TIME`] long...
const WINDOW_BATCHES: u64 = 8;
/// ...and at least this long.
const WINDOW_TIME: Duration = Duration::from_millis(200);
/// ...or, at a low rate, at least 2 batches and this long: a window is
/// bounded in time, so one worker's slow batches do not hold the ramp for
/// seconds.
const WINDOW_TIME_LOW_RATE: Duration = Duration::from_millis(500);

/// Whether a window of `batches` over `dt` is long enough to judge.
pub(crate) fn window_closes(batches: u64, dt: Duration) -> bool {
    (batches >= WINDOW_BATCHES && dt >= WINDOW_TIME) || (batches >= 2 && dt >= WINDOW_TIME_LOW_RATE)
}

/// Most batches in flight or prefetched AUTOTUNE goes to.
pub(crate) const MAX_QUEUE: usize = 8;

/// A counting gate: at most `limit` holders at once (the active workers).
///
/// No thread ever waits for a pass. A decode thread that waits inside a
/// rayon job can deadlock the pool: a map or source that uses rayon
/// (`join`, `scope`, `par_iter`) lets another pool thread steal its
/// sub-job, and that thread, waiting for the sub-job's siblings, runs
/// whatever is queued (a pump or a runner) on its own stack; had that job
/// blocked here on the pass held by the thread waiting for the sub-job,
/// neither could go on. So a job that finds the gate full is *deferred*:
/// [`Gate::enter_or_defer`] queues the job and returns at once, and the
/// pass given back next starts it again on the pool (where it tries once
/// more). While jobs are queued a holder exists that will give a pass
/// back: a job is queued only while `active >= limit >= 1`.
pub(crate) struct Gate {
    state: Mutex<GateState>,
    /// Where a deferred job is started again (the loader's decode pool;
    /// weak, so the gate does not keep the pool's threads alive).
    pool: std::sync::OnceLock<std::sync::Weak<rayon::ThreadPool>>,
}

/// A job waiting for a pass.
type Deferred = Box<dyn FnOnce() + Send>;

struct GateState {
    limit: usize,
    active: usize,
    /// Jobs that found the gate full, in the order they came.
    queue: std::collections::VecDeque<Deferred>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Gate")
            .field("limit", &st.limit)
            .field("active", &st.active)
            .field("deferred", &st.queue.len())
            .finish()
    }
}

/// Holds a place in a [`Gate`] until dropped (`None`: a nested entry on a
/// thread that already holds one, which takes no place).
#[derive(Debug)]
pub(crate) struct GatePass<'a>(Option<&'a Gate>);

std::thread_local! {
    /// Whether this thread holds a pass of some gate. A `Source` that uses
    /// rayon inside `read` lets this pool thread run another sample while it
    /// waits (work stealing); that sample goes through on this thread's
    /// pass (it adds no parallelism).
    static HOLDS_PASS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.0 {
            HOLDS_PASS.with(|h| h.set(false));
            let mut st = gate.lock();
            st.active -= 1;
            let start = gate.take_startable(&mut st);
            drop(st);
            gate.start(start);
        }
    }
}

impl Gate {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            state: Mutex::new(GateState {
                limit: limit.max(1),
                active: 0,
                queue: std::collections::VecDeque::new(),
            }),
            pool: std::sync::OnceLock::new(),
        }
    }

    /// The pool deferred jobs are started on (set once, when the loader's
    /// decode pool exists).
    pub(crate) fn set_pool(&self, pool: &Arc<rayon::ThreadPool>) {
        let _ = self.pool.set(Arc::downgrade(pool));
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        crate::sync::lock(&self.state)
    }

    /// A pass when a place is free or this thread holds one already (a
    /// nested entry: rayon running another sample inside a sample on this
    /// thread goes through at once); otherwise `again` is queued, to be
    /// started on the pool when a pass is given back, and `None` is
    /// returned: the caller gives up its turn (it must hold nothing
    /// another job waits for).
    pub(crate) fn enter_or_defer(
        &self,
        again: impl FnOnce() + Send + 'static,
    ) -> Option<GatePass<'_>> {
        if HOLDS_PASS.with(|h| h.get()) {
            return Some(GatePass(None));
        }
        let mut st = self.lock();
        if st.active >= st.limit {
            st.queue.push_back(Box::new(again));
            return None;
        }
        st.active += 1;
        HOLDS_PASS.with(|h| h.set(true));
        Some(GatePass(Some(self)))
    }

    /// The queued jobs there are places for now (each then tries again:
    /// one that loses its place to another entry is queued anew).
    fn take_startable(&self, st: &mut GateState) -> Vec<Deferred> {
        let free = st.limit.saturating_sub(st.active);
        let n = free.min(st.queue.len());
        st.queue.drain(..n).collect()
    }

    /// Starts queued jobs there are places for: a job started again that
    /// ends without taking its place (it found nothing left to do) calls
    /// it, so the jobs queued behind it are not left waiting for a pass
    /// nobody holds.
    pub(crate) fn kick(&self) {
        let mut st = self.lock();
        let start = self.take_startable(&mut st);
        drop(st);
        self.start(start);
    }

    fn start(&self, jobs: Vec<Deferred>) {
        if jobs.is_empty() {
            return;
        }
        match self.pool.get().and_then(std::sync::Weak::upgrade) {
            Some(pool) => jobs.into_iter().for_each(|job| pool.spawn_fifo(job)),
            // No pool (a test's bare gate, or a loader being dropped after
            // its epochs ended): run them here.
            None => jobs.into_iter().for_each(|job| job()),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.lock().limit
    }

    pub(crate) fn set_limit(&self, n: usize) {
        self.lock().limit = n.max(1);
        self.kick();
    }

    /// Jobs waiting for a pass.
    #[cfg(test)]
    pub(crate) fn deferred(&self) -> usize {
        self.lock().queue.len()
    }
}

/// Which settings AUTOTUNE owns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Auto {
    pub(crate) workers: bool,
    pub(crate) in_flight: bool,
    pub(crate) prefetch: bool,
}

/// The knobs the tuner turns, read by the pipeline.
#[derive(Debug)]
pub(crate) struct Knobs {
    pub(crate) gate: Gate,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) prefetch: AtomicUsize,
    /// Upper bound of the pool's threads.
    pub(crate) max_workers: usize,
    /// What the settings cost in host memory, and the limit.
    pub(crate) budget: Budget,
}

/// One AUTOTUNE decision, for [`crate::Loader::autotune_history`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TuneStep {
    /// Time since the loader started.
    pub at: Duration,
    /// Decode workers after the step.
    pub workers: usize,
    /// Batches in flight after the step.
    pub in_flight: usize,
    /// Prefetch depth after the step.
    pub prefetch: usize,
    /// Batches per second measured in the window that led to the step.
    pub batches_per_sec: f64,
    /// Share of that window the consumer waited.
    pub wait_share: f64,
    /// What was done.
    pub action: TuneAction,
}

/// Where a window starts, and the history.
#[derive(Debug)]
struct State {
    window_start: Instant,
    batches_at: u64,
    wait_at: Duration,
    all_wait_at: Duration,
    /// Whether the first batch came (the first window starts there).
    started: bool,
    policy: Policy,
    history: Vec<TuneStep>,
}

/// The hill climber, run by the consumer after each batch: it measures a
/// window, asks [`Policy::decide`] and applies the step.
#[derive(Debug)]
pub(crate) struct Tuner {
    auto: Auto,
    origin: Instant,
    state: Mutex<State>,
}

impl Tuner {
    pub(crate) fn new(auto: Auto) -> Self {
        Self {
            auto,
            origin: Instant::now(),
            state: Mutex::new(State {
                window_start: Instant::now(),
                batches_at: 0,
                wait_at: Duration::ZERO,
                all_wait_at: Duration::ZERO,
                started: false,
                policy: Policy::new(auto),
                history: Vec::new(),
            }),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.auto.workers || self.auto.in_flight || self.auto.prefetch
    }

    pub(crate) fn history(&self) -> Vec<TuneStep> {
        crate::sync::lock(&self.state).history.clone()
    }

    /// See [`Policy::step_slowdown`].
    pub(crate) fn step_slowdown(&self) -> Option<(f64, usize, f64)> {
        crate::sync::lock(&self.state).policy.step_slowdown()
    }

    /// Called after each delivered batch; may turn a knob. `set_in_flight`
    /// applies a new batches-in-flight value to the pool.
    pub(crate) fn on_batch(
        &self,
        knobs: &Knobs,
        counters: &Counters,
        (cache, direct): (u64, &dyn Fn() -> bool),
        set_in_flight: &dyn Fn(usize),
    ) {
        let now_knobs = || {
            [
                knobs.gate.limit(),
                knobs.in_flight.load(Relaxed),
                knobs.prefetch.load(Relaxed),
            ]
        };
        let memory = |c: &Counters| {
            let [w, f, p] = now_knobs();
            c.set_memory(knobs.budget.memory(f, p, w, cache));
        };
        memory(counters);
        if !self.enabled() {
            return;
        }
        let mut st = crate::sync::lock(&self.state);
        let now = Instant::now();
        if !st.started {
            // The first window starts at the first batch: the pipeline's
            // start (threads, first reads, a device's setup) is no
            // measure of a setting's rate.
            st.started = true;
            st.window_start = now;
            st.batches_at = counters.delivered();
            st.wait_at = counters.steady_wait();
            st.all_wait_at = counters.all_wait();
            return;
        }
        let dt = now.duration_since(st.window_start);
        let batches = counters.delivered().saturating_sub(st.batches_at);
        if !window_closes(batches, dt) {
            return;
        }
        let rate = batches as f64 / dt.as_secs_f64();
        let waited = counters.steady_wait().saturating_sub(st.wait_at);
        let wait_share = waited.as_secs_f64() / dt.as_secs_f64();
        // The consumer's own time: the window less every wait in it (an
        // epoch's first batch too, which the wait share leaves out).
        let all_waited = counters.all_wait().saturating_sub(st.all_wait_at);
        let step = dt.saturating_sub(all_waited).as_secs_f64() / batches as f64;
        st.window_start = now;
        st.batches_at = counters.delivered();
        st.wait_at = counters.steady_wait();
        st.all_wait_at = counters.all_wait();
        let [w, f, p] = now_knobs();
        let window = Window {
            rate,
            wait_share,
            step,
            now: [w, f, p],
            most: {
                // Per knob, the most it can take (alone) within the budget.
                let fits = |k: usize, v: usize| match k {
                    0 => knobs.budget.fits(f, p, v, cache),
                    1 => knobs.budget.fits(v, p, w, cache),
                    _ => knobs.budget.fits(f, v, w, cache),
                };
                let limits = [knobs.max_workers, MAX_QUEUE, MAX_QUEUE];
                std::array::from_fn(|k| {
                    let mut v = [w, f, p][k];
                    while v < limits[k] && fits(k, v + 1) {
                        v += 1;
                    }
                    v
                })
            },
            upload_bound: counters.upload_bound(w),
            max_workers: knobs.max_workers,
            direct: direct(),
        };
        let Some(action) = st.policy.decide(&window) else {
            return;
        };
        match action.change() {
            (TuneKnob::Workers, v) => {
                knobs.gate.set_limit(v);
                counters.set_workers(v);
            }
            (TuneKnob::InFlight, v) => {
                knobs.in_flight.store(v, Relaxed);
                knobs.budget.in_flight_high.fetch_max(v, Relaxed);
                set_in_flight(v);
            }
            (_, v) => knobs.prefetch.store(v, Relaxed),
        }
        let [workers, in_flight, prefetch] = now_knobs();
        let step = TuneStep {
            at: now.duration_since(self.origin),
            workers,
            in_flight,
            prefetch,
            batches_per_sec: rate,
            wait_share,
            action,
        };
        st.history.push(step);
        drop(st);
        memory(counters);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Defers a job on another thread (the pass this thread may hold
    /// would let it through); whether it was deferred.
    fn defer_elsewhere(gate: &Arc<Gate>, ran: &Arc<AtomicUsize>) -> bool {
        let (g, r) = (gate.clone(), ran.clone());
        let job = move || {
            // Started again with a place free: it gets a pass now.
            assert!(g.enter_or_defer(|| panic!("deferred twice")).is_some());
            r.fetch_add(1, Relaxed);
        };
        std::thread::scope(|s| {
            s.spawn(|| gate.enter_or_defer(job).is_none())
                .join()
                .unwrap()
        })
    }

    #[test]
    fn a_full_gate_defers_the_job_and_a_returned_pass_starts_it() {
        let gate = Arc::new(Gate::new(1));
        let ran = Arc::new(AtomicUsize::new(0));
        let pass = gate.enter_or_defer(|| unreachable!()).unwrap();
        assert!(
            defer_elsewhere(&gate, &ran),
            "a full gate defers, never waits"
        );
        assert!(defer_elsewhere(&gate, &ran));
        assert_eq!((gate.deferred(), ran.load(Relaxed)), (2, 0));
        drop(pass);
        // The first job got the place and gave it back when it ended,
        // which started the second.
        assert_eq!((gate.deferred(), ran.load(Relaxed)), (0, 2));
        assert_eq!(gate.lock().active, 0);
        gate.set_limit(0);
        assert_eq!(gate.limit(), 1, "never below one");
    }

    #[test]
    fn a_started_job_that_needs_no_place_hands_it_on() {
        let gate = Arc::new(Gate::new(1));
        let ran = Arc::new(AtomicUsize::new(0));
        let pass = gate.enter_or_defer(|| unreachable!()).unwrap();
        // A runner that finds its batch done when started again: it takes
        // no place, and must not leave the job behind it queued.
        let g = gate.clone();
        std::thread::scope(|s| {
            s.spawn(|| assert!(gate.enter_or_defer(move || g.kick()).is_none()));
        });
        assert!(defer_elsewhere(&gate, &ran));
        drop(pass);
        assert_eq!((gate.deferred(), ran.load(Relaxed)), (0, 1));
    }

    #[test]
    fn a_raised_limit_starts_the_deferred_jobs() {
        let gate = Arc::new(Gate::new(1));
        let ran = Arc::new(AtomicUsize::new(0));
        let pass = gate.enter_or_defer(|| unreachable!()).unwrap();
        for _ in 0..3 {
            assert!(defer_elsewhere(&gate, &ran));
        }
        // From a thread without a pass, as the tuner's.
        std::thread::scope(|s| s.spawn(|| gate.set_limit(3)).join().unwrap());
        assert_eq!(
            (gate.deferred(), ran.load(Relaxed)),
            (0, 3),
            "places came free"
        );
        drop(pass);
    }

    #[test]
    fn a_nested_entry_on_the_same_thread_does_not_wait() {
        let gate = Gate::new(1);
        let outer = gate.enter_or_defer(|| unreachable!()).unwrap();
        // rayon running another sample inside this one, on this thread.
        let inner = gate.enter_or_defer(|| unreachable!()).unwrap();
        drop(inner);
        assert_eq!(gate.lock().active, 1, "the nested entry took no place");
        drop(outer);
        assert_eq!(gate.lock().active, 0);
    }
}
