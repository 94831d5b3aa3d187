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
        step: (1.0 - wait) / rate,
        now,
        most: [4, MAX_QUEUE, MAX_QUEUE],
        upload_bound: false,
        max_workers: 4,
        direct: false,
    }
}

/// The step that grows `knob` from `from` to `to`.
fn grow(knob: TuneKnob, from: usize, to: usize) -> TuneAction {
    Grow { knob, from, to }
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
    // In proportion to the wait: waiting half the time needs twice the
    // workers, a fifth 1.25x, a tenth 1.11x (rounded up, one at least).
    // Each window judges the step before it (kept: the rate rose 3%)
    // and takes the next one.
    assert_eq!(
        steps,
        [
            grow(Workers, 1, 2),
            grow(Workers, 2, 3),
            grow(Workers, 3, 4)
        ]
    );
    assert_eq!(now, [4, 2, 1]);
    assert_eq!(p.floor, 3, "3 workers left the consumer waiting");
}

#[test]
fn a_growth_that_does_not_help_is_undone_and_retried_only_much_later() {
    let mut p = Policy::new(ALL);
    let mut now = [1, 2, 1];
    // Workers 1 -> 2 helps, 2 -> 4 does not (20.2 against 20.0): back
    // to 2; then 3, half the gap to the count that did not help, does
    // not help either; the next waiting window grows batches in flight.
    let w = [
        (10.0, 0.5),
        (20.0, 0.5),
        (20.2, 0.5),
        (20.0, 0.5),
        (20.1, 0.5),
        (20.0, 0.5),
    ];
    let steps = run(&mut p, &mut now, &w);
    let revert = |from, to, rate, before| Revert {
        knob: Workers,
        from,
        to,
        rate,
        before,
    };
    assert_eq!(
        steps,
        [
            grow(Workers, 1, 2),
            grow(Workers, 2, 4),
            revert(4, 2, 20.2, 20.0),
            grow(Workers, 2, 3),
            revert(3, 2, 20.1, 20.0),
            grow(InFlight, 2, 4),
        ]
    );
    assert_eq!(p.ceiling[Workers as usize], 3);
    // Queues at their limit, the consumer still waiting: nothing to
    // try until the cap expires, then workers grow again.
    now = [2, MAX_QUEUE, MAX_QUEUE];
    let waiting = vec![(20.0, 0.5); CEILING_WINDOWS as usize - 2];
    assert!(run(&mut p, &mut now, &waiting).is_empty());
    assert_eq!(run(&mut p, &mut now, &[(20.0, 0.5)]), [grow(Workers, 2, 4)]);
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
    assert_eq!(p.decide(&w), Some(grow(InFlight, 2, 4)));
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
    assert_eq!(p.decide(&w), Some(grow(InFlight, 2, 4)));
    let w = Window {
        direct: true,
        ..window(10.0, 0.5, [2, 4, 1])
    };
    assert_eq!(
        p.decide(&w),
        Some(grow(Workers, 2, 4)),
        "twice the workers for a consumer waiting half the time, up to the buffers"
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
        Some(grow(InFlight, 2, 3)),
        "a doubling is cut to what fits"
    );
    let mut p = Policy::new(ALL);
    let only_prefetch = Window {
        most: [1, 2, MAX_QUEUE],
        ..window(10.0, 0.9, [1, 2, 1])
    };
    assert_eq!(p.decide(&only_prefetch), Some(grow(Prefetch, 1, 2)));
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
        Some(grow(InFlight, 2, 4))
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

/// A simulated machine: `cores` decode workers at most, each decoding
/// `per_worker` batches/s (ImageNet photos, batch 256: ~1,000
/// images/s a core), scaling sublinearly (memory bandwidth), one upload
/// thread of `upload` batches/s, buffers each cycling in 4 ms plus a
/// batch's fill, and a consumer whose step takes `step` seconds, or,
/// for a CPU-bound step (`cpu_step`), longer once the workers and the
/// step need more than the cores.
struct Machine {
    cores: usize,
    per_worker: f64,
    upload: f64,
    step: f64,
    cpu_step: bool,
}

impl Machine {
    fn step_at(&self, workers: usize) -> f64 {
        if self.cpu_step && workers + 1 > self.cores {
            self.step * (workers + 1) as f64 / self.cores as f64
        } else {
            self.step
        }
    }

    fn workers_rate(&self, w: usize) -> f64 {
        w as f64 * self.per_worker / (1.0 + w as f64 / 256.0)
    }

    /// What the loader can deliver at settings `now` (batches/s).
    fn loader(&self, now: [usize; 3]) -> f64 {
        let [w, f, p] = now;
        let fill = self.workers_rate(w);
        let buffers = f as f64 / (0.004 + 1.0 / fill) + p as f64 * 1e3;
        fill.min(self.upload).min(buffers)
    }

    /// Batches/s delivered and the step, at settings `now`.
    fn rate(&self, now: [usize; 3]) -> (f64, f64) {
        let step = self.step_at(now[0]);
        (self.loader(now).min(1.0 / step), step)
    }

    fn best_fixed(&self) -> f64 {
        (1..=self.cores)
            .map(|w| self.rate([w, MAX_QUEUE, MAX_QUEUE]).0)
            .fold(0.0, f64::max)
    }
}

/// Runs AUTOTUNE (from its start: 1 worker, 2 in flight, 1 prefetched)
/// on `m` for `secs` simulated seconds (noise from `seed`), windows closing as the tuner's
/// do, the loader's rate in each off by up to 5% and the consumer's
/// step by up to 1% (noise; the delivered rate is the slower of the
/// two); returns the true rate at each window's end and when it ended,
/// and the final settings.
fn simulate(m: &Machine, secs: f64, seed: u32) -> (Vec<(f64, f64, usize)>, [usize; 3]) {
    let mut p = Policy::new(ALL);
    let mut now = [1, 2, 1];
    let (mut t, mut seed) = (0.0, seed.max(1));
    let mut trace = Vec::new();
    while t < secs {
        let (rate, step) = m.rate(now);
        let mut n = 1;
        while !super::super::window_closes(n, Duration::from_secs_f64(n as f64 / rate)) {
            n += 1;
        }
        t += n as f64 / rate;
        let mut noise = |by: f64| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            1.0 + by * (f64::from(seed) / f64::from(u32::MAX) * 2.0 - 1.0)
        };
        let step = step * noise(0.01);
        let noisy = (m.loader(now) * noise(0.05)).min(1.0 / step);
        let w = Window {
            rate: noisy,
            wait_share: (1.0 - step * noisy).max(0.0),
            step,
            now,
            most: [m.cores, MAX_QUEUE, MAX_QUEUE],
            upload_bound: m.workers_rate(now[0]) > m.upload,
            max_workers: m.cores,
            direct: false,
        };
        if let Some(a) = p.decide(&w) {
            let (k, v) = a.change();
            now[k as usize] = v;
        }
        trace.push((t, m.rate(now).0, now[0]));
    }
    (trace, now)
}

