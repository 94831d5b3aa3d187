//! AUTOTUNE: the loader sizes its own parallelism, batches in flight and
//! prefetch depth from what it measures, within a RAM budget.
//!
//! Like tf.data's autotuner it is a hill climb, but driven by the number
//! that matters, the consumer's wait: while the training loop waits (more
//! than 5% of a window), grow one knob (decode workers first, unless the
//! measured per-stage times say the upload thread is the slower stage; then
//! batches in flight, then prefetch) and keep the change only if throughput rose;
//! while it never waits, try giving a worker back and keep that only if
//! throughput held, never going below a worker count that was once grown
//! past because the consumer waited. Windows are at least 8 batches and
//! 0.2 s, and run across epochs. Explicit settings are left alone.

mod budget;

use crate::stats::{Counters, INPUT_BOUND_SHARE};
pub(crate) use budget::{default_budget, Budget};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Pass to [`crate::LoaderBuilder::workers`], `prefetch` or
/// `batches_in_flight` to let the loader tune it (the default).
pub const AUTOTUNE: usize = 0;

/// Most batches in flight or prefetched AUTOTUNE goes to.
pub(crate) const MAX_QUEUE: usize = 8;

/// A counting gate: at most `limit` holders at once (the active workers).
#[derive(Debug)]
pub(crate) struct Gate {
    state: Mutex<(usize, usize)>,
    cv: Condvar,
}

/// Holds a place in a [`Gate`] until dropped (`None`: a nested entry on a
/// thread that already holds one, which takes no place).
#[derive(Debug)]
pub(crate) struct GatePass<'a>(Option<&'a Gate>);

std::thread_local! {
    /// Whether this thread holds a pass of some gate. A `Source` that uses
    /// rayon inside `read` lets this pool thread run another sample while it
    /// waits (work stealing); that sample must not wait for the pass its own
    /// thread holds, or the pool deadlocks.
    static HOLDS_PASS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.0 {
            HOLDS_PASS.with(|h| h.set(false));
            gate.lock().1 -= 1;
            gate.cv.notify_one();
        }
    }
}

