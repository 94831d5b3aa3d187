//! The direct hand-over for a cheap map on the CPU: decode threads take
//! whole batches themselves ("pumps") and hand each, in order, straight to
//! the epoch's channel, with no feeder or upload thread in between.
//!
//! A token window is a few-KiB copy: a batch of them costs tens of
//! microseconds, about what it costs to wake the feeder, queue a job,
//! wake the uploader and wake the consumer. So once a batch's samples
//! cost less than a millisecond of work ([`cheap`]; known after the first
//! samples), the feeder hands the rest of a random-access epoch on the
//! CPU to one pump per decode thread and waits:
//!
//! - A pump takes a pool buffer, **then** the next batch index (so the
//!   lowest batch not yet finished always has its buffer and a thread:
//!   the reorder can never wait on a batch that waits for a buffer), fills
//!   the batch (the same [`Filling`] as every batch: gate pass, bad-sample
//!   policy, cancel), makes its tensors (on the CPU the buffer becomes the
//!   tensor: no copy) and puts it in the [`Inbox`].
//! - The inbox puts batches back in order and moves each, when it is
//!   next, into the epoch's channel while the channel is within the
//!   prefetch depth. A batch keeps its pool permit until it enters the
//!   channel, so the loader's memory is bounded as on the other path
//!   (batches in flight, then the prefetch queue). Whoever changes what
//!   can move does the moving: a pump that put a batch in, and the
//!   consumer after it took one ([`Epoch::next`](super::Epoch)), so no
//!   thread is woken to do it.
//! - The uploader hands the epoch's channel over once every batch
//!   dispatched before the switch went through it (`Msg::Handover`), so
//!   an epoch can switch midway (the map's cost is known after its first
//!   samples), and the order holds across the switch.
//! - The feeder waits until the pumps are done and every batch is in the
//!   channel (or the epoch is cancelled), then closes the channel and
//!   acknowledges the epoch, as the uploader does on the other path.

use super::epoch::Pending;
use super::fill::{cheap, Filling, Handoff, SlotTable};
use super::reorder::Reorder;
use super::upload::upload_host;
use super::{Acks, Filled, Msg, Shared};
use crate::error::Result;
use crate::order::sampler::Plan;
use crate::stats::trace::LANE_DECODE;
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// A finished batch waiting for its turn: `None` for one cancelled or
/// discarded (nothing to deliver); `permit` when it still holds its pool
/// permit (given back as it enters the channel).
struct Entry {
    item: Option<Result<Pending>>,
    permit: bool,
}

struct State {
    /// The epoch's channel, once the uploader handed it over (`None` also
    /// when the consumer went away).
    out: Option<Sender<Result<Pending>>>,
    /// Whether the uploader has handed the channel over.
    handed: bool,
    order: Reorder<Entry>,
    /// The next batch index a pump takes.
    next: usize,
    /// One past the last batch to deliver: the plan's end, or the batch
    /// after one whose failure ends the epoch (as on the feeder's path).
    end: usize,
    /// Pumps still running.
    pumps: usize,
    /// Whether the feeder waits on `cv`.
    waiting: bool,
    /// Set by [`Inbox::finish`]: no pump is started after it.
    done: bool,
}

/// Where the pumps of one direct epoch put their batches, and what
/// starting one takes.
pub(super) struct Inbox {
    gen: u64,
    epoch: u64,
    cancel: Arc<AtomicBool>,
    plan: Arc<Plan>,
    decode_pool: Arc<rayon::ThreadPool>,
    /// Pumps at most: one per decode thread.
    most: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("gen", &self.gen).finish()
    }
}

