//! Each test here hung before its fix (a watchdog turns a hang into a
//! failure): a forgotten epoch on the feeder's path starving the next
//! direct epoch (F1), an epoch ended by a failure whose channel never
//! closed (F2), and a map that uses rayon across threads while the worker
//! gate is below the pool's size (F3, on both paths).

use super::{Entry, Inbox};
use crate::error::Error;
use crate::fields::{Field, FieldType};
use crate::map::{map_fn, Sample};
use crate::order::sampler::Plan;
use crate::pipeline::{Loader, Shared};
use crate::source::{MemorySource, Record};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// `f`'s result, or an error when it has not returned after `secs`.
fn watchdog<T: Send + 'static>(
    secs: u64,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .map_err(|e| format!("{e:?}"))
}

fn records(n: u32) -> Vec<Record> {
    (0..n)
        .map(|i| Record::encoded(format!("r{i}"), vec![1], i))
        .collect()
}

/// `n` records in batches of `batch` through `map`: 2 pool threads, 2
/// buffers, a prefetch depth of 1.
fn loader(n: u32, batch: usize, map: impl crate::map::Map) -> Loader {
    Loader::builder(MemorySource::new(records(n)))
        .map(map)
        .batch_size(batch)
        .workers(2)
        .batches_in_flight(2)
        .prefetch(1)
        .shard(0, 1)
        .build()
        .unwrap()
}

fn force(l: &Loader, direct: bool) {
    *crate::sync::lock(&l.shared.force_direct) = Some(direct);
}

