//! AUTOTUNE's decision: a pure function of one window's measurements and
//! of what earlier windows taught it, so it is tested without a clock.

use super::{Auto, MAX_QUEUE};
use crate::stats::INPUT_BOUND_SHARE;

/// A setting AUTOTUNE turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TuneKnob {
    /// Decode workers.
    Workers = 0,
    /// Host batch buffers in flight.
    InFlight = 1,
    /// Batches prefetched onto the device.
    Prefetch = 2,
}

const KNOBS: [TuneKnob; 3] = [TuneKnob::Workers, TuneKnob::InFlight, TuneKnob::Prefetch];

/// Windows (at least 0.2 s each) a growth that did not help is not tried
/// again: about ten seconds or more.
const CEILING_WINDOWS: u32 = 50;

/// What AUTOTUNE did at one step.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum TuneAction {
    /// One more of `knob`: the training loop waited for data.
    Grow {
        /// The setting.
        knob: TuneKnob,
        /// Its value before.
        from: usize,
        /// Its value now.
        to: usize,
    },
    /// One worker fewer: the training loop never waited.
    Shrink {
        /// The setting (always [`TuneKnob::Workers`]).
        knob: TuneKnob,
        /// Its value before.
        from: usize,
        /// Its value now.
        to: usize,
    },
    /// The last step undone: throughput did not rise (a growth) or fell,
    /// or the loop waited again (a shrink).
    Revert {
        /// The setting.
        knob: TuneKnob,
        /// Its value before.
        from: usize,
        /// Its value now.
        to: usize,
        /// Batches per second with the step.
        rate: f64,
        /// Batches per second before it.
        before: f64,
    },
}

impl TuneAction {
    /// The setting changed and its new value.
    pub fn change(&self) -> (TuneKnob, usize) {
        match *self {
            TuneAction::Grow { knob, to, .. }
            | TuneAction::Shrink { knob, to, .. }
            | TuneAction::Revert { knob, to, .. } => (knob, to),
        }
    }
}

impl std::fmt::Display for TuneAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TuneAction::Grow { knob, from, to } => write!(f, "grow {knob:?} {from} -> {to}"),
            TuneAction::Shrink { knob, from, to } => write!(f, "shrink {knob:?} {from} -> {to}"),
            TuneAction::Revert {
                knob,
                from,
                to,
                rate,
                before,
            } => write!(
                f,
                "revert {knob:?} {from} -> {to} ({rate:.1} vs {before:.1} batches/s)"
            ),
        }
    }
}

/// One window's measurements, and the loader's settings during it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Window {
    /// Batches delivered per second.
    pub(crate) rate: f64,
    /// Share of the window the consumer waited for a batch.
    pub(crate) wait_share: f64,
    /// The consumer's own time per batch (seconds): its training step,
    /// from one batch to its next request, waits excluded.
    pub(crate) step: f64,
    /// Workers, batches in flight and prefetch depth, by [`TuneKnob`].
    pub(crate) now: [usize; 3],
    /// The most of each (alone, the others as they are) that fits the RAM
    /// budget.
    pub(crate) most: [usize; 3],
    /// The upload thread, not the workers, is the slower stage.
    pub(crate) upload_bound: bool,
    /// The most workers there can be.
    pub(crate) max_workers: usize,
    /// Whether the epoch runs on the direct hand-over, where a worker
    /// fills a whole batch on a buffer of its own: a worker more than the
    /// batches in flight has nothing to run.
    pub(crate) direct: bool,
}

/// A step being tried: kept or undone after the next window.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Trial {
    knob: TuneKnob,
    old: usize,
    rate_before: f64,
    /// The consumer's step before it.
    step_before: f64,
    shrink: bool,
}

/// The hill climb's memory across windows.
#[derive(Debug)]
pub(crate) struct Policy {
    auto: Auto,
    trial: Option<Trial>,
    /// Per knob: a value that did not help; growth stops below it for
    /// [`CEILING_WINDOWS`] windows (`ceiling_left`), then may try again:
    /// one noisy window must not cap a run that lasts days.
    ceiling: [usize; 3],
    ceiling_left: [u32; 3],
    /// Workers below which the consumer waited (a grown worker count that
    /// helped, or a shrink that hurt): never shrink below it.
    floor: usize,
    /// Windows the floor still holds (then it comes down by one and the
    /// count below is tried again: one noisy window must not pin the
    /// workers for good).
    floor_left: u32,
    /// The consumer's step at the fewest workers measured: that count, and
    /// the sum and number of its windows' steps (the baseline of
    /// [`Policy::step_slowdown`]).
    fewest: Option<(usize, f64, u32)>,
    /// The latest window's workers and step.
    last: Option<(usize, f64)>,
}

