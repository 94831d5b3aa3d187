//! The feeder thread: walks an epoch's batches in order, takes a pool
//! buffer for each (blocking while none is free) and hands the batch to the
//! decode pool; in the streaming mode it also reads the batch's records.

use super::epoch::Pending;
use super::fill::{split, Filling, Handoff, SlotTable};
use super::{caught, Acks, Filled, Msg, Shared};
use crate::contract::Record;
use crate::error::{Error, Result};
use crate::order::sampler::Plan;
use crate::read::stream::Streamed;
use crate::stats::trace::LANE_FEED;
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The records of a streamed epoch, read by the feeder.
pub(super) struct RecordIter(pub(super) Box<dyn Iterator<Item = Streamed> + Send>);

impl std::fmt::Debug for RecordIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordIter")
    }
}

/// A record the feeder read, with the time the read took.
pub(super) type PreRead = Option<(Result<Record>, Duration)>;

/// An epoch for the feeder thread.
#[derive(Debug)]
pub(super) struct EpochCmd {
    pub(super) epoch: u64,
    pub(super) gen: u64,
    pub(super) plan: Plan,
    pub(super) stream: Option<RecordIter>,
    pub(super) start: usize,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) out: Sender<Result<Pending>>,
}

/// The feeder thread: one epoch command at a time, batches in order.
pub(super) fn feed(
    shared: &Arc<Shared>,
    decode_pool: &Arc<rayon::ThreadPool>,
    cmds: &Receiver<EpochCmd>,
    done: &Sender<Msg>,
    acks: &Acks,
) {
    'epochs: for cmd in cmds {
        let EpochCmd {
            epoch,
            gen,
            plan,
            mut stream,
            start,
            cancel,
            out,
        } = cmd;
        let begin = Msg::Begin {
            gen,
            out,
            first: start,
            cancel: cancel.clone(),
        };
        if done.send(begin).is_err() {
            return;
        }
        let plan = Arc::new(plan);
        if let (Some(ra), None) = (&shared.readahead, &stream) {
            // The rank's samples from `start`, in the order workers take them.
            let (plan, end) = (plan.clone(), plan.len());
            ra.begin(gen, Box::new((start..end).flat_map(move |k| plan.batch(k))));
        }
        let mut dispatched = 0;
        // The direct hand-over ([`super::direct`]) needs batches read at
        // random (not a stream read here in order) and a device whose
        // tensor takes the host buffer (the CPU).
        let direct_ok = stream.is_none() && shared.device.is_cpu();
        let threads = decode_pool.current_num_threads();
        // Reports batch `index` as failed; the epoch stops after it.
        let fail = |index, e| {
            // Counted before the uploader can count it done (the in-flight
            // gauge never reads below zero).
            shared.counters.batch_started();
            let _ = done.send(Msg::Done(
                gen,
                Filled {
                    index,
                    result: Some(Err(e)),
                },
            ));
        };
        // A panic in a streamed read (user `Source` code, on this thread)
        // fails the batch being read and ends the epoch; the feeder lives on.
        // A dropped epoch stops the reads between records.
        let mut skipped = Ok(());
        if let Some(stream) = &mut stream {
            // Resuming a stream: read past the batches before `start`.
            let skip: usize = (0..start.min(plan.len())).map(|k| plan.batch_len(k)).sum();
            skipped = caught(format!("the records before batch {start}"), || {
                for _ in 0..skip {
                    if cancel.load(Ordering::Relaxed) || stream.0.next().is_none() {
                        break;
                    }
                }
                Ok(())
            });
        }
        for index in start..plan.len() {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            let n = plan.batch_len(index);
            // Once a batch costs under a millisecond (known after the
            // first samples), the rest of the epoch is direct.
            if direct_ok && super::direct::wanted(shared, n) {
                let ids = (epoch, gen);
                super::direct::run(
                    shared,
                    decode_pool,
                    &plan,
                    index,
                    dispatched,
                    ids,
                    &cancel,
                    done,
                    acks,
                );
                continue 'epochs;
            }
            let t = Instant::now();
            let pre = match (&mut stream, std::mem::replace(&mut skipped, Ok(()))) {
                (_, Err(e)) => Err(e),
                (Some(stream), Ok(())) => {
                    let read = caught(format!("batch {index} (streamed)"), || {
                        read_batch(&plan, index, &mut stream.0, &cancel)
                    });
                    if let Some(trace) = &shared.trace {
                        trace.record("read batch (stream)", LANE_FEED, t, Instant::now());
                    }
                    read
                }
                (None, Ok(())) => Ok(Some(Vec::new())),
            };
            let pre = match pre {
                Ok(Some(pre)) => pre,
                Ok(None) => break,
                Err(e) => {
                    fail(index, e);
                    dispatched += 1;
                    break;
                }
            };
            let t = Instant::now();
            let acquired = shared.pool.acquire(&cancel);
            if let Some(trace) = &shared.trace {
                trace.record("wait for a batch buffer", LANE_FEED, t, Instant::now());
            }
            let mut buf = match acquired {
                None => break,
                Some(Ok(buf)) => buf,
                Some(Err(e)) => {
                    fail(index, e);
                    dispatched += 1;
                    break;
                }
            };
            if let Err(e) = buf.wait_writable() {
                // A device error: report it as this batch and stop the epoch.
                shared.pool.release(None);
                fail(index, e);
                dispatched += 1;
                break;
            }
            let table = match SlotTable::new(buf, n, &shared.schema) {
                Ok(table) => table,
                Err(failed) => {
                    let (buf, e) = *failed;
                    shared.pool.release(Some(buf));
                    fail(index, e);
                    dispatched += 1;
                    break;
                }
            };
            let (runners, claim) = split(shared.counters.mean_sample_work(), n, threads);
            let job = Arc::new(Filling::new(
                shared.clone(),
                plan.clone(),
                index,
                (epoch, gen),
                cancel.clone(),
                Handoff::Uploader(done.clone()),
                table,
                pre,
                claim,
            ));
            shared.counters.batch_started();
            dispatched += 1;
            if n == 0 {
                job.complete();
            }
            for _ in 0..runners.min(n) {
                let job = job.clone();
                decode_pool.spawn_fifo(move || job.run());
            }
        }
        if done.send(Msg::End { gen, dispatched }).is_err() {
            return;
        }
    }
}

/// Reads batch `index`'s records from the epoch's stream, checking that
/// they come in the plan's order; `None` once `cancel` is set.
pub(super) fn read_batch(
    plan: &Plan,
    index: usize,
    stream: &mut (dyn Iterator<Item = Streamed> + Send),
    cancel: &AtomicBool,
) -> Result<Option<Vec<PreRead>>> {
    let mut records = Vec::with_capacity(plan.batch_len(index));
    for want in plan.batch(index) {
        if cancel.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let t = Instant::now();
        match stream.next() {
            Some((got, record)) if got == want => records.push(Some((record, t.elapsed()))),
            _ => {
                return Err(Error::PipelineStopped {
                    delivered: index,
                    expected: plan.len(),
                })
            }
        }
    }
    Ok(Some(records))
}
