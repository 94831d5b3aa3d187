//! One batch filled by many jobs at once: each sample's slot claimed by one
//! of them (the pipeline's only unsafe code), the batch compacted and the
//! bad-sample policy applied when its last sample is done.

use super::epoch::Skipped;
use super::feed::PreRead;
use super::worker::{process, Worker};
use super::{panic_message, safe_key, Filled, HostBatch, Msg, Shared};
use crate::device::HostBuf;
use crate::error::{Error, Result};
use crate::fields::Schema;
use crate::order::sampler::Plan;
use crossbeam_channel::Sender;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What to do with a sample that cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BadSamples {
    /// The batch holding it is an `Err` naming the file (the default).
    #[default]
    Fail,
    /// Leave the sample out: its batch is one shorter, the sample is listed
    /// in [`Batch::skipped`](crate::Batch::skipped) and counted in [`Stats::skipped`](crate::stats::Stats::skipped).
    ///
    /// Every rank still gets the same number of batches (data-parallel
    /// ranks step together), so a batch whose samples were all bad is
    /// yielded **empty**: test [`Batch::is_empty`](crate::Batch::is_empty) and skip that step's loss
    /// (a mean over no samples is NaN, which an all-reduce spreads to every
    /// rank), but keep stepping in lockstep.
    Skip,
}

/// One sample's fate in a batch.
pub(super) enum Outcome {
    Ok { key: String },
    Failed { key: String, error: Error },
    Cancelled,
}

/// A batch buffer being filled by several jobs at once, and the one owner
/// of raw pointers into it: each sample's slots (one per field) go to
/// exactly one claimant ([`claim`](Self::claim)), a slot's borrow ends
/// before the claim is released, and the buffer comes back
/// ([`take_buf`](Self::take_buf)) only once every sample has been
/// released. So no two slices alias and none outlives the buffer, whatever
/// the threads do.
pub(super) struct SlotTable {
    /// The buffer the slots point into, until taken.
    pub(super) buf: Mutex<Option<HostBuf>>,
    /// `slots[j * fields + f]`: sample `j`'s bytes of field `f`.
    pub(super) slots: Vec<(*mut u8, usize)>,
    pub(super) fields: usize,
    /// The next sample to hand out.
    pub(super) next: AtomicUsize,
    /// Samples not yet released.
    pub(super) left: AtomicUsize,
}

// SAFETY: the pointers point into `buf`'s memory, which the table owns and
// gives back only once every sample is released (`take_buf`), and `claim`
// hands each sample's slots to one claimant, whose slice borrows end before
// its release; sending or sharing the table so creates no shared mutable
// access.
unsafe impl Send for SlotTable {}
// SAFETY: as for `Send`: through `&SlotTable` a slot is reached only by its
// one claimant.
unsafe impl Sync for SlotTable {}

/// Sample [`index`](Self::index) of a [`SlotTable`], this claimant's alone
/// until [`release`](Self::release)d. A claim dropped unreleased keeps its
/// buffer from being taken back (the batch never completes): the loader
/// catches every panic inside a claim, so it always releases.
pub(super) struct Claimed<'a> {
    pub(super) table: &'a SlotTable,
    pub(super) index: usize,
}

impl SlotTable {
    /// The slots of the first `n` samples of `buf`, laid out by `schema`;
    /// the buffer back with the error if they cannot be had (boxed: a rare
    /// path, and a pinned buffer is large).
    pub(super) fn new(
        mut buf: HostBuf,
        n: usize,
        schema: &Schema,
    ) -> Result<Self, Box<(HostBuf, Error)>> {
        let fields = schema.fields.len();
        let mut slots = vec![(std::ptr::null_mut(), 0); n * fields];
        match buf.regions(schema) {
            Ok(regions) => {
                for (f, (region, layout)) in regions.into_iter().zip(&schema.fields).enumerate() {
                    let b = layout.sample_bytes;
                    for (j, slot) in region[..n * b].chunks_exact_mut(b).enumerate() {
                        slots[j * fields + f] = (slot.as_mut_ptr(), slot.len());
                    }
                }
            }
            Err(e) => return Err(Box::new((buf, e))),
        }
        // The slots point into the buffer's heap memory, which moving the
        // `HostBuf` value into the mutex does not move.
        Ok(Self {
            buf: Mutex::new(Some(buf)),
            slots,
            fields,
            next: AtomicUsize::new(0),
            left: AtomicUsize::new(n),
        })
    }

