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
                end: plan.len(),
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
        let mut st = crate::sync::lock(&self.state);
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
        let st = crate::sync::lock(&self.state);
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
        let mut st = crate::sync::lock(&self.state);
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
        let mut st = crate::sync::lock(&self.state);
        st.order.push(index, entry);
        self.drain(shared, &mut st);
        self.start_pumps(shared, &mut st);
        self.notify_if_idle(&st);
    }

    /// The next batch for a pump, `None` once there is none (the plan's
    /// end, or one whose failure ended the epoch).
    fn claim(&self) -> Option<usize> {
        let mut st = crate::sync::lock(&self.state);
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
            let mut st = crate::sync::lock(&self.state);
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
        let mut st = crate::sync::lock(&self.state);
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
                st = crate::sync::lock(&self.state);
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
    if let Some(forced) = *crate::sync::lock(&shared.force_direct) {
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
                let st = crate::sync::lock(&inbox.state);
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
        let n = inbox.plan.batch_len(index);
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
    inbox.pump_done(crate::sync::lock(&inbox.state));
}

/// Fills batch `index` into `table` and hands it to the inbox.
fn fill(shared: &Arc<Shared>, inbox: &Arc<Inbox>, index: usize, table: SlotTable) {
    let n = inbox.plan.batch_len(index);
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
    *crate::sync::lock(&shared.direct) = Some(inbox.clone());
    inbox.start_pumps(shared, &mut crate::sync::lock(&inbox.state));
    let handover = Msg::Handover {
        gen,
        dispatched,
        inbox: inbox.clone(),
    };
    if done.send(handover).is_err() {
        inbox.hand_over(shared, None);
    }
    inbox.finish(shared);
    *crate::sync::lock(&shared.direct) = None;
    acks.ack(gen);
}

/// The hangs the turn-3 review reproduced (F1, F2, F3), as tests.
#[cfg(test)]
#[path = "direct_hangs.rs"]
mod hangs;

#[cfg(test)]
#[path = "direct_tests.rs"]
mod tests;
