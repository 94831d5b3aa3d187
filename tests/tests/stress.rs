//! A seeded random stress run: reads with random delays, bad samples, random
//! worker counts, queue depths, resume points and early drops. Every epoch
//! must yield its planned batches in order with the reference's bytes, an
//! early drop must leave nothing in flight, and every thread must end. A
//! watchdog turns a hang into a failure.

use candle_wick::source::Record;
use candle_wick::{BadSamples, Loader, Size, Source, Transforms};
use std::time::{Duration, Instant};

const N: usize = 53;

/// Pre-decoded 4x4 pixels (no decode cost); sample `i % 11 == 7` is bad (an
/// empty encoded file); each read sleeps 0-2 ms, drawn from `(i, salt)`.
struct Jittery {
    salt: u64,
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

impl Source for Jittery {
    fn len(&self) -> usize {
        N
    }
    fn read(&self, i: usize) -> candle_wick::Result<Record> {
        if self.salt != 0 {
            let us = mix(i as u64 ^ self.salt) % 2000;
            std::thread::sleep(Duration::from_micros(us));
        }
        if i % 11 == 7 {
            return Ok(Record::encoded(format!("s{i}"), Vec::new(), 0));
        }
        let bytes = (0..48)
            .map(|p| (mix((i * 48 + p) as u64) & 0xff) as u8)
            .collect();
        Ok(Record::decoded(
            format!("s{i}"),
            bytes,
            Size::square(4),
            (i % 5) as u32,
        ))
    }
}

type Seen = (usize, Vec<usize>, Vec<u8>, Vec<String>);

fn build(salt: u64, workers: usize, prefetch: usize, in_flight: usize) -> Loader {
    Loader::builder(Jittery { salt })
        .batch_size(5)
        .image_size(4)
        .transforms(Transforms::train())
        .output(candle_wick::Output::U8Nhwc)
        .shuffle(11)
        .shard(0, 1)
        .bad_samples(BadSamples::Skip)
        .workers(workers)
        .prefetch(prefetch)
        .batches_in_flight(in_flight)
        .build()
        .unwrap()
}

fn seen(b: candle_wick::Batch) -> Seen {
    let bytes = tests::pixels(&b);
    let skipped = b.skipped.into_iter().map(|s| s.key).collect();
    (b.index, b.indices, bytes, skipped)
}

#[test]
fn random_delays_cancels_and_resumes_keep_every_promise() {
    tests::within(120, || {
        // The reference: one worker, no delays, whole epochs.
        let mut reference = build(0, 1, 1, 1);
        let epochs = 6u64;
        let want: Vec<Vec<Seen>> = (0..epochs)
            .map(|e| reference.epoch(e).map(|b| seen(b.unwrap())).collect())
            .collect();
        drop(reference);
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            rng = mix(rng.wrapping_add(0x632b_e59b_d9b4_e019));
            rng % n
        };
        for run in 0..24 {
            let (w, p, f) = (1 + next(3), 1 + next(3), 1 + next(4));
            let mut loader = build(run + 1, w as usize, p as usize, f as usize);
            for _ in 0..10 {
                let e = next(epochs);
                let total = want[e as usize].len();
                let start = next(total as u64 + 1) as usize;
                // Early drop after `take` batches, or the whole rest.
                let take = if next(3) == 0 {
                    next(4) as usize
                } else {
                    usize::MAX
                };
                let mut epoch = loader.epoch_from(e, start);
                let mut got = Vec::new();
                for b in epoch.by_ref().take(take) {
                    got.push(seen(b.unwrap()));
                }
                let t = Instant::now();
                drop(epoch);
                let took = t.elapsed();
                let ctx = format!("run {run} (w{w} p{p} f{f}) epoch {e} from {start} take {take}");
                assert!(took < Duration::from_secs(2), "{ctx}: drop took {took:?}");
                let expect = &want[e as usize][start..(start + take.min(total - start))];
                assert_eq!(got.len(), expect.len(), "{ctx}");
                for (g, x) in got.iter().zip(expect) {
                    assert_eq!(g, x, "{ctx}: batch {} differs from the reference", x.0);
                }
                let planned = loader.batches(e);
                for g in &got {
                    let mut all: Vec<usize> = g.1.clone();
                    all.extend(g.3.iter().map(|k| k[1..].parse::<usize>().unwrap()));
                    all.sort();
                    let mut plan = planned[g.0].clone();
                    plan.sort();
                    assert_eq!(all, plan, "{ctx}: batch {} kept + skipped != planned", g.0);
                }
                assert_eq!(
                    loader.stats().batches_in_flight,
                    0,
                    "{ctx}: work left in flight"
                );
            }
            tests::within(20, move || drop(loader));
        }
    });
}