use std::time::Duration;

/// The noise seeds each simulation runs with.
const SEEDS: [u32; 8] = [
    1,
    0x2545_f491,
    0x1234_5678,
    0x9e37_79b9,
    0xdead_beef,
    0x0bad_f00d,
    7,
    99,
];

#[test]
fn autotune_reaches_nine_tenths_of_the_best_fixed_setting_within_two_seconds() {
    for cores in [16, 64, 192] {
        let full = Machine {
            cores,
            per_worker: 1000.0 / 256.0,
            // Past 64 cores the one upload thread is the limit.
            upload: 200.0,
            step: 0.0002,
            cpu_step: false,
        };
        // A GPU step that needs about a third of the cores' rate.
        let model = Machine {
            step: 3.0 / full.best_fixed(),
            ..full
        };
        for (what, m) in [("no model", &full), ("a model", &model)] {
            let best = m.best_fixed();
            let mut slowest = 0.0f64;
            for seed in SEEDS {
                let (trace, now) = simulate(m, 30.0, seed);
                let reached = trace
                    .iter()
                    .find(|w| w.1 >= 0.9 * best)
                    .map_or(f64::INFINITY, |w| w.0);
                slowest = slowest.max(reached);
                let at_2s = trace.iter().take_while(|w| w.0 <= 2.0).last().unwrap().1;
                assert!(
                at_2s >= 0.9 * best,
                "{cores} cores, {what}: {at_2s:.1} batches/s after 2 s, best fixed {best:.1}; {trace:?}"
            );
                let late = trace.iter().filter(|w| w.0 > 2.0);
                assert!(
                    late.clone().all(|w| w.1 >= 0.9 * best),
                    "{cores} cores, {what}: fell below 90% of {best:.1} later, at {now:?}: {:?}",
                    late.collect::<Vec<_>>()
                );
            }
            eprintln!("{cores} cores, {what}: 90% of the best fixed setting after {slowest:.2} s (slowest of {} seeds)", SEEDS.len());
        }
    }
}

#[test]
fn workers_that_lengthen_a_cpu_bound_step_are_not_kept() {
    // 16 cores, a training step on one core that needs about as many
    // batches as 16 workers make: a worker past the 15 free cores slows
    // the step by more than it shortens the wait, and is given back.
    let m = Machine {
        cores: 16,
        per_worker: 1000.0 / 256.0,
        upload: 1e9,
        step: 1.0 / 58.0,
        cpu_step: true,
    };
    let best = m.best_fixed();
    for seed in SEEDS {
        let (trace, _) = simulate(&m, 30.0, seed);
        // After the ramp, but for the windows that try a worker more or
        // fewer again (one in 50, each undone): the rate within 10% of
        // the best fixed setting's, and the step within 1.05x its time
        // alone.
        let (mut slow, mut below) = (0.0, 0.0);
        for pair in trace.windows(2).filter(|p| p[0].0 > 2.0) {
            let (t0, rate, workers) = pair[0];
            if rate < 0.9 * best {
                below += pair[1].0 - t0;
            }
            if m.step_at(workers) > 1.05 * m.step {
                slow += pair[1].0 - t0;
            }
        }
        let after = trace.last().unwrap().0 - 2.0;
        assert!(
            slow <= 0.05 * after && below <= 0.05 * after,
            "seed {seed}: the step was lengthened for {slow:.2} s and the rate under 90% of {best:.1} \
         for {below:.2} s of {after:.1}: {trace:?}"
        );
    }
}