impl Inbox {
    /// The pumps' batch indices run from `first` to the plan's end.
    fn new(
        (epoch, gen): (u64, u64),
        cancel: Arc<AtomicBool>,
        plan: Arc<Plan>,
        decode_pool: Arc<rayon::ThreadPool>,
        first: usize,
    ) -> Self {
        Self {
            gen,
            epoch,
            cancel,
            most: decode_pool.current_num_threads().max(1),
            decode_pool,
            state: Mutex::new(State {
                out: None,
                handed: false,
                order: Reorder::new(first),
                next: first,
                end: plan.batches.len(),
                pumps: 0,
                waiting: false,
                done: false,
            }),
            plan,
            cv: Condvar::new(),
        }
    }

    /// Starts pumps while fewer than one per decode thread run, batches
    /// are left and buffers are free. Called under the state's lock, where
    /// pumps end for want of a buffer ([`pump`]) and drains give buffers
    /// back, so a buffer that comes back always finds a pump to fill it.
    fn start_pumps(self: &Arc<Self>, shared: &Arc<Shared>, st: &mut State) {
        if self.cancel.load(Ordering::Relaxed)
            || st.done
            || st.next >= st.end
            || st.pumps >= self.most
        {
            return;
        }
        let free = shared.pool.free_permits();
        let n = self
            .most
            .saturating_sub(st.pumps)
            .min(free)
            .min(st.end - st.next);
        for _ in 0..n {
            st.pumps += 1;
            let (shared, inbox) = (shared.clone(), self.clone());
            self.decode_pool.spawn_fifo(move || pump(&shared, &inbox));
        }
    }

    /// The epoch's generation.
    pub(super) fn gen(&self) -> u64 {
        self.gen
    }

    /// The uploader gives the epoch's channel over (`None` when the
    /// consumer went away or the epoch is not the uploader's).
    pub(super) fn hand_over(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        out: Option<Sender<Result<Pending>>>,
    ) {
        let mut st = crate::lock(&self.state);
        st.out = out;
        st.handed = true;
        self.drain(shared, &mut st);
        // The batches before the switch gave their buffers back.
        self.start_pumps(shared, &mut st);
        self.notify_if_idle(&st);
    }

    /// Wakes the feeder if it waits (after a cancel). Otherwise it is
    /// woken only when what it waits for may have come (no pump left),
    /// not for every batch.
    pub(super) fn wake(&self) {
        let st = crate::lock(&self.state);
        self.notify(&st);
    }

    fn notify(&self, st: &State) {
        if st.waiting {
            self.cv.notify_all();
        }
    }

    /// Wakes the feeder when no pump runs and it has something to do:
    /// close the epoch (it is over), or wait for a buffer to start a pump
    /// with (batches are left: see [`finish`](Self::finish)).
    fn notify_if_idle(&self, st: &State) {
        if st.pumps == 0 && (self.over(st) || st.next < st.end) {
            self.notify(st);
        }
    }

    /// Whether the epoch is over for the feeder: cancelled, its consumer
    /// gone, or every batch claimed and delivered (those held beyond an
    /// end lowered by a failure are not delivered: they are over too).
    fn over(&self, st: &State) -> bool {
        let delivered = st.order.is_empty() || st.order.next() >= st.end;
        self.cancel.load(Ordering::Relaxed)
            || (st.handed && st.out.is_none())
            || (st.next >= st.end && delivered)
    }

    /// Moves the batches that are next into the channel, within the
    /// prefetch depth: the consumer calls it after taking a batch.
    pub(super) fn make_room(self: &Arc<Self>, shared: &Arc<Shared>) {
        let mut st = crate::lock(&self.state);
        self.drain(shared, &mut st);
        self.start_pumps(shared, &mut st);
        self.notify_if_idle(&st);
    }

