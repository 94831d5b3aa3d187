//! Orchestration: the builder, the loader's long-lived threads, and the
//! per-epoch iterator. Each stage of a batch's trip has its file:
//!
//! | file | stage |
//! |---|---|
//! | [`builder`] | settings, validation, the knobs AUTOTUNE starts from |
//! | [`loader`] | the threads: spawn, epochs, accessors, drop (joins all) |
//! | [`feed`] | the feeder thread: batches in order, a pool buffer each, stream reads |
//! | [`fill`] | one batch filled by many jobs: slot claiming (the only unsafe code in `pipeline/`), the bad-sample policy |
//! | [`worker`] | one sample: read (or cache hit), decode, transform into its slot, cache fill |
//! | [`reorder`] | batches finish out of order and leave in index order (a pure type) |
//! | [`upload`] | the uploader thread: reorder, device upload, prefetch depth |
//! | [`direct`] | a cheap map on the CPU: decode threads fill whole batches and hand them over in order themselves |
//! | [`epoch`] | what the training loop holds: [`Epoch`], [`Batch`](crate::Batch) |
//!
//! # Threads and messages
//!
//! ```text
//!   Loader::epoch_from ──EpochCmd (bounded 1)──► wick-feed
//!                                                  │ per batch: Pool::acquire (blocks when no
//!                                                  │ buffer is free), then spawn_fifo runners
//!                                                  ▼
//!                                            wick-decode-{i}  (Gate::enter: the AUTOTUNE'd
//!                                                  │           worker count)
//!     Msg channel, bounded in_flight + 2:          │
//!     Begin{gen} ─(feeder)─► Done(gen, batch) ─(the worker finishing a batch)─► End{gen, dispatched} ─(feeder)
//!                                                  ▼
//!                                              wick-upload: Reorder → Uploader::upload →
//!                                                  │ Room::wait_while(queue ≥ prefetch depth)
//!     Result<Pending>, bounded channel ◄───────────┘
//!                  ▼
//!   Epoch::next (consumer; runs the AUTOTUNE step, wakes Room)
//!   Drop for Epoch: cancel flag → wake pool and Room → Acks::wait(gen)
//!                   ◄── the uploader acks gen once every dispatched batch came back
//! ```
//!
//! - Once a batch is cheaper than the hand-overs above (a token window
//!   is a few-KiB copy) on the CPU, in an epoch read at random, the feeder
//!   sends `Handover{gen, dispatched, inbox}` instead of `End`, and one
//!   pump per decode thread fills whole batches and puts them in order
//!   into the epoch's channel itself; the uploader gives the channel over
//!   once the batches before the switch are through. See [`direct`].
//! - Every message carries its epoch's generation (one per `epoch_from`),
//!   so a late message of a forgotten (`mem::forget`) epoch is given back,
//!   never delivered as the running epoch's.
//! - Who blocks on what: the feeder on the command channel (idle), the pool
//!   (no free buffer) and the `Msg` channel; workers on the gate and the
//!   `Msg` channel; the uploader on the `Msg` channel, [`Room`] (the prefetch
//!   depth AUTOTUNE chose) and the output channel; the consumer on the
//!   output channel and, when it drops the epoch, on [`Acks`]. A cancel wakes
//!   every one of those waits; none of them polls.

mod builder;
mod direct;
mod epoch;
mod feed;
mod fill;
mod loader;
mod quarantine;
mod reorder;
mod upload;
mod worker;

pub use builder::LoaderBuilder;
pub use epoch::{Batch, Epoch, Skipped};
pub use fill::BadSamples;
pub use loader::Loader;

use crate::cache::Cache;
use crate::contract::{Parts, Source};
use crate::device::HostBuf;
use crate::device::Uploader;
use crate::error::{Error, Result};
use crate::fields::Schema;
use crate::map::Map;
use crate::pool::Pool;
use crate::stats::trace::Trace;
use crate::stats::Counters;
use crate::sync::lock;
use crate::transform::ImageTransform;
use crate::tune::{Knobs, Tuner};
use candle_core::Device;
use crossbeam_channel::Sender;
use epoch::Pending;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

/// What the loader's threads share.
#[derive(Debug)]
struct Shared {
    source: Arc<dyn Source>,
    knobs: Knobs,
    tuner: Tuner,
    trace: Option<Arc<Trace>>,
    cache: Option<Cache>,
    /// The per-sample function and the fields it writes.
    map: Arc<dyn Map>,
    schema: Arc<Schema>,
    /// The record parts the map reads.
    parts: Arc<Parts>,
    /// The seed of the samples' random streams.
    seed: u64,
    /// The built-in image map's transform (`None` under a user map).
    transform: Option<ImageTransform>,
    pool: Pool<HostBuf>,
    counters: Counters,
    device: Device,
    bad_samples: BadSamples,
    uploader: Uploader,
    /// Signalled when the prefetch queue may have room for the uploader.
    room: Room,
    /// What decides order and content ([`crate::LoaderState`]).
    identity: Arc<crate::state::Identity>,
    /// Most pixels an image may declare.
    max_pixels: u64,
    /// Extra tries of a read that failed with a transient error.
    retries: u32,
    /// Where bad samples are listed (`bad_samples_log`).
    quarantine: Option<quarantine::Quarantine>,
    /// Reads a remote source's records ahead of the workers
    /// ([`ReadAhead`](crate::read::ahead::ReadAhead)).
    readahead: Option<Arc<crate::read::ahead::ReadAhead>>,
    /// Remote shards' chunks in memory, under the shard-block shuffle
    /// ([`Spans`](crate::storage::spans::Spans)).
    spans: Option<Arc<crate::storage::spans::Spans>>,
    /// The inbox of the running direct epoch, if any ([`direct`]).
    direct: Mutex<Option<Arc<direct::Inbox>>>,
    /// Tests choose the path: direct always, never, or by cost (`None`).
    #[cfg(test)]
    force_direct: Mutex<Option<bool>>,
}

