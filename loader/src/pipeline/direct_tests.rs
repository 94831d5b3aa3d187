use crate::error::Error;
use crate::fields::{Field, FieldType};
use crate::map::{map_fn, Sample};
use crate::pipeline::{BadSamples, Loader};
use crate::source::{MemorySource, Record};
use std::time::Duration;

/// A loader over 20 one-byte records, batches of 3 (the last one of
/// 2), whose map writes `[label, byte]`; it fails on `rec5` and
/// panics on `rec13` when `bad`.
fn loader(workers: usize, prefetch: usize, bad: Option<BadSamples>) -> Loader {
    let records = (0..20u8)
        .map(|i| Record::encoded(format!("rec{i}"), vec![100 + i], u32::from(i) * 7))
        .collect();
    let map = map_fn(
        vec![Field::new("v", FieldType::U32, &[2])],
        move |s: &mut Sample<'_>| {
            match (bad.is_some(), s.key()) {
                (true, "rec5") => return Err(Error::sample("rec5", "no good")),
                (true, "rec13") => panic!("the map broke on rec13"),
                _ => {}
            }
            let r = s.record();
            let v = [r.label, u32::from(r.bytes[0])];
            s.take::<u32>(0)?.copy_from_slice(&v);
            Ok(())
        },
    );
    Loader::builder(MemorySource::new(records))
        .map(map)
        .batch_size(3)
        .workers(workers)
        .batches_in_flight(2 + workers)
        .prefetch(prefetch)
        .shuffle(9)
        .bad_samples(bad.unwrap_or_default())
        .shard(0, 1)
        .build()
        .unwrap()
}

/// One delivered batch: its index, sample indices and values, or the
/// error's text.
type Got = std::result::Result<(usize, Vec<usize>, Vec<u32>, Vec<String>), String>;

fn take(b: crate::error::Result<crate::pipeline::Batch>) -> Got {
    let b = b.map_err(|e| e.to_string())?;
    let v = b.get("v").unwrap().flatten_all().unwrap().to_vec1::<u32>();
    let skipped = b.skipped.iter().map(|s| s.key.clone()).collect();
    Ok((b.index, b.indices.clone(), v.unwrap(), skipped))
}

fn force(l: &Loader, direct: Option<bool>) {
    *crate::sync::lock(&l.shared.force_direct) = direct;
}