    /// Moves what can move into the channel.
    fn drain(&self, shared: &Shared, st: &mut State) {
        let cancelled = self.cancel.load(Ordering::Relaxed);
        loop {
            if st.order.next() >= st.end {
                break;
            }
            let room = match (&st.out, st.order.peek()) {
                (_, None) => break,
                // Nothing to deliver, or nobody to deliver it to: passed
                // over now.
                (None, Some(_)) if !st.handed => break,
                (None, Some(_)) => true,
                (Some(_), Some(e)) if e.item.is_none() || cancelled => true,
                (Some(out), Some(_)) => {
                    let depth = shared.knobs.prefetch.load(Ordering::Relaxed);
                    out.len() < depth.min(out.capacity().unwrap_or(usize::MAX))
                }
            };
            if !room {
                break;
            }
            let Some((_, entry)) = st.order.pop() else {
                break;
            };
            // Counted as dropped or uploaded when it arrived. A batch
            // that cannot be sent (the consumer went away) is dropped with
            // the channel's other contents.
            let sent = match (entry.item, &st.out) {
                (Some(item), Some(out)) if !cancelled => out.try_send(item).is_ok(),
                _ => true,
            };
            if !sent {
                st.out = None;
            }
            if entry.permit {
                shared.pool.release(None);
            }
        }
    }

    /// A pump's finished batch.
    pub(super) fn arrive(self: &Arc<Self>, shared: &Arc<Shared>, filled: Filled) {
        let Filled { index, result } = filled;
        let live = !self.cancel.load(Ordering::Relaxed);
        let entry = match result {
            // Cancelled: the buffer went back already.
            None => {
                shared.counters.batch_dropped();
                Entry {
                    item: None,
                    permit: false,
                }
            }
            // A failed batch gave its buffer back.
            Some(Err(e)) => {
                shared.counters.batch_dropped();
                Entry {
                    item: Some(Err(e)),
                    permit: false,
                }
            }
            Some(Ok(host)) if !live => {
                shared.pool.release(Some(host.buf));
                shared.counters.batch_dropped();
                Entry {
                    item: None,
                    permit: false,
                }
            }
            Some(Ok(host)) => {
                // Outside the lock. The CPU tensor took the buffer: only
                // the permit is left, kept until the batch enters the
                // channel.
                let lane = LANE_DECODE + rayon::current_thread_index().unwrap_or(0) as u64;
                let (item, reusable) = upload_host(shared, index, host, lane);
                let permit = match (item.is_ok(), reusable) {
                    (true, None) => true,
                    (_, reusable) => {
                        shared.pool.release(reusable);
                        false
                    }
                };
                Entry {
                    item: Some(item),
                    permit,
                }
            }
        };
        self.push(shared, index, entry);
    }

    fn push(self: &Arc<Self>, shared: &Arc<Shared>, index: usize, entry: Entry) {
        let mut st = crate::lock(&self.state);
        st.order.push(index, entry);
        self.drain(shared, &mut st);
        self.start_pumps(shared, &mut st);
        self.notify_if_idle(&st);
    }

    /// The next batch for a pump, `None` once there is none (the plan's
    /// end, or one whose failure ended the epoch).
    fn claim(&self) -> Option<usize> {
        let mut st = crate::lock(&self.state);
        (st.next < st.end).then(|| {
            st.next += 1;
            st.next - 1
        })
    }

    /// Batch `index` failed in a way that ends the epoch (as the feeder's
    /// `fail`): it is delivered as the epoch's last batch.
    /// (Its permit was given back already, and the batch is not counted
    /// as started yet.)
    fn fail(self: &Arc<Self>, shared: &Arc<Shared>, index: usize, e: crate::error::Error) {
        shared.counters.batch_started();
        self.end_with(shared, index, e);
    }

    /// Batch `index`, counted as started, is the error `e` and the
    /// epoch's last.
    fn end_with(self: &Arc<Self>, shared: &Arc<Shared>, index: usize, e: crate::error::Error) {
        {
            let mut st = crate::lock(&self.state);
            st.end = st.end.min(index + 1);
        }
        let result = Some(Err(e));
        self.arrive(shared, Filled { index, result });
    }

    /// A pump ends (under the state's lock, `st`).
    fn pump_done(&self, mut st: std::sync::MutexGuard<'_, State>) {
        st.pumps -= 1;
        self.notify_if_idle(&st);
    }