impl Shared {
    /// What one decode may take now: the pixel limit, and the decoded
    /// bytes the RAM budget grants each active worker.
    fn decode_limits(&self) -> crate::decode::Limits {
        let k = &self.knobs;
        let workers = k.gate.limit();
        let (f, p) = (
            k.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            k.prefetch.load(std::sync::atomic::Ordering::Relaxed),
        );
        crate::decode::Limits {
            max_pixels: self.max_pixels,
            max_bytes: k.budget.decode_grant(f, p, workers),
        }
    }

    /// Wakes whatever waits and may have to see a cancel: the feeder in the
    /// pool, the uploader at the prefetch queue.
    fn wake(&self) {
        self.pool.wake();
        self.room.notify();
        if let Some(inbox) = &*lock(&self.direct) {
            inbox.wake();
        }
    }

    /// After the consumer took a batch of epoch `gen`: a direct epoch's
    /// batches that were waiting for room move into its channel.
    fn make_room(self: &Arc<Self>, gen: u64) {
        let inbox = lock(&self.direct).clone();
        if let Some(inbox) = inbox.filter(|i| i.gen() == gen) {
            inbox.make_room(self);
        }
    }
}

/// Wakes the upload thread when the prefetch queue may have room for the
/// next batch: the consumer took one (and AUTOTUNE may have changed the
/// prefetch depth), or the epoch was cancelled. (It polled every 200 µs
/// while a consumer held the epoch without taking batches.)
#[derive(Debug, Default)]
struct Room {
    /// How many threads wait (a notify with none waiting makes no system
    /// call).
    lock: Mutex<usize>,
    cv: Condvar,
}

impl Room {
    fn notify(&self) {
        if *crate::sync::lock(&self.lock) > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits while `full()` holds, with no timeout: every change to what
    /// `full` reads is followed by a `notify` under the lock, so no wake-up
    /// is lost. They are: the consumer taking a batch (after AUTOTUNE may
    /// have changed the depth: `Epoch::next`), and a cancel (`Shared::wake`,
    /// from dropping the epoch, starting the next one over a forgotten one,
    /// or dropping the loader).
    fn wait_while(&self, mut full: impl FnMut() -> bool) {
        let mut guard = crate::sync::lock(&self.lock);
        while full() {
            guard = crate::sync::wait_counted(&self.cv, guard, |n| n);
        }
    }
}

/// A batch filled on the host, not yet on the device.
#[derive(Debug)]
struct HostBatch {
    buf: HostBuf,
    keys: Vec<String>,
    indices: Vec<usize>,
    skipped: Vec<Skipped>,
}

/// A decode job's result: `None` when the epoch was cancelled meanwhile.
#[derive(Debug)]
struct Filled {
    index: usize,
    result: Option<Result<HostBatch>>,
}

/// Messages to the uploader, in the order the feeder sends them. Each
/// carries its epoch's generation (one per `Loader::epoch_from` call), so a
/// late message of an epoch that was forgotten (`mem::forget`) is never
/// taken for the running one's.
#[derive(Debug)]
enum Msg {
    Begin {
        gen: u64,
        out: Sender<Result<Pending>>,
        first: usize,
        cancel: Arc<AtomicBool>,
    },
    Done(u64, Filled),
    End {
        gen: u64,
        dispatched: usize,
    },
    /// The rest of the epoch is direct: once `dispatched` batches are
    /// through, its channel goes to `inbox` ([`direct`]).
    Handover {
        gen: u64,
        dispatched: usize,
        inbox: Arc<direct::Inbox>,
    },
}

/// The uploader's acknowledgements: the newest generation whose dispatched
/// batches are all back (`u64::MAX` once the uploader has exited). A
/// condition variable, not a channel: an acknowledgement nobody waits for
/// (a forgotten epoch's) can neither block the uploader nor be mistaken
/// for a later epoch's.
#[derive(Debug, Default)]
struct Acks {
    done: Mutex<u64>,
    cv: std::sync::Condvar,
}

impl Acks {
    fn ack(&self, gen: u64) {
        let mut done = crate::sync::lock(&self.done);
        *done = (*done).max(gen);
        self.cv.notify_all();
    }

    /// Blocks until generation `gen` (or any later one) is acknowledged.
    fn wait(&self, gen: u64) {
        let mut done = crate::sync::lock(&self.done);
        while *done < gen {
            done = self.cv.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Acknowledges everything when the uploader thread ends, however it ends.
struct AckOnExit<'a>(&'a Acks);

impl Drop for AckOnExit<'_> {
    fn drop(&mut self) {
        self.0.ack(u64::MAX);
    }
}

/// Runs `f` (user code on a loader thread), turning a panic into an error
/// naming `what`.
fn caught<T>(what: String, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(Error::WorkerPanic {
            key: what,
            message: panic_message(payload.as_ref()),
        })
    })
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// `Source::key(index)`, or `#index` when the user's `key` panics too (it
/// is asked for on the error path, where a source that panicked in `read`
/// often panics again).
fn safe_key(shared: &Shared, index: usize) -> String {
    catch_unwind(AssertUnwindSafe(|| shared.source.key(index)))
        .unwrap_or_else(|_| format!("#{index}"))
}