impl Gate {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            state: Mutex::new((limit.max(1), 0)),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, usize)> {
        crate::lock(&self.state)
    }

    /// Waits for a place, unless this thread already holds one: a nested
    /// entry (rayon running another sample inside a sample on this thread)
    /// goes through at once, since it adds no parallelism.
    pub(crate) fn enter(&self) -> GatePass<'_> {
        if HOLDS_PASS.with(|h| h.get()) {
            return GatePass(None);
        }
        let mut st = self.lock();
        while st.1 >= st.0 {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.1 += 1;
        HOLDS_PASS.with(|h| h.set(true));
        GatePass(Some(self))
    }

    pub(crate) fn limit(&self) -> usize {
        self.lock().0
    }

    pub(crate) fn set_limit(&self, n: usize) {
        self.lock().0 = n.max(1);
        self.cv.notify_all();
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
    /// What was done: `grow workers`, `revert`, `shrink workers`, ...
    pub action: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Knob {
    Workers,
    InFlight,
    Prefetch,
}

#[derive(Debug)]
struct Trial {
    knob: Knob,
    old: usize,
    rate_before: f64,
    shrink: bool,
}

#[derive(Debug)]
struct State {
    window_start: Instant,
    batches_at: u64,
    wait_at: Duration,
    trial: Option<Trial>,
    /// Per knob: a value that did not help; growth stops below it.
    ceiling: [usize; 3],
    /// Workers below which shrinking hurt.
    floor: usize,
    history: Vec<TuneStep>,
}

/// The hill climber, run by the consumer after each batch.
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
                trial: None,
                ceiling: [usize::MAX; 3],
                floor: 1,
                history: Vec::new(),
            }),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.auto.workers || self.auto.in_flight || self.auto.prefetch
    }

    pub(crate) fn history(&self) -> Vec<TuneStep> {
        crate::lock(&self.state).history.clone()
    }

    /// Called after each delivered batch; may turn a knob. `set_in_flight`
    /// applies a new batches-in-flight value to the pool.
    pub(crate) fn on_batch(
        &self,
        knobs: &Knobs,
        counters: &Counters,
        cache: u64,
        set_in_flight: &dyn Fn(usize),
    ) {
        let memory = |c: &Counters| {
            let (w, f, p) = (
                knobs.gate.limit(),
                knobs.in_flight.load(Relaxed),
                knobs.prefetch.load(Relaxed),
            );
            c.set_memory(knobs.budget.memory(f, p, w, cache));
        };
        memory(counters);
        if !self.enabled() {
            return;
        }
        let mut st = crate::lock(&self.state);
        let now = Instant::now();
        let dt = now.duration_since(st.window_start);
        let batches = counters.delivered().saturating_sub(st.batches_at);
        if batches < 8 || dt < Duration::from_millis(200) {
            return;
        }
        let rate = batches as f64 / dt.as_secs_f64();
        let waited = counters.steady_wait().saturating_sub(st.wait_at);
        let wait_share = waited.as_secs_f64() / dt.as_secs_f64();
        st.window_start = now;
        st.batches_at = counters.delivered();
        st.wait_at = counters.steady_wait();

        let get = |k: Knob| match k {
            Knob::Workers => knobs.gate.limit(),
            Knob::InFlight => knobs.in_flight.load(Relaxed),
            Knob::Prefetch => knobs.prefetch.load(Relaxed),
        };
        let set = |k: Knob, v: usize| match k {
            Knob::Workers => {
                knobs.gate.set_limit(v);
                counters.set_workers(v);
            }
            Knob::InFlight => {
                knobs.in_flight.store(v, Relaxed);
                knobs.budget.in_flight_high.fetch_max(v, Relaxed);
                set_in_flight(v);
            }
            Knob::Prefetch => knobs.prefetch.store(v, Relaxed),
        };
        let mut action = None;
        if let Some(t) = st.trial.take() {
            let kept = if t.shrink {
                rate >= 0.97 * t.rate_before && wait_share <= INPUT_BOUND_SHARE
            } else {
                rate >= 1.03 * t.rate_before
            };
            if kept && !t.shrink && t.knob == Knob::Workers {
                // Fewer workers left the consumer waiting: never shrink below.
                st.floor = get(Knob::Workers);
            }
            if !kept {
                let now_v = get(t.knob);
                set(t.knob, t.old);
                if t.shrink {
                    st.floor = t.old;
                } else {
                    st.ceiling[t.knob as usize] = now_v;
                }
                action = Some(format!(
                    "revert {:?} {now_v} -> {} ({rate:.1} vs {:.1} batches/s)",
                    t.knob, t.old, t.rate_before
                ));
            }
        } else if wait_share > INPUT_BOUND_SHARE {
            let (w, f, p) = (get(Knob::Workers), get(Knob::InFlight), get(Knob::Prefetch));
            let try_knob = [
                (
                    Knob::Workers,
                    // More workers cannot outrun a slower upload thread.
                    self.auto.workers
                        && w < knobs.max_workers
                        && !counters.upload_bound(w)
                        && knobs.budget.fits(f, p, w + 1, cache),
                ),
                (
                    Knob::InFlight,
                    self.auto.in_flight && f < MAX_QUEUE && knobs.budget.fits(f + 1, p, w, cache),
                ),
                (
                    Knob::Prefetch,
                    self.auto.prefetch && p < MAX_QUEUE && knobs.budget.fits(f, p + 1, w, cache),
                ),
            ]
            .into_iter()
            .find(|&(k, ok)| ok && get(k) + 1 < st.ceiling[k as usize]);
            if let Some((k, _)) = try_knob {
                let old = get(k);
                set(k, old + 1);
                st.trial = Some(Trial {
                    knob: k,
                    old,
                    rate_before: rate,
                    shrink: false,
                });
                action = Some(format!("grow {k:?} {old} -> {}", old + 1));
            }
        } else if self.auto.workers && wait_share < 0.01 && get(Knob::Workers) > st.floor.max(1) {
            let old = get(Knob::Workers);
            set(Knob::Workers, old - 1);
            st.trial = Some(Trial {
                knob: Knob::Workers,
                old,
                rate_before: rate,
                shrink: true,
            });
            action = Some(format!("shrink Workers {old} -> {}", old - 1));
        }
        if let Some(action) = action {
            let step = TuneStep {
                at: now.duration_since(self.origin),
                workers: get(Knob::Workers),
                in_flight: get(Knob::InFlight),
                prefetch: get(Knob::Prefetch),
                batches_per_sec: rate,
                wait_share,
                action,
            };
            st.history.push(step);
        }
        memory(counters);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn gate_admits_at_most_its_limit() {
        let gate = Arc::new(Gate::new(2));
        let a = gate.enter();
        // A second pass, held by another thread until told to let go.
        let (g, (go_tx, go_rx)) = (gate.clone(), std::sync::mpsc::channel::<()>());
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn(move || {
            let _p = g.enter();
            held_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        });
        held_rx.recv().unwrap();
        let g = gate.clone();
        let third = std::thread::spawn(move || {
            let _p = g.enter();
        });
        std::thread::sleep(Duration::from_millis(30));
        assert!(!third.is_finished());
        drop(a);
        third.join().unwrap();
        go_tx.send(()).unwrap();
        second.join().unwrap();
        gate.set_limit(0);
        assert_eq!(gate.limit(), 1, "never below one");
    }

    #[test]
    fn a_nested_entry_on_the_same_thread_does_not_wait() {
        let gate = Gate::new(1);
        let outer = gate.enter();
        // rayon running another sample inside this one, on this thread.
        let inner = gate.enter();
        drop(inner);
        assert_eq!(gate.lock().1, 1, "the nested entry took no place");
        drop(outer);
        assert_eq!(gate.lock().1, 0);
    }
}