    /// Waits until the pumps are done and every batch is in the channel
    /// (or the epoch was cancelled, or its consumer went away), then
    /// closes the channel: what is left is given back.
    ///
    /// While batches are left and no pump runs, every pool permit is out:
    /// held by batches waiting for room in the channel (the consumer's
    /// [`make_room`](Self::make_room) starts pumps again) or by an
    /// earlier, forgotten epoch's batches, whose buffers come back on
    /// paths that start no pump. So the feeder, which is not a decode
    /// thread and may block, waits for a permit itself, gives it back and
    /// starts the pumps: a buffer that comes back always finds a pump.
    fn finish(self: &Arc<Self>, shared: &Arc<Shared>) {
        let mut st = crate::lock(&self.state);
        loop {
            if st.pumps == 0 && st.handed && self.over(&st) {
                break;
            }
            if st.pumps == 0 && st.handed && st.next < st.end {
                drop(st);
                // `None`: cancelled (seen above next turn); an error: the
                // permit was given back, and the pump that takes it meets
                // the same error and fails its batch.
                if let Some(Ok(buf)) = shared.pool.acquire(&self.cancel) {
                    shared.pool.release(Some(buf));
                }
                st = crate::lock(&self.state);
                self.start_pumps(shared, &mut st);
                continue;
            }
            st.waiting = true;
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting = false;
        }
        st.done = true;
        st.out = None;
        let order = std::mem::replace(&mut st.order, Reorder::new(0));
        for entry in order.into_rest() {
            if entry.permit {
                shared.pool.release(None);
            }
        }
    }
}

/// Whether the rest of an epoch whose next batch has `n` samples goes
/// direct (where the device and the order allow it): once the samples'
/// mean cost, reads included, says the batch is [`cheap`]. (A source with
/// slow reads and a cheap map stays on the feeder's path, where a batch's
/// reads are spread over several workers; a pump reads its batch's
/// samples one after another.)
pub(super) fn wanted(shared: &Shared, n: usize) -> bool {
    #[cfg(test)]
    if let Some(forced) = *crate::lock(&shared.force_direct) {
        return forced;
    }
    cheap(shared.counters.mean_sample_cost(), n)
}

/// One pump: whole batches while a buffer is free, until none is left or
/// the epoch is cancelled. A pump never waits for a buffer (a job that
/// blocks can deadlock the pool: a source that calls into rayon, as
/// `rayon::yield_now`, can run another pump on its own thread's stack):
/// it ends, and the drain that gives a buffer back starts a new one.
///
/// Nor does it wait for a place in the worker gate: it takes its pass
/// first, holding nothing yet, and one that finds the gate full is
/// started again when a pass comes back (still counted among the pumps).
/// The pass is held for the pump's whole run, so the batch's runner goes
/// through on it.
fn pump(shared: &Arc<Shared>, inbox: &Arc<Inbox>) {
    let again = {
        let (shared, inbox) = (shared.clone(), inbox.clone());
        move || pump(&shared, &inbox)
    };
    let Some(_pass) = shared.knobs.gate.enter_or_defer(again) else {
        return;
    };
    let cancel = &inbox.cancel;
    loop {
        if cancel.load(Ordering::Relaxed) {
            break;
        }
        // The buffer first, then the index: see the module's docs.
        let mut buf = match shared.pool.try_acquire() {
            Some(Ok(buf)) => buf,
            Some(Err(e)) => {
                // (Its permit was given back.)
                if let Some(index) = inbox.claim() {
                    inbox.fail(shared, index, e);
                }
                break;
            }
            None => {
                let st = crate::lock(&inbox.state);
                // One came back before the lock: go on.
                if shared.pool.free_permits() > 0 {
                    continue;
                }
                return inbox.pump_done(st);
            }
        };
        let Some(index) = inbox.claim() else {
            shared.pool.release(Some(buf));
            break;
        };
        if let Err(e) = buf.wait_writable() {
            shared.pool.release(None);
            inbox.fail(shared, index, e);
            break;
        }
        let n = inbox.plan.batches[index].len();
        let table = match SlotTable::new(buf, n, &shared.schema) {
            Ok(table) => table,
            Err(failed) => {
                let (buf, e) = *failed;
                shared.pool.release(Some(buf));
                inbox.fail(shared, index, e);
                break;
            }
        };
        shared.counters.batch_started();
        // The samples' panics are caught where they run, and the batch's
        // hand-over's; one anywhere else (out of this loader's own code)
        // ends the epoch with an error at this batch rather than leaving
        // the feeder waiting for it.
        let batch = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fill(shared, inbox, index, table)
        }));
        if let Err(payload) = batch {
            shared.pool.release(None);
            let e = crate::error::Error::WorkerPanic {
                key: format!("batch {index}"),
                message: super::panic_message(payload.as_ref()),
            };
            inbox.end_with(shared, index, e);
            break;
        }
    }
    inbox.pump_done(crate::lock(&inbox.state));
}