impl Policy {
    /// Owns the knobs `auto` says.
    pub(crate) fn new(auto: Auto) -> Self {
        Self {
            auto,
            trial: None,
            ceiling: [usize::MAX; 3],
            ceiling_left: [0; 3],
            floor: 1,
            floor_left: 0,
            fewest: None,
            last: None,
        }
    }

    /// The consumer's step in the latest window against its mean over the
    /// windows at the fewest workers measured, with that count and mean
    /// (seconds): how much the loader's extra workers lengthen the step.
    /// `None` until windows at two worker counts were measured.
    pub(crate) fn step_slowdown(&self) -> Option<(f64, usize, f64)> {
        let (workers, sum, n) = self.fewest?;
        let (now_workers, step) = self.last?;
        let base = sum / f64::from(n);
        (now_workers > workers && base > 0.0).then(|| (step / base, workers, base))
    }

    fn measure_step(&mut self, w: &Window) {
        let workers = w.now[TuneKnob::Workers as usize];
        self.last = Some((workers, w.step));
        self.fewest = match self.fewest {
            Some((k, sum, n)) if k == workers => Some((k, sum + w.step, n + 1)),
            Some((k, ..)) if k < workers => self.fewest,
            _ => Some((workers, w.step, 1)),
        };
    }

    fn owns(&self, k: TuneKnob) -> bool {
        match k {
            TuneKnob::Workers => self.auto.workers,
            TuneKnob::InFlight => self.auto.in_flight,
            TuneKnob::Prefetch => self.auto.prefetch,
        }
    }

