//! What the training loop holds: the epoch iterator and its batches.

use super::loader::Loader;
use crate::cache::Cache;
use crate::device::{Guard, Guards, Ready};
use crate::error::{Error, Result};
use crate::fields::Schema;
use crate::state::{Identity, LoaderState, Position};
use crate::stats::trace::LANE_CONSUMER;
use crate::stats::Stats;
use candle_core::Tensor;
use crossbeam_channel::Receiver;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A sample left out under [`BadSamples::Skip`](crate::BadSamples::Skip).
#[derive(Debug)]
pub struct Skipped {
    /// The sample's key (its path for file-backed sources).
    pub key: String,
    /// Why it was left out.
    pub error: Error,
}

/// One batch, on the loader's device: one tensor per field of the
/// loader's map, `[n, ..field shape]`, by name ([`get`](Self::get)).
///
/// The built-in image map's fields are [`images`](Self::images) and
/// [`labels`](Self::labels).
#[derive(Debug)]
pub struct Batch {
    /// The fields' tensors, in schema order, then the views'.
    pub(super) fields: Vec<Tensor>,
    pub(super) schema: Arc<Schema>,
    /// The key of every sample, in batch order.
    pub keys: Vec<String>,
    /// The source index of every sample, in batch order.
    pub indices: Vec<usize>,
    /// Position of the batch in this rank's epoch.
    pub index: usize,
    /// Samples of this batch left out under [`BadSamples::Skip`](crate::BadSamples::Skip).
    pub skipped: Vec<Skipped>,
    /// After the loader's last write to the batch on the device.
    pub(super) ready: Ready,
    /// The loader's position after this batch, and its identity.
    pub(super) after: Position,
    pub(super) identity: Arc<Identity>,
}

impl Batch {
    /// Makes the calling thread's stream of the batch's device wait until
    /// the loader's writes to the batch are done. [`Epoch::next`] already
    /// did this on the thread that called it; call it on another thread
    /// that uses the batch's tensors when that thread has a stream of its
    /// own (`Device::new_cuda` gives each thread its own default stream).
    /// Does nothing on the CPU and Metal.
    pub fn wait_ready_on_current_stream(&self) -> Result<()> {
        self.ready.wait_on_current_stream()
    }

    /// The loader's state after this batch: save it with a checkpoint
    /// taken after the step that used the batch, and a loader built with
    /// [`LoaderBuilder::resume`](crate::LoaderBuilder::resume) goes on
    /// with the batch after it.
    pub fn state(&self) -> LoaderState {
        self.after.state(&self.identity)
    }

    /// Field (or view) `name`'s tensor, or an error listing the batch's
    /// fields.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.schema
            .tensor(name)
            .map(|i| &self.fields[i])
            .ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "the batch has no field {name:?}; its fields are {:?}",
                    self.schema.names()
                ))
            })
    }

    /// The built-in image map's images: `u8 [n, h, w, 3]`, or floats
    /// `[n, 3, h, w]` (`f32`, `bf16` or `f16`), as the loader's
    /// [`Output`](crate::Output) says. An error under a map without an
    /// `images` field.
    pub fn images(&self) -> Result<&Tensor> {
        self.get("images")
    }

    /// The built-in image map's `u32 [n]` class indices. An error under a
    /// map without a `labels` field.
    pub fn labels(&self) -> Result<&Tensor> {
        self.get("labels")
    }

    /// The fields' names and tensors, in schema order, then the views'.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        let fields = self.schema.fields.iter().map(|f| f.field.name.as_str());
        let views = self.schema.views.iter().map(|v| v.view.name.as_str());
        fields.chain(views).zip(&self.fields)
    }

    /// The fields' tensors, taken out of the batch, in schema order, then
    /// the views'.
    pub fn into_tensors(self) -> Vec<Tensor> {
        self.fields
    }

    /// Number of samples in the batch.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether every sample of the batch was skipped.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A batch between the uploader and [`Epoch::next`]. One that is dropped
/// undelivered (the epoch was dropped, or the channel with it) is waited
/// for first: its tensors were allocated on the loader's stream and are
/// freed on the dropping thread's, which nothing else orders after the
/// loader's writes ([`Guard::Undelivered`]).
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) batch: Option<Batch>,
    pub(super) guards: Guards,
}