    fn len(&self) -> usize {
        self.slots.len() / self.fields.max(1)
    }

    /// Whether every sample has been claimed.
    fn claimed_all(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.len()
    }

    /// The next (up to) `k` samples nobody has claimed, in order; `None`
    /// once all are. Give them back with
    /// [`ClaimedRun::release`].
    fn claim_run(&self, k: usize) -> Option<ClaimedRun<'_>> {
        let k = k.max(1);
        let first = self.next.fetch_add(k, Ordering::Relaxed);
        let end = first.saturating_add(k).min(self.len());
        if first >= end {
            return None;
        }
        Some(ClaimedRun {
            table: self,
            samples: first..end,
        })
    }

    /// The buffer, once every sample has been released (`None` before, and
    /// after it was taken).
    fn take_buf(&self) -> Option<HostBuf> {
        // Acquire: pairs with each release's AcqRel, so every slot's writes
        // happen before the buffer is read.
        if self.left.load(Ordering::Acquire) != 0 {
            return None;
        }
        crate::sync::lock(&self.buf).take()
    }
}

/// Samples of a [`SlotTable`] claimed together (one update of the
/// table's shared counters for the run, not one per sample), this
/// claimant's alone until [`release`](Self::release)d.
pub(super) struct ClaimedRun<'a> {
    table: &'a SlotTable,
    samples: std::ops::Range<usize>,
}

impl<'a> ClaimedRun<'a> {
    /// Each sample of the run in turn. Its slots' borrows end with the
    /// `Claimed`, which borrows the run, so all end before the release.
    fn each(&mut self) -> impl Iterator<Item = Claimed<'a>> + '_ {
        let table = self.table;
        self.samples
            .clone()
            .map(move |index| Claimed { table, index })
    }

    /// Gives the run's samples back; `true` when they were the last, after
    /// which [`SlotTable::take_buf`] returns the buffer.
    fn release(self) -> bool {
        let n = self.samples.len();
        // AcqRel: these samples' writes happen before the last release's
        // reader takes the buffer.
        self.table.left.fetch_sub(n, Ordering::AcqRel) == n
    }
}

impl Claimed<'_> {
    /// Which sample (its position in the batch).
    fn index(&self) -> usize {
        self.index
    }

    /// The sample's slot of every field, in schema order; borrowed from the
    /// claim, so they end before the claim is released.
    pub(super) fn slots(&mut self) -> impl Iterator<Item = &mut [u8]> + '_ {
        let t = self.table;
        t.slots[self.index * t.fields..(self.index + 1) * t.fields]
            .iter()
            .map(|&(p, n)| {
                // SAFETY: `claim_run` handed this sample to this claim's
                // run only (`next` gives each index once), and its slots
                // are disjoint ranges of the buffer (one per field), so no
                // other slice of them exists while `&mut self` is borrowed;
                // the buffer is alive and unmoved in `table.buf`, since
                // `take_buf` gives it out only once `left` is 0, which needs
                // the run's release, and these borrows end before the run's
                // `release` can run.
                unsafe { std::slice::from_raw_parts_mut(p, n) }
            })
    }
}

/// Where a finished batch goes: the uploader, or the inbox of a direct
/// epoch ([`super::direct`]).
pub(super) enum Handoff {
    Uploader(Sender<Msg>),
    Direct(Arc<super::direct::Inbox>),
}

/// One batch being filled. Its samples are claimed in order, in runs of
/// [`split`]'s size (one at a time for an image map), by up to one runner
/// job per decode thread (one job for a batch cheaper than a claim), and
/// the job that completes the last sample hands the batch over. Runners
/// are queued first-in first-out, so the workers finish a batch before
/// they start the next, and no job ever blocks waiting for another: a
/// worker never holds back a finished batch while it helps with a later
/// one (as a nested `par_iter` waiting for its last sample would).
pub(super) struct Filling {
    pub(super) shared: Arc<Shared>,
    /// The batch's source indices.
    pub(super) indices: Vec<usize>,
    pub(super) index: usize,
    pub(super) epoch: u64,
    pub(super) gen: u64,
    pub(super) cancel: Arc<AtomicBool>,
    /// Where the finished batch goes.
    pub(super) to: Handoff,
    /// The batch buffer and its samples' slots; the buffer is taken by
    /// `finish`.
    pub(super) table: SlotTable,
    /// The records read ahead (stream mode; empty for random access).
    pub(super) pre: Vec<Mutex<PreRead>>,
    pub(super) outcomes: Vec<Mutex<Option<Outcome>>>,
    /// Samples a runner claims at once ([`split`]).
    pub(super) claim: usize,
}