    /// The step to take after window `w`, if any. A trial from the window
    /// before is judged first: a worker more is kept when throughput rose
    /// by 3%, a shrink when throughput held within 3% and the consumer
    /// still did not wait; otherwise it is undone. Buffer steps (in flight,
    /// prefetch) are not trials: they cost memory within the budget, not
    /// CPU, and are kept. With no trial: while the consumer
    /// waited more than [`INPUT_BOUND_SHARE`], grow the first knob that can
    /// (workers, unless the upload thread is the slower stage; then batches
    /// in flight, then prefetch), within the budget and below a value that
    /// did not help; while it waited under 1%, try one worker fewer.
    pub(crate) fn decide(&mut self, w: &Window) -> Option<TuneAction> {
        self.measure_step(w);
        for (c, left) in self.ceiling.iter_mut().zip(&mut self.ceiling_left) {
            if *left > 0 {
                *left -= 1;
                if *left == 0 {
                    *c = usize::MAX;
                }
            }
        }
        if self.floor_left > 0 {
            self.floor_left -= 1;
            if self.floor_left == 0 {
                self.floor -= 1;
            }
        }
        if let Some(t) = self.trial.take() {
            // Only worker steps are trials (queue steps are kept). A
            // batch's cycle is the consumer's step plus its wait, and the
            // rate is one over it: a worker more is kept only when it
            // shortened the wait by more than it lengthened the step (its
            // core taken from the training loop), by 3% of the cycle.
            // A worker fewer is kept when the cycle held (within 3%) and
            // the consumer still barely waits, or when the consumer's step
            // got 3% shorter (the worker was slowing it) and the cycle held
            // within a window's noise (5%).
            let kept = if t.shrink {
                let shorter = w.step <= 0.97 * t.step_before;
                (w.rate >= 0.97 * t.rate_before && w.wait_share <= INPUT_BOUND_SHARE)
                    || (shorter && w.rate >= 0.95 * t.rate_before)
            } else if w.step > 1.03 * t.step_before {
                // The step got longer (a worker took its core): the
                // cycle must shorten by more than a window's noise for
                // that to be a win, not 3%.
                w.rate >= 1.10 * t.rate_before
            } else {
                w.rate >= 1.03 * t.rate_before
            };
            let now = w.now[t.knob as usize];
            if kept {
                if !t.shrink && t.knob == TuneKnob::Workers {
                    // Fewer workers left the consumer waiting.
                    self.floor = t.old + 1;
                    self.floor_left = CEILING_WINDOWS;
                }
                // Judged on this window, which also measured the kept
                // setting: the next step may be taken at once (a ramp of
                // one window per step, not two).
                if t.shrink || w.wait_share <= INPUT_BOUND_SHARE {
                    return None;
                }
            } else {
                if t.shrink {
                    // This count was too few: the next shrink stops above
                    // it (the refinement), for a while.
                    self.floor = now + 1;
                    self.floor_left = CEILING_WINDOWS;
                } else {
                    self.ceiling[t.knob as usize] = now;
                    self.ceiling_left[t.knob as usize] = CEILING_WINDOWS;
                }
                return Some(TuneAction::Revert {
                    knob: t.knob,
                    from: now,
                    to: t.old,
                    rate: w.rate,
                    before: t.rate_before,
                });
            }
        }
        if w.wait_share > INPUT_BOUND_SHARE {
            // The value a growth of `k` tries. Workers grow in proportion
            // to the wait: a consumer that waits a share `s` of its cycle
            // needs the loader `1 / (1 - s)` times as fast, so that many
            // times the workers if they scale (at most 4x a step, at least
            // one more), which reaches 192 cores from 1 in four steps.
            // Below a count that did not help, the step halves the gap to
            // it instead (the refinement). Buffers double (they cost only
            // memory, so the climb takes three steps to the queue limit).
            // All within the budget and below a value that did not help.
            let next = |k: TuneKnob| {
                let v = w.now[k as usize];
                let ceiling = self.ceiling[k as usize];
                let to = match k {
                    // More workers cannot outrun a slower upload thread,
                    // nor, on the direct hand-over, use more buffers than
                    // there are (batches in flight grow first then).
                    TuneKnob::Workers if w.upload_bound => v,
                    TuneKnob::Workers if w.direct && v >= w.now[TuneKnob::InFlight as usize] => v,
                    TuneKnob::Workers => {
                        let factor = (1.0 / (1.0 - w.wait_share).max(0.25)).min(4.0);
                        let mut to = ((v as f64 * factor).ceil() as usize).max(v + 1);
                        if w.direct {
                            to = to.min(w.now[TuneKnob::InFlight as usize]);
                        }
                        if ceiling != usize::MAX {
                            to = to.min(v + (ceiling.saturating_sub(v) / 2).max(1));
                        }
                        to.min(w.max_workers)
                    }
                    _ => (2 * v).min(MAX_QUEUE),
                };
                to.min(w.most[k as usize]).min(ceiling.saturating_sub(1))
            };
            let can = |k: TuneKnob| self.owns(k) && next(k) > w.now[k as usize];
            let knob = KNOBS.into_iter().find(|&k| can(k))?;
            let old = w.now[knob as usize];
            // A worker more costs a core: kept only if throughput rose. A
            // buffer more costs memory, within the budget, and no CPU: it
            // is kept while the consumer waits. Judging a queue step by
            // throughput undid it after any noisy window (a cheap map's
            // batches take tens of microseconds, and a window of them varies
            // by +-25%), and one batch prefetched instead of eight wakes the
            // upload thread for every batch (half the token loader's rate).
            if knob == TuneKnob::Workers {
                self.trial = Some(Trial {
                    knob,
                    old,
                    rate_before: w.rate,
                    step_before: w.step,
                    shrink: false,
                });
            }
            return Some(TuneAction::Grow {
                knob,
                from: old,
                to: next(knob),
            });
        }
        let workers = w.now[TuneKnob::Workers as usize];
        let floor = self.floor.max(1);
        if self.auto.workers && w.wait_share < 0.01 && workers > floor {
            self.trial = Some(Trial {
                knob: TuneKnob::Workers,
                old: workers,
                rate_before: w.rate,
                step_before: w.step,
                shrink: true,
            });
            // A quarter of the way to the floor (at least one): a
            // multiplicative climb overshoots by up to 4x, and giving the
            // surplus back one worker a window would take minutes on
            // hundreds of cores.
            return Some(TuneAction::Shrink {
                knob: TuneKnob::Workers,
                from: workers,
                to: workers - ((workers - floor) / 4).max(1),
            });
        }
        None
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
