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
        }
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
        for (c, left) in self.ceiling.iter_mut().zip(&mut self.ceiling_left) {
            if *left > 0 {
                *left -= 1;
                if *left == 0 {
                    *c = usize::MAX;
                }
            }
        }
        if let Some(t) = self.trial.take() {
            // Only worker steps are trials (queue steps are kept).
            let kept = if t.shrink {
                w.rate >= 0.97 * t.rate_before && w.wait_share <= INPUT_BOUND_SHARE
            } else {
                w.rate >= 1.03 * t.rate_before
            };
            let now = w.now[t.knob as usize];
            if kept {
                if !t.shrink && t.knob == TuneKnob::Workers {
                    // Fewer workers left the consumer waiting.
                    self.floor = now;
                }
                return None;
            }
            if t.shrink {
                self.floor = t.old;
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
        if w.wait_share > INPUT_BOUND_SHARE {
            // The value a growth of `k` tries: a worker more (each costs a
            // core), or twice the buffers (they cost only memory, so the
            // climb takes three steps to the queue limit, not seven), within
            // the budget and below a value that did not help.
            let next = |k: TuneKnob| {
                let v = w.now[k as usize];
                let to = match k {
                    // More workers cannot outrun a slower upload thread,
                    // nor, on the direct hand-over, use more buffers than
                    // there are (batches in flight grow first then).
                    TuneKnob::Workers if w.upload_bound => v,
                    TuneKnob::Workers if w.direct && v >= w.now[TuneKnob::InFlight as usize] => v,
                    TuneKnob::Workers => (v + 1).min(w.max_workers),
                    _ => (2 * v).min(MAX_QUEUE),
                };
                let below = self.ceiling[k as usize].saturating_sub(1);
                to.min(w.most[k as usize]).min(below)
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
        if self.auto.workers && w.wait_share < 0.01 && workers > self.floor.max(1) {
            self.trial = Some(Trial {
                knob: TuneKnob::Workers,
                old: workers,
                rate_before: w.rate,
                shrink: true,
            });
            return Some(TuneAction::Shrink {
                knob: TuneKnob::Workers,
                from: workers,
                to: workers - 1,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TuneAction::*;
    use TuneKnob::*;

    const ALL: Auto = Auto {
        workers: true,
        in_flight: true,
        prefetch: true,
    };

    /// A window at `rate` batches/s where the consumer waited `wait`, with
    /// settings `now`, everything fitting, 4 cores.
    fn window(rate: f64, wait: f64, now: [usize; 3]) -> Window {
        Window {
            rate,
            wait_share: wait,
            now,
            most: [4, MAX_QUEUE, MAX_QUEUE],
            upload_bound: false,
            max_workers: 4,
            direct: false,
        }
    }

    /// Runs `p` over windows, applying each step to the settings as the
    /// tuner does; returns the steps.
    fn run(p: &mut Policy, now: &mut [usize; 3], windows: &[(f64, f64)]) -> Vec<TuneAction> {
        let mut steps = Vec::new();
        for &(rate, wait) in windows {
            if let Some(a) = p.decide(&window(rate, wait, *now)) {
                let (k, v) = a.change();
                now[k as usize] = v;
                steps.push(a);
            }
        }
        steps
    }

    #[test]
    fn a_waiting_consumer_grows_workers_first_and_keeps_what_helps() {
        let mut p = Policy::new(ALL);
        let mut now = [1, 2, 1];
        let steps = run(&mut p, &mut now, &[(10.0, 0.5), (19.0, 0.2), (27.0, 0.1)]);
        assert_eq!(
            steps,
            [
                Grow {
                    knob: Workers,
                    from: 1,
                    to: 2
                },
                Grow {
                    knob: Workers,
                    from: 2,
                    to: 3
                },
            ]
        );
        assert_eq!(now, [3, 2, 1]);
        // The second window kept the first growth (19 >= 1.03 x 10), taking
        // no step of its own; the third grew again.
        assert_eq!(p.floor, 2);
    }

    #[test]
    fn a_growth_that_does_not_help_is_undone_and_retried_only_much_later() {
        let mut p = Policy::new(ALL);
        let mut now = [1, 2, 1];
        // Workers 1 -> 2 helps, 2 -> 3 does not (20.0 against 20.2): back
        // to 2, and the next waiting window grows batches in flight instead.
        let w = [
            (10.0, 0.5),
            (20.0, 0.5),
            (20.2, 0.5),
            (20.0, 0.5),
            (20.0, 0.5),
        ];
        let steps = run(&mut p, &mut now, &w);
        assert_eq!(
            steps[1],
            Grow {
                knob: Workers,
                from: 2,
                to: 3
            }
        );
        assert_eq!(
            steps[2],
            Revert {
                knob: Workers,
                from: 3,
                to: 2,
                rate: 20.0,
                before: 20.2
            }
        );
        assert_eq!(
            steps[3],
            Grow {
                knob: InFlight,
                from: 2,
                to: 4
            }
        );
        assert_eq!(p.ceiling[Workers as usize], 3);
        // Queues at their limit, the consumer still waiting: nothing to
        // try until the ceiling expires, then workers 2 -> 3 again.
        now = [2, MAX_QUEUE, MAX_QUEUE];
        let waiting = vec![(20.0, 0.5); CEILING_WINDOWS as usize - 2];
        assert!(run(&mut p, &mut now, &waiting).is_empty());
        assert_eq!(
            run(&mut p, &mut now, &[(20.0, 0.5)]),
            [Grow {
                knob: Workers,
                from: 2,
                to: 3
            }]
        );
    }

    #[test]
    fn a_queue_step_doubles_and_is_kept_whatever_the_next_window_says() {
        // Workers at their limit (4 cores): the queues grow, doubling, while
        // the consumer waits; a window after a step that is 10% slower
        // (noise, for a cheap map) undoes nothing.
        let mut p = Policy::new(ALL);
        let mut now = [4, 2, 1];
        let w = [
            (20.0, 0.5),
            (18.0, 0.5),
            (20.1, 0.5),
            (17.0, 0.5),
            (20.0, 0.5),
            (19.0, 0.5),
            (19.0, 0.5),
        ];
        let steps = run(&mut p, &mut now, &w);
        let grow = |knob, from, to| Grow { knob, from, to };
        assert_eq!(
            steps,
            [
                grow(InFlight, 2, 4),
                grow(InFlight, 4, 8),
                grow(Prefetch, 1, 2),
                grow(Prefetch, 2, 4),
                grow(Prefetch, 4, 8),
            ]
        );
        assert_eq!(now, [4, MAX_QUEUE, MAX_QUEUE]);
        assert_eq!(p.ceiling, [usize::MAX; 3], "no step was undone");
    }

    #[test]
    fn an_upload_bound_loader_grows_the_queue_not_the_workers() {
        let mut p = Policy::new(ALL);
        let w = Window {
            upload_bound: true,
            ..window(10.0, 0.5, [2, 2, 1])
        };
        assert_eq!(
            p.decide(&w),
            Some(Grow {
                knob: InFlight,
                from: 2,
                to: 4
            })
        );
    }

    /// Review direct-turn3 N1: on the direct hand-over a worker past the
    /// batches in flight has no buffer to fill, so the buffers grow first.
    #[test]
    fn a_direct_epoch_grows_the_buffers_before_a_worker_past_them() {
        let mut p = Policy::new(ALL);
        let w = Window {
            direct: true,
            ..window(10.0, 0.5, [2, 2, 1])
        };
        assert_eq!(
            p.decide(&w),
            Some(Grow {
                knob: InFlight,
                from: 2,
                to: 4
            })
        );
        let w = Window {
            direct: true,
            ..window(10.0, 0.5, [2, 4, 1])
        };
        assert_eq!(
            p.decide(&w),
            Some(Grow {
                knob: Workers,
                from: 2,
                to: 3
            })
        );
    }

    #[test]
    fn nothing_grows_past_the_budget_the_cores_or_the_queue_limit() {
        let mut p = Policy::new(ALL);
        let full = Window {
            most: [1, 2, 1],
            ..window(10.0, 0.9, [1, 2, 1])
        };
        assert_eq!(p.decide(&full), None, "no step fits the RAM budget");
        let three_in_flight = Window {
            most: [1, 3, 1],
            ..window(10.0, 0.9, [1, 2, 1])
        };
        assert_eq!(
            p.decide(&three_in_flight),
            Some(Grow {
                knob: InFlight,
                from: 2,
                to: 3
            }),
            "a doubling is cut to what fits"
        );
        let mut p = Policy::new(ALL);
        let only_prefetch = Window {
            most: [1, 2, MAX_QUEUE],
            ..window(10.0, 0.9, [1, 2, 1])
        };
        assert_eq!(
            p.decide(&only_prefetch),
            Some(Grow {
                knob: Prefetch,
                from: 1,
                to: 2
            })
        );
        let mut p = Policy::new(ALL);
        let maxed = window(10.0, 0.9, [4, MAX_QUEUE, MAX_QUEUE]);
        assert_eq!(p.decide(&maxed), None, "4 cores, queues at their limit");
    }

    #[test]
    fn explicit_settings_are_never_touched() {
        let fixed_workers = Auto {
            workers: false,
            ..ALL
        };
        let mut p = Policy::new(fixed_workers);
        assert_eq!(
            p.decide(&window(10.0, 0.5, [2, 2, 1])),
            Some(Grow {
                knob: InFlight,
                from: 2,
                to: 4
            })
        );
        let mut p = Policy::new(Auto {
            workers: false,
            in_flight: false,
            prefetch: false,
        });
        let mut now = [3, 2, 1];
        assert!(run(&mut p, &mut now, &[(10.0, 0.9), (10.0, 0.0), (5.0, 0.0)]).is_empty());
    }

    #[test]
    fn an_idle_consumer_gives_workers_back_down_to_what_it_needed() {
        let mut p = Policy::new(ALL);
        let mut now = [1, 2, 1];
        let steps = run(
            &mut p,
            &mut now,
            &[
                (10.0, 0.5), // grow workers to 2
                (20.0, 0.0), // kept: the floor is 2
                (20.0, 0.0), // no wait, but 2 is the floor: nothing
            ],
        );
        assert_eq!(
            steps,
            [Grow {
                knob: Workers,
                from: 1,
                to: 2
            }]
        );
        // Explicit start at 3 workers (floor 1): shrinks while the
        // consumer does not wait, and a shrink that hurts is undone.
        let mut p = Policy::new(ALL);
        let mut now = [3, 2, 1];
        let steps = run(
            &mut p,
            &mut now,
            &[(20.0, 0.0), (20.0, 0.0), (20.0, 0.0), (12.0, 0.3)],
        );
        assert_eq!(
            steps,
            [
                Shrink {
                    knob: Workers,
                    from: 3,
                    to: 2
                },
                Shrink {
                    knob: Workers,
                    from: 2,
                    to: 1
                },
                Revert {
                    knob: Workers,
                    from: 1,
                    to: 2,
                    rate: 12.0,
                    before: 20.0
                },
            ]
        );
        assert_eq!(p.floor, 2, "never below the count whose removal hurt");
    }

    #[test]
    fn a_short_window_of_no_wait_is_not_taken_for_a_slack_one() {
        // Waiting between 1% and 5%: neither grow nor shrink.
        let mut p = Policy::new(ALL);
        assert_eq!(p.decide(&window(10.0, 0.03, [3, 2, 1])), None);
    }

    #[test]
    fn steps_print_as_the_history_shows_them() {
        let g = Grow {
            knob: Workers,
            from: 1,
            to: 2,
        };
        assert_eq!(g.to_string(), "grow Workers 1 -> 2");
        let r = Revert {
            knob: Prefetch,
            from: 3,
            to: 2,
            rate: 9.04,
            before: 9.5,
        };
        assert_eq!(
            r.to_string(),
            "revert Prefetch 3 -> 2 (9.0 vs 9.5 batches/s)"
        );
    }
}