/// Work a runner claims at once, as a time: claiming and releasing
/// samples one by one costs two updates of counters the runners share,
/// and every runner of a batch is a job to queue and a thread to wake,
/// which is nothing beside an image's decode but as much as a cheap map's
/// work (a token window is a few-KiB copy).
const CLAIM_WORK: std::time::Duration = std::time::Duration::from_micros(50);

/// How a batch of `n` samples is split: how many runner jobs fill it (at
/// most `threads`) and how many samples a runner claims at once. About
/// [`CLAIM_WORK`] of the map's mean time so far a claim (`mean`; one
/// sample before any is measured), so a batch cheaper than that is one
/// job, and an image batch one job per thread, claiming one sample at a
/// time.
pub(super) fn split(mean: Option<std::time::Duration>, n: usize, threads: usize) -> (usize, usize) {
    let by_time = match mean {
        Some(m) if !m.is_zero() => {
            usize::try_from(CLAIM_WORK.as_nanos().div_ceil(m.as_nanos())).unwrap_or(usize::MAX)
        }
        _ => 1,
    };
    let n = n.max(1);
    let runners = n.div_ceil(by_time).clamp(1, threads.max(1));
    (runners, by_time.min(n.div_ceil(runners)))
}

/// Below this much work a batch, the feeder's and uploader's hand-overs
/// (two thread wake-ups and a queued job, tens of microseconds) are a
/// good part of the batch's cost, and the direct hand-over
/// ([`super::direct`]) is faster; above it they are a few percent, and
/// splitting a batch over the threads gets it ready sooner (an image
/// batch is tens of milliseconds).
const DIRECT_WORK: std::time::Duration = std::time::Duration::from_millis(1);

/// Whether a batch of `n` samples, at `mean` a sample (the map's mean
/// time so far; `None` before any is measured), is cheap enough for the
/// direct hand-over.
pub(super) fn cheap(mean: Option<std::time::Duration>, n: usize) -> bool {
    mean.is_some_and(|m| m.as_nanos().saturating_mul(n as u128) <= DIRECT_WORK.as_nanos())
}