impl Pending {
    pub(super) fn take(mut self) -> Batch {
        self.batch.take().expect("a pending batch is taken once")
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let (Some(b), true) = (&self.batch, self.guards.on(Guard::Undelivered)) {
            let _ = b.ready.host_wait();
        }
    }
}

/// The batches of one epoch, in order: an [`ExactSizeIterator`] of
/// `Result<Batch>`.
///
/// A batch with a bad sample is an `Err` under [`BadSamples::Fail`](crate::BadSamples::Fail); the
/// iterator goes on with the next batch, so `?` stops the epoch while a
/// tolerant loop can carry on. Dropping the epoch early cancels the decode
/// work still queued and returns once the loader's threads are idle.
#[derive(Debug)]
pub struct Epoch<'a> {
    pub(super) loader: &'a mut Loader,
    pub(super) epoch: u64,
    /// The next batch to deliver, and the samples planned before each
    /// batch ([`Position::new`]).
    pub(super) next: usize,
    pub(super) before: Arc<crate::order::sampler::Before>,
    pub(super) rx: Option<Receiver<Result<Pending>>>,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) gen: u64,
    pub(super) remaining: usize,
    pub(super) expected: usize,
}

impl Epoch<'_> {
    /// The loader's counters, as [`Loader::stats`].
    pub fn stats(&self) -> Stats {
        self.loader.stats()
    }

    /// The loader's state after the batches taken so far, as
    /// [`Loader::state`].
    pub fn state(&self) -> LoaderState {
        self.loader.state()
    }
}

impl Iterator for Epoch<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        let t = Instant::now();
        let got = self.rx.as_ref().map(|rx| {
            let ready = rx.len();
            (rx.recv(), ready)
        });
        match got {
            Some((Ok(item), ready)) => {
                let shared = &self.loader.shared;
                let first = self.remaining == self.expected;
                shared.counters.consumer_waited(t.elapsed(), ready, first);
                if let Some(trace) = &shared.trace {
                    trace.record("wait for batch", LANE_CONSUMER, t, Instant::now());
                }
                // The cache, the timeline, the records read ahead, the
                // remote-object cache, shard blocks' chunks and what the
                // source holds (decoded Parquet row groups) count in the
                // RAM budget.
                let cache = shared.cache.as_ref().map_or(0, Cache::memory)
                    + shared.trace.as_ref().map_or(0, |t| t.memory())
                    + shared.readahead.as_ref().map_or(0, |r| r.memory())
                    + shared.spans.as_ref().map_or(0, |s| s.memory())
                    + crate::storage::cache_memory()
                    + shared.source.memory();
                // On the direct hand-over a worker runs a whole batch on a
                // buffer of its own: workers past the batches in flight idle.
                // Asked only when a window closes.
                let direct = || crate::sync::lock(&shared.direct).is_some();
                shared
                    .tuner
                    .on_batch(&shared.knobs, &shared.counters, (cache, &direct), &|n| {
                        shared.pool.set_capacity(n)
                    });
                self.remaining -= 1;
                // A place in the prefetch queue, at the depth now chosen.
                shared.room.notify();
                shared.make_room(self.gen);
                // The consumer's stream waits for the loader's writes, on
                // the consumer's thread ([`Guard::Ready`]).
                let guards = shared.uploader.guards();
                // Every batch taken, an `Err` one too, moves the position.
                self.next += 1;
                let after = Position::new(self.epoch, self.next, &self.before);
                self.loader.position = after;
                Some(item.and_then(|p| {
                    let mut batch = p.take();
                    batch.after = after;
                    if guards.on(Guard::Ready) {
                        if let Err(e) = batch.ready.wait_on_current_stream() {
                            // Dropped undelivered after all: wait for it.
                            let _ = batch.ready.host_wait();
                            return Err(e);
                        }
                    }
                    Ok(batch)
                }))
            }
            _ => {
                let delivered = self.expected - self.remaining;
                self.remaining = 0;
                Some(Err(Error::PipelineStopped {
                    delivered,
                    expected: self.expected,
                }))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Epoch<'_> {}

impl Drop for Epoch<'_> {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
        self.loader.shared.wake();
        if self.rx.take().is_some() {
            // The uploader acknowledges once every dispatched batch is back.
            self.loader.acks.wait(self.gen);
        }
        self.loader.shared.counters.epoch_ended();
    }
}
