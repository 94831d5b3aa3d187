//! Every delivery path under stress, with a watchdog: a user map that
//! uses rayon across threads (`rayon::join`) runs on the feeder's path (a
//! map slow enough that batches are dispatched one by one) and on the
//! direct hand-over (a cheap map: pumps take whole batches), under
//! AUTOTUNE (the worker gate below the pool's size) and fixed workers,
//! with injected errors and panics under both bad-sample policies, random
//! early drops, forgotten epochs and resumes from saved states. Every
//! epoch must yield what an undisturbed one-worker run yields, and no
//! step may hang.

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Sample};
use candle_wick::source::{MemorySource, Record};
use candle_wick::{BadSamples, Error, Loader, LoaderState, Setting, AUTOTUNE};
use std::time::{Duration, Instant};

const N: u32 = 48;
const EPOCHS: u64 = 4;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// A hash of `seed` over a tree of nested `rayon::join`s `depth` deep:
/// each level's halves may be stolen by another pool thread, whose wait
/// for its own halves then runs whatever the pool has queued.
fn tree(seed: u32, depth: u32) -> u32 {
    if depth == 0 {
        return (0..64u32).fold(seed, |h, k| h.rotate_left(5) ^ k);
    }
    let (a, b) = rayon::join(
        || tree(seed.wrapping_mul(3), depth - 1),
        || tree(seed.wrapping_add(7), depth - 1),
    );
    a ^ b.rotate_left(1)
}

/// `[label, draw]` per sample: the draw from the sample's random stream,
/// hashed over a tree of `rayon::join`s ([`tree`]). Sample `i % 13 == 5` is a bad sample, `i % 17 ==
/// 3` panics; `slow` makes each sample take 2 ms (the feeder's path).
fn map(slow: bool) -> impl candle_wick::map::Map {
    map_fn(
        vec![Field::new("v", FieldType::U32, &[2])],
        move |s: &mut Sample<'_>| {
            let label = s.record().label;
            match label {
                l if l % 13 == 5 => return Err(Error::sample(s.key(), "injected")),
                l if l % 17 == 3 => panic!("injected panic in {}", s.key()),
                _ => {}
            }
            use rand::Rng;
            let draw = s.rng().random::<u32>();
            let (a, b) = rayon::join(|| tree(draw, 4), || tree(!draw, 4));
            if slow {
                std::thread::sleep(Duration::from_millis(2));
            }
            s.take::<u32>(0)?.copy_from_slice(&[label, a ^ b]);
            Ok(())
        },
    )
}

fn build(slow: bool, policy: BadSamples, workers: Setting, state: Option<LoaderState>) -> Loader {
    let records = (0..N)
        .map(|i| Record::encoded(format!("r{i}"), vec![i as u8], i))
        .collect();
    let mut b = Loader::builder(MemorySource::new(records))
        .map(map(slow))
        .batch_size(4)
        .shuffle(5)
        .shard(0, 1)
        .bad_samples(policy)
        .workers(workers);
    if let Some(state) = state {
        b = b.resume(state);
    }
    b.build().unwrap()
}

/// A delivered batch, or its error's text (panic messages included).
type Got = Result<(usize, Vec<usize>, Vec<u32>, Vec<String>), String>;

fn got(b: candle_wick::Result<candle_wick::Batch>) -> Got {
    let b = b.map_err(|e| candle_wick::error_chain(&e))?;
    let v = b.get("v").unwrap().flatten_all().unwrap().to_vec1::<u32>();
    let skipped = b.skipped.iter().map(|s| s.key.clone()).collect();
    Ok((b.index, b.indices.clone(), v.unwrap(), skipped))
}

#[test]
fn every_path_survives_rayon_maps_drops_forgets_resumes_and_injected_faults() {
    tests::within(240, || {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            rng = mix(rng.wrapping_add(0x9e37_79b9_7f4a_7c15));
            rng % n
        };
        for (slow, policy) in [
            (false, BadSamples::Skip),
            (false, BadSamples::Fail),
            (true, BadSamples::Skip),
            (true, BadSamples::Fail),
        ] {
            let mut reference = build(slow, policy, Setting::Fixed(1), None);
            let want: Vec<Vec<Got>> = (0..EPOCHS)
                .map(|e| reference.epoch(e).map(got).collect())
                .collect();
            drop(reference);
            let runs = if slow { 3 } else { 6 };
            for run in 0..runs {
                let workers = if next(2) == 0 {
                    AUTOTUNE
                } else {
                    Setting::Fixed(2)
                };
                let mut loader = build(slow, policy, workers, None);
                for step in 0..8 {
                    let e = next(EPOCHS);
                    let expect = &want[e as usize];
                    let start = next(expect.len() as u64) as usize;
                    let ctx = format!(
                        "slow {slow} {policy:?} run {run} ({workers:?}) step {step}: epoch \
                         {e} from {start}"
                    );
                    let mut epoch = loader.epoch_from(e, start);
                    let take = match next(4) {
                        0 => next(3) as usize,
                        _ => usize::MAX,
                    };
                    let mut seen = Vec::new();
                    let mut state = None;
                    for b in epoch.by_ref().take(take) {
                        if let Ok(b) = &b {
                            state = Some(b.state());
                        }
                        seen.push(got(b));
                    }
                    let end = start.saturating_add(take).min(expect.len());
                    assert_eq!(seen, expect[start..end], "{ctx}");
                    match next(4) {
                        // Forgotten: the next epoch must still run.
                        0 => std::mem::forget(epoch),
                        _ => {
                            let t = Instant::now();
                            drop(epoch);
                            assert!(t.elapsed() < Duration::from_secs(5), "{ctx}: slow drop");
                        }
                    }
                    // Resume from the last batch's state in a new loader:
                    // the rest of that epoch as the reference has it.
                    if let (Some(state), 0) = (state, next(3)) {
                        let (se, sb) = (state.epoch, state.batch);
                        let mut resumed = build(slow, policy, workers, Some(state));
                        let rest: Vec<Got> = resumed.next_epoch().map(got).collect();
                        if se == e {
                            assert_eq!(rest, expect[sb..], "{ctx}: resumed at {sb}");
                        }
                        tests::within(20, move || drop(resumed));
                    }
                }
                tests::within(20, move || drop(loader));
            }
        }
    });
}