impl Filling {
    /// Batch `index` of `plan` into the slots of `table`, with the records
    /// `pre` read ahead (stream mode; `None` for random access).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        shared: Arc<Shared>,
        plan: Arc<Plan>,
        index: usize,
        (epoch, gen): (u64, u64),
        cancel: Arc<AtomicBool>,
        to: Handoff,
        table: SlotTable,
        mut pre: Vec<PreRead>,
        claim: usize,
    ) -> Self {
        let n = table.len();
        // Random access reads nothing ahead: no lock a sample to take it.
        if !pre.is_empty() {
            pre.resize_with(n, || None);
        }
        Self {
            claim,
            shared,
            indices: plan.batch(index),
            index,
            epoch,
            gen,
            cancel,
            to,
            table,
            pre: pre.into_iter().map(Mutex::new).collect(),
            outcomes: (0..n).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// Claims and processes samples until none are left to claim, as one
    /// worker (one gate pass and one scratch for the whole run); the run
    /// that releases the last sample hands the batch over.
    ///
    /// A runner that finds the worker gate full gives up its turn and is
    /// started again when a pass comes back (a decode thread never waits
    /// for a pass: see [`crate::tune::Gate`]).
    pub(super) fn run(self: &Arc<Self>) {
        if self.table.claimed_all() {
            // The other runners took every sample: no need for a pass. (If
            // this runner was started again from the gate's queue for a
            // place that came free, the next one queued gets the place.)
            self.shared.knobs.gate.kick();
            return;
        }
        let again = {
            let me = self.clone();
            move || me.run()
        };
        let Some(pass) = self.shared.knobs.gate.enter_or_defer(again) else {
            return;
        };
        let indices = self.indices();
        // A direct batch's samples are cheap: timed as a run.
        let timed = !matches!(self.to, Handoff::Direct(_));
        let mut worker = Worker::enter(&self.shared, timed, pass);
        let map = &*self.shared.map;
        while let Some(mut run) = self.table.claim_run(self.claim) {
            let mut claims = run.each().peekable();
            while let Some(mut claim) = claims.next() {
                let j = claim.index();
                // The run's next sample: the map may start its loads now
                // (a hint: a panic in it is nobody's error).
                if let Some(next) = claims.peek() {
                    let next = indices[next.index()];
                    let hint = || map.prefetch(self.shared.seed, self.epoch, next);
                    let _ = catch_unwind(AssertUnwindSafe(hint));
                }
                let pre = self.pre.get(j).and_then(|p| crate::sync::lock(p).take());
                let shared = &self.shared;
                // `process` catches the sample's own panics; this catches
                // the rest, so every claim is released and the batch
                // completes (an unwind out of a rayon job would abort the
                // process: the pool has no panic handler).
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    process(
                        &mut worker,
                        self.epoch,
                        indices[j],
                        &mut claim,
                        &self.cancel,
                        pre,
                    )
                }))
                .unwrap_or_else(|payload| Outcome::Failed {
                    key: safe_key(shared, indices[j]),
                    error: Error::WorkerPanic {
                        key: safe_key(shared, indices[j]),
                        message: panic_message(payload.as_ref()),
                    },
                });
                *crate::sync::lock(&self.outcomes[j]) = Some(outcome);
            }
            drop(claims);
            worker.count();
            if run.release() {
                // The last sample: nothing is left to claim. The pass and
                // scratch go back first, so no worker holds a gate pass
                // while it sends to the uploader.
                drop(worker);
                self.complete();
                return;
            }
        }
    }

    /// Hands the finished batch (or its error) to the uploader.
    pub(super) fn complete(&self) {
        let index = self.index;
        let filled = catch_unwind(AssertUnwindSafe(|| self.finish())).unwrap_or_else(|payload| {
            // The buffer was lost with the panic; return its permit.
            self.shared.pool.release(None);
            Filled {
                index,
                result: Some(Err(Error::WorkerPanic {
                    key: format!("batch {index}"),
                    message: panic_message(payload.as_ref()),
                })),
            }
        });
        match &self.to {
            Handoff::Uploader(done) => {
                let _ = done.send(Msg::Done(self.gen, filled));
            }
            Handoff::Direct(inbox) => inbox.arrive(&self.shared, filled),
        }
    }

    /// Compacts the kept samples to the front of the buffer and builds the
    /// batch.
    fn finish(&self) -> Filled {
        let (shared, index) = (&*self.shared, self.index);
        let indices = self.indices();
        let buf = self
            .table
            .take_buf()
            .expect("a batch finishes once, after its last sample");
        if self.cancel.load(Ordering::Relaxed) {
            shared.pool.release(Some(buf));
            return Filled {
                index,
                result: None,
            };
        }
        // Every bad sample of the batch is listed, also those after the
        // one that fails it.
        if let Some(q) = &shared.quarantine {
            for (outcome, &source_index) in self.outcomes.iter().zip(indices) {
                if let Some(Outcome::Failed { key, error }) = &*crate::sync::lock(outcome) {
                    q.log(key, self.epoch, source_index, error);
                }
            }
        }
        let mut batch = HostBatch {
            buf,
            keys: Vec::with_capacity(indices.len()),
            indices: Vec::with_capacity(indices.len()),
            skipped: Vec::new(),
        };
        for (slot, (outcome, &source_index)) in self.outcomes.iter().zip(indices).enumerate() {
            match crate::sync::lock(outcome)
                .take()
                .unwrap_or(Outcome::Cancelled)
            {
                Outcome::Ok { key } => {
                    let kept = batch.keys.len();
                    if kept != slot {
                        if let Err(e) = batch.buf.move_slot(slot, kept, &shared.schema) {
                            shared.pool.release(Some(batch.buf));
                            return Filled {
                                index,
                                result: Some(Err(e)),
                            };
                        }
                    }
                    batch.keys.push(key);
                    batch.indices.push(source_index);
                }
                Outcome::Failed { key, error } => match shared.bad_samples {
                    BadSamples::Fail => {
                        shared.pool.release(Some(batch.buf));
                        return Filled {
                            index,
                            result: Some(Err(error)),
                        };
                    }
                    BadSamples::Skip => {
                        shared.counters.skipped(key.clone());
                        batch.skipped.push(Skipped { key, error });
                    }
                },
                Outcome::Cancelled => {
                    // Cancel was set after this batch's check above; unreachable
                    // in practice, handled the same way.
                    shared.pool.release(Some(batch.buf));
                    return Filled {
                        index,
                        result: None,
                    };
                }
            }
        }
        Filled {
            index,
            result: Some(Ok(batch)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image map (a millisecond a sample) is one runner per thread
    /// claiming one sample at a time; a cheap map's batch is one runner
    /// claiming it whole; in between, runs of about 50 µs.
    #[test]
    fn a_batch_is_split_by_the_maps_cost() {
        use std::time::Duration;
        let us = Duration::from_micros;
        assert_eq!(split(Some(us(1000)), 64, 2), (2, 1));
        assert_eq!(split(Some(us(1)), 32, 2), (1, 32));
        assert_eq!(split(Some(us(10)), 256, 4), (4, 5));
        assert_eq!(split(Some(us(10)), 12, 4), (3, 4));
        // Nothing measured yet: every thread, one sample at a time.
        assert_eq!(split(None, 64, 3), (3, 1));
        assert_eq!(split(Some(Duration::ZERO), 64, 3), (3, 1));
        assert_eq!(split(None, 2, 8), (2, 1));
        assert_eq!(split(Some(us(1)), 0, 2), (1, 1));
    }

    /// A batch is cheap when its samples, at the mean measured so far,
    /// cost at most a millisecond; never before anything is measured.
    #[test]
    fn a_batch_is_cheap_below_a_millisecond_of_work() {
        use std::time::Duration;
        let us = Duration::from_micros;
        assert!(cheap(Some(us(2)), 32));
        assert!(cheap(Some(us(2)), 500));
        assert!(!cheap(Some(us(2)), 501));
        assert!(cheap(Some(us(1000)), 1));
        assert!(!cheap(Some(us(1001)), 1));
        assert!(!cheap(None, 1));
        assert!(cheap(Some(Duration::ZERO), 1 << 20));
    }

    /// Three threads fill a table of two fields: each sample goes to one
    /// of them, the buffer comes back only after the last release (to the
    /// one thread told it was last), with every slot's writes in it.
    #[test]
    fn a_slot_table_hands_each_slot_out_once_and_the_buffer_back_last() {
        use crate::fields::{Field, FieldType};
        let schema = Schema::new(
            &[
                Field::new("a", FieldType::U8, &[3]),
                Field::new("b", FieldType::U32, &[]),
            ],
            8,
        )
        .unwrap();
        for round in 0..50 {
            let table = SlotTable::new(crate::device::heap_buffer(&schema), 8, &schema).unwrap();
            let go = std::sync::Barrier::new(3);
            let lasts = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        go.wait();
                        // Runs of 1 to 3 samples.
                        let mut k = 0;
                        while let Some(mut run) = table.claim_run(k % 3 + 1) {
                            k += 1;
                            for mut claim in run.each() {
                                let j = claim.index();
                                let mut slots = claim.slots();
                                slots.next().unwrap().fill(j as u8 + 1);
                                let b = slots.next().unwrap();
                                b.copy_from_slice(&(100 + j as u32).to_ne_bytes());
                                assert!(slots.next().is_none());
                            }
                            assert!(table.take_buf().is_none(), "a claim is still held");
                            if run.release() {
                                lasts.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(lasts.load(Ordering::Relaxed), 1, "round {round}");
            let Some(mut buf) = table.take_buf() else {
                panic!("round {round}: the buffer comes back once every slot is released")
            };
            let regions = buf.regions(&schema).unwrap();
            let want: Vec<u8> = (1..=8).flat_map(|j| [j; 3]).collect();
            assert_eq!(regions[0], &want[..], "round {round}");
            let want: Vec<u8> = (0..8u32).flat_map(|j| (100 + j).to_ne_bytes()).collect();
            assert_eq!(regions[1], &want[..], "round {round}");
            drop(regions);
            assert!(table.take_buf().is_none(), "taken once");
        }
    }
}