/// Whatever the path (the feeder's and uploader's, the direct one from
/// the first batch, or the switch after the first batches once the
/// map is measured cheap) and the worker count, an epoch delivers the
/// same batches in the same order, every value where the plan puts
/// it, and every buffer comes back; also with a consumer slower than
/// the loader (batches wait in the inbox for room).
#[test]
fn every_path_delivers_the_same_batches() {
    let run = |workers, direct, slow: bool| {
        let mut l = loader(workers, 1, None);
        force(&l, direct);
        let mut all = Vec::new();
        for epoch in 0..2 {
            for b in l.epoch(epoch) {
                all.push(take(b));
                if slow {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        assert_eq!(l.shared.pool.out(), 0, "every buffer is back");
        all
    };
    let want = run(1, Some(false), false);
    assert_eq!(want.len(), 14);
    for (i, b) in want.iter().enumerate() {
        let (index, indices, v, _) = b.as_ref().unwrap();
        assert_eq!(*index, i % 7);
        let expect: Vec<u32> = indices
            .iter()
            .flat_map(|&j| [j as u32 * 7, 100 + j as u32])
            .collect();
        assert_eq!(*v, expect);
    }
    for workers in [1, 2, 3] {
        for direct in [Some(false), Some(true), None] {
            for slow in [false, true] {
                let got = run(workers, direct, slow);
                assert_eq!(got, want, "{workers} workers, {direct:?}, slow {slow}");
            }
        }
    }
}

/// A direct epoch resumed at batch 4 starts there; one dropped after
/// two batches gives every buffer back and leaves no thread busy; one
/// forgotten is stopped by the next epoch, which is whole.
#[test]
fn a_direct_epoch_resumes_cancels_and_is_forgotten() {
    let mut l = loader(2, 2, None);
    force(&l, Some(true));
    let full: Vec<Got> = l.epoch(3).map(take).collect();
    let resumed: Vec<Got> = l.epoch_from(3, 4).map(take).collect();
    assert_eq!(resumed, full[4..]);
    for _ in 0..5 {
        let mut e = l.epoch(3);
        assert_eq!(take(e.next().unwrap()), full[0]);
        assert_eq!(take(e.next().unwrap()), full[1]);
        drop(e);
        assert_eq!(
            l.shared.pool.out(),
            0,
            "a dropped epoch gives its buffers back"
        );
    }
    let mut e = l.epoch(3);
    let _ = e.next();
    std::mem::forget(e);
    let again: Vec<Got> = l.epoch(3).map(take).collect();
    assert_eq!(again, full);
}

/// A map that calls into rayon (`yield_now` runs another of the pool's
/// jobs on this thread: another pump) with fewer buffers than pumps:
/// the epoch completes (a pump that waited for a buffer on top of the
/// one holding it deadlocked).
#[test]
fn a_map_that_yields_to_rayon_does_not_deadlock_the_pumps() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for workers in [1, 2, 3] {
            let map = map_fn(
                vec![Field::new("v", FieldType::U32, &[])],
                |s: &mut Sample<'_>| {
                    let _ = rayon::yield_now();
                    s.take::<u32>(0)?[0] = s.record().label;
                    Ok(())
                },
            );
            let records = (0..40u32)
                .map(|i| Record::encoded(format!("r{i}"), vec![1], i))
                .collect();
            let mut l = Loader::builder(MemorySource::new(records))
                .map(map)
                .batch_size(2)
                .workers(workers)
                .batches_in_flight(1)
                .prefetch(1)
                .shard(0, 1)
                .build()
                .unwrap();
            force(&l, Some(true));
            for epoch in 0..3 {
                let n: usize = l.epoch(epoch).map(|b| b.unwrap().len()).sum();
                assert_eq!(n, 40);
            }
            assert_eq!(l.shared.pool.out(), 0);
        }
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hang: watchdog expired"),
        r => r.expect("the test panicked"),
    }
}

/// A sample that fails and one whose map panics: under `Fail` their
/// batches are errors naming them and the epoch goes on; under `Skip`
/// they are left out and listed, the same on either path.
#[test]
fn bad_samples_in_a_direct_epoch_follow_the_policy() {
    for policy in [BadSamples::Fail, BadSamples::Skip] {
        let mut by_path = Vec::new();
        for direct in [Some(false), Some(true)] {
            let mut l = loader(2, 2, Some(policy));
            force(&l, direct);
            let got: Vec<Got> = l.epoch(0).map(take).collect();
            assert_eq!(got.len(), 7);
            let errors: Vec<&String> = got.iter().filter_map(|b| b.as_ref().err()).collect();
            let skipped: Vec<String> = got
                .iter()
                .filter_map(|b| b.as_ref().ok())
                .flat_map(|b| b.3.clone())
                .collect();
            match policy {
                BadSamples::Fail => {
                    assert_eq!(errors.len(), 2, "{got:?}");
                    assert!(errors.iter().any(|e| e.contains("rec5")), "{errors:?}");
                    assert!(errors.iter().any(|e| e.contains("rec13")), "{errors:?}");
                }
                _ => {
                    assert!(errors.is_empty(), "{errors:?}");
                    let mut skipped = skipped;
                    skipped.sort();
                    assert_eq!(skipped, ["rec13", "rec5"]);
                }
            }
            assert_eq!(l.shared.pool.out(), 0);
            by_path.push(got);
        }
        assert_eq!(by_path[0], by_path[1], "{policy:?}");
    }
}