/// Fills batch `index` into `table` and hands it to the inbox.
fn fill(shared: &Arc<Shared>, inbox: &Arc<Inbox>, index: usize, table: SlotTable) {
    let n = inbox.plan.batches[index].len();
    let filling = Arc::new(Filling::new(
        shared.clone(),
        inbox.plan.clone(),
        index,
        (inbox.epoch, inbox.gen),
        inbox.cancel.clone(),
        Handoff::Direct(inbox.clone()),
        table,
        Vec::new(),
        n,
    ));
    if n == 0 {
        filling.complete();
    } else {
        // One runner claiming every sample: it completes the batch.
        filling.run();
    }
}

/// Hands batches `first..` of `plan` to one pump per decode thread, the
/// epoch's channel from the uploader once it has delivered the
/// `dispatched` batches before them, and returns once the epoch is over
/// (acknowledged, like the uploader's).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    shared: &Arc<Shared>,
    decode_pool: &Arc<rayon::ThreadPool>,
    plan: &Arc<Plan>,
    first: usize,
    dispatched: usize,
    ids: (u64, u64),
    cancel: &Arc<AtomicBool>,
    done: &Sender<Msg>,
    acks: &Acks,
) {
    let gen = ids.1;
    let inbox = Arc::new(Inbox::new(
        ids,
        cancel.clone(),
        plan.clone(),
        decode_pool.clone(),
        first,
    ));
    *crate::lock(&shared.direct) = Some(inbox.clone());
    inbox.start_pumps(shared, &mut crate::lock(&inbox.state));
    let handover = Msg::Handover {
        gen,
        dispatched,
        inbox: inbox.clone(),
    };
    if done.send(handover).is_err() {
        inbox.hand_over(shared, None);
    }
    inbox.finish(shared);
    *crate::lock(&shared.direct) = None;
    acks.ack(gen);
}

/// The hangs the turn-3 review reproduced (F1, F2, F3), as tests.
#[cfg(test)]
#[path = "direct_hangs.rs"]
mod hangs;

#[cfg(test)]
mod tests {
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

    fn take(b: crate::Result<crate::Batch>) -> Got {
        let b = b.map_err(|e| e.to_string())?;
        let v = b.get("v").unwrap().flatten_all().unwrap().to_vec1::<u32>();
        let skipped = b.skipped.iter().map(|s| s.key.clone()).collect();
        Ok((b.index, b.indices.clone(), v.unwrap(), skipped))
    }

    fn force(l: &Loader, direct: Option<bool>) {
        *crate::lock(&l.shared.force_direct) = direct;
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
                crate::lock(&self.0).push(index);
                assert_ne!(index, 11, "a broken hint");
            }
            fn map(&self, s: &mut Sample<'_>) -> crate::Result<()> {
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
        let mut hinted = crate::lock(&hints).clone();
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
            fn read(&self, i: usize) -> crate::Result<Record> {
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
        assert!(crate::lock(&shared.direct).is_none(), "went direct");
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
}