#[test]
fn a_forgotten_feeder_epoch_does_not_starve_the_next_direct_epoch() {
    let r = watchdog(20, || {
        let closed = Arc::new(AtomicBool::new(true));
        let entered = Arc::new(AtomicUsize::new(0));
        let (c, n) = (closed.clone(), entered.clone());
        let map = map_fn(
            vec![Field::new("v", FieldType::U32, &[])],
            move |s: &mut Sample<'_>| {
                if s.epoch() == 0 {
                    n.fetch_add(1, SeqCst);
                    while c.load(SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                s.take::<u32>(0)?[0] = s.record().label;
                Ok(())
            },
        );
        let mut l = loader(8, 2, map);
        let shared = l.shared.clone();
        force(&l, false);
        let e0 = l.epoch(0);
        while entered.load(SeqCst) < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Both buffers are held by epoch 0's batches, on the feeder's path.
        std::mem::forget(e0);
        force(&l, true);
        let e1 = l.epoch(1);
        while !crate::sync::lock(&shared.direct)
            .as_ref()
            .is_some_and(|i| i.gen == 2 && crate::sync::lock(&i.state).handed)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Epoch 0's buffers come back now, on paths that start no pump.
        closed.store(false, SeqCst);
        e1.map(|b| b.unwrap().len()).sum::<usize>()
    });
    assert_eq!(r, Ok(8));
}

#[test]
fn an_epoch_ended_by_a_failure_closes_its_channel_when_drained_by_the_consumer() {
    let map = map_fn(
        vec![Field::new("v", FieldType::U32, &[])],
        |s: &mut Sample<'_>| {
            s.take::<u32>(0)?[0] = s.record().label;
            Ok(())
        },
    );
    let l = Loader::builder(MemorySource::new(records(8)))
        .map(map)
        .batch_size(2)
        .workers(2)
        .prefetch(1)
        .shard(0, 1)
        .build()
        .unwrap();
    let shared = l.shared.clone();
    let plan = Arc::new(Plan::listed(
        (0..8).collect(),
        (0..4).map(|b| 2 * b..2 * b + 2).collect(),
        (0..5).map(|b| 2 * b).collect(),
    ));
    let cancel = Arc::new(AtomicBool::new(false));
    let inbox = Arc::new(Inbox::new(
        (0, 99),
        cancel.clone(),
        plan,
        l.decode_pool.clone().unwrap(),
        0,
    ));
    {
        // Three batches claimed by stand-in pumps.
        let mut st = crate::sync::lock(&inbox.state);
        st.next = 3;
        st.pumps = inbox.most;
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    inbox.hand_over(&shared, Some(tx));
    let err = |s: &str| Error::InvalidConfig(s.into());
    let entry = |s| Entry {
        item: Some(Err(err(s))),
        permit: false,
    };
    inbox.push(&shared, 0, entry("b0")); // sent
    inbox.push(&shared, 2, entry("b2")); // held: 1 is not there yet
    inbox.end_with(&shared, 1, err("b1")); // the end is 2 now; no room: held
    for _ in 0..inbox.most {
        inbox.pump_done(crate::sync::lock(&inbox.state));
    }
    let feeder = {
        let (i, s) = (inbox.clone(), shared.clone());
        std::thread::spawn(move || i.finish(&s))
    };
    while !crate::sync::lock(&inbox.state).waiting {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = rx.recv().unwrap();
    inbox.make_room(&shared); // b1 goes out; the end is reached
    let _ = rx.recv().unwrap();
    inbox.make_room(&shared);
    let closed = matches!(
        rx.recv_timeout(Duration::from_secs(10)),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected)
    );
    // The channel closes inside `finish`, just before it returns.
    let t = Instant::now();
    while !feeder.is_finished() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let finished = feeder.is_finished();
    cancel.store(true, SeqCst);
    inbox.wake();
    feeder.join().unwrap();
    assert!(
        closed,
        "the channel stayed open after the epoch's last batch"
    );
    assert!(finished, "the feeder was never told the epoch was over");
}

/// A map that once, when `ready` says the moment has come, runs a rayon
/// job another pool thread steals, and waits for it there (the job
/// itself yields to rayon, so the thief runs whatever is queued).
fn rayon_map(
    cell: Arc<OnceLock<Weak<Shared>>>,
    triggered: Arc<AtomicBool>,
    j_running: Arc<AtomicBool>,
    ready: fn(&Shared) -> bool,
) -> impl crate::map::Map {
    map_fn(
        vec![Field::new("v", FieldType::U32, &[])],
        move |s: &mut Sample<'_>| {
            s.take::<u32>(0)?[0] = s.record().label;
            if triggered.load(SeqCst) {
                return Ok(());
            }
            let Some(shared) = cell.get().and_then(Weak::upgrade) else {
                return Ok(());
            };
            let go = ready(&shared);
            drop(shared);
            if !go || triggered.swap(true, SeqCst) {
                return Ok(());
            }
            let stolen = AtomicBool::new(false);
            let t0 = Instant::now();
            rayon::scope(|sc| {
                sc.spawn(|_| {
                    stolen.store(true, SeqCst);
                    j_running.store(true, SeqCst);
                    let deadline = Instant::now() + Duration::from_secs(3);
                    while Instant::now() < deadline {
                        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                });
                while !stolen.load(SeqCst) && t0.elapsed() < Duration::from_secs(1) {
                    std::thread::yield_now();
                }
            });
            Ok(())
        },
    )
}

/// 30 epochs of 16 one-sample batches, the gate at 1 of 2 pool threads
/// (AUTOTUNE's start), `direct` or on the feeder's path; the consumer
/// waits for the stolen job before its take, so the take's freed buffer
/// (a new pump or runner) is what the thief runs.
fn rayon_across_threads(direct: bool, ready: fn(&Shared) -> bool) -> Result<usize, String> {
    watchdog(60, move || {
        let cell: Arc<OnceLock<Weak<Shared>>> = Arc::default();
        let (triggered, j_running) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let map = rayon_map(
            cell.clone(),
            triggered.clone(),
            Arc::clone(&j_running),
            ready,
        );
        let mut l = loader(16, 1, map);
        force(&l, direct);
        l.shared.knobs.gate.set_limit(1);
        let _ = cell.set(Arc::downgrade(&l.shared));
        let mut samples = 0;
        for e in 0..30 {
            triggered.store(false, SeqCst);
            j_running.store(false, SeqCst);
            let mut epoch = l.epoch(e);
            loop {
                std::thread::sleep(Duration::from_millis(3));
                if triggered.load(SeqCst) {
                    let t = Instant::now();
                    while !j_running.load(SeqCst) && t.elapsed() < Duration::from_secs(1) {
                        std::thread::yield_now();
                    }
                }
                match epoch.next() {
                    Some(b) => samples += b.unwrap().len(),
                    None => break,
                }
            }
        }
        samples
    })
}

#[test]
fn a_map_using_rayon_across_threads_under_a_low_gate_does_not_deadlock_the_pumps() {
    // A pump alone, with the next batch waiting for room.
    let ready = |shared: &Shared| {
        crate::sync::lock(&shared.direct).as_ref().is_some_and(|i| {
            let st = crate::sync::lock(&i.state);
            st.pumps == 1 && st.handed && st.order.peek().is_some()
        })
    };
    assert_eq!(rayon_across_threads(true, ready), Ok(30 * 16));
}

#[test]
fn a_map_using_rayon_across_threads_under_a_low_gate_does_not_deadlock_the_runners() {
    // Every buffer out: the consumer's take frees one for a new batch.
    let ready = |shared: &Shared| shared.pool.free_permits() == 0;
    assert_eq!(rayon_across_threads(false, ready), Ok(30 * 16));
}