/// A map that records its prefetch hints and panics in one: every
/// direct batch's samples after its first are hinted before they are
/// mapped (a pump fills a batch as one run), the hint's panic is
/// nobody's error, and the batches are the plain map's.
#[test]
fn the_map_is_told_each_next_sample_and_a_hint_cannot_fail() {
    use crate::map::Map;
    use std::sync::{Arc, Mutex};
    struct Hinted(Arc<Mutex<Vec<usize>>>);
    impl Map for Hinted {
        fn fields(&self) -> Vec<Field> {
            vec![Field::new("v", FieldType::U32, &[2])]
        }
        fn prefetch(&self, _seed: u64, _epoch: u64, index: usize) {
            crate::sync::lock(&self.0).push(index);
            assert_ne!(index, 11, "a broken hint");
        }
        fn map(&self, s: &mut Sample<'_>) -> crate::error::Result<()> {
            let r = s.record();
            let v = [r.label, u32::from(r.bytes[0])];
            s.take::<u32>(0)?.copy_from_slice(&v);
            Ok(())
        }
    }
    let hints = Arc::new(Mutex::new(Vec::new()));
    let records: Vec<Record> = (0..20u8)
        .map(|i| Record::encoded(format!("rec{i}"), vec![100 + i], u32::from(i) * 7))
        .collect();
    let mut l = Loader::builder(MemorySource::new(records))
        .map(Hinted(hints.clone()))
        .batch_size(3)
        .workers(2)
        .shuffle(9)
        .build()
        .unwrap();
    force(&l, Some(true));
    let got: Vec<Got> = l.epoch(0).map(take).collect();
    let mut plain = loader(2, 2, None);
    force(&plain, Some(true));
    assert_eq!(got, plain.epoch(0).map(take).collect::<Vec<_>>());
    let mut want: Vec<usize> = got
        .iter()
        .flat_map(|b| b.as_ref().unwrap().1[1..].to_vec())
        .collect();
    let mut hinted = crate::sync::lock(&hints).clone();
    want.sort_unstable();
    hinted.sort_unstable();
    assert_eq!(hinted, want);
    assert!(want.contains(&11), "the panicking hint was given");
}

/// A direct batch's samples are timed as a run, not one by one: the
/// loader still counts every sample and at least the time its map
/// took.
/// Review direct-turn3 N2: a source whose reads are slow, under a
/// cheap map, stays on the feeder's path (a pump would read its
/// batch's samples one after another).
#[test]
fn slow_reads_keep_an_epoch_off_the_direct_path() {
    use crate::source::Source;
    struct SlowReads;
    impl Source for SlowReads {
        fn len(&self) -> usize {
            12
        }
        fn read(&self, i: usize) -> crate::error::Result<Record> {
            std::thread::sleep(Duration::from_millis(2));
            Ok(Record::encoded(format!("s{i}"), vec![i as u8], i as u32))
        }
    }
    let map = map_fn(
        vec![Field::new("v", FieldType::U32, &[])],
        |s: &mut Sample<'_>| {
            s.take::<u32>(0)?[0] = s.record().label;
            Ok(())
        },
    );
    let mut l = Loader::builder(SlowReads)
        .map(map)
        .batch_size(3)
        .workers(2)
        .shard(0, 1)
        .build()
        .unwrap();
    assert_eq!(l.epoch(0).count(), 4);
    let shared = l.shared.clone();
    let mut e = l.epoch(1);
    e.next().unwrap().unwrap();
    assert!(crate::sync::lock(&shared.direct).is_none(), "went direct");
    assert_eq!(e.count(), 3);
}

#[test]
fn direct_samples_are_counted_with_their_time() {
    for direct in [Some(false), Some(true)] {
        let map = map_fn(
            vec![Field::new("v", FieldType::U32, &[1])],
            |s: &mut Sample<'_>| {
                std::thread::sleep(Duration::from_micros(200));
                s.take::<u32>(0)?[0] = s.record().label;
                Ok(())
            },
        );
        let records: Vec<Record> = (0..12u32)
            .map(|i| Record::encoded(format!("rec{i}"), Vec::new(), i))
            .collect();
        let mut l = Loader::builder(MemorySource::new(records))
            .map(map)
            .batch_size(4)
            .workers(2)
            .build()
            .unwrap();
        force(&l, direct);
        assert_eq!(l.epoch(0).map(|b| b.unwrap().len()).sum::<usize>(), 12);
        let mean = l
            .shared
            .counters
            .mean_sample_work()
            .expect("samples counted");
        assert!(mean >= Duration::from_micros(200), "{direct:?}: {mean:?}");
        assert_eq!(l.stats().samples, 12, "{direct:?}");
    }
}
