//! The loader's threads: started once by `build`, given one epoch at a
//! time, stopped and joined on drop.

use super::builder::LoaderBuilder;
use super::epoch::Epoch;
use super::feed::{feed, EpochCmd, RecordIter};
use super::upload::upload_loop;
use super::{AckOnExit, Acks, Msg, Shared};
use crate::contract::Source;
use crate::error::{Error, Result};
use crate::order::sampler::{Plan, Sampler};
use crate::order::stream::StreamPlanner;
use crate::read::retry::Retry;
use crate::state::{shard_table, LoaderState, Position};
use crate::stats::trace::Trace;
use crate::stats::Stats;
use crate::transform::ImageTransform;
use crate::tune::TuneStep;
use crossbeam_channel::{bounded, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// How epochs are ordered: a sampler over random access, or shard streams.
#[derive(Debug)]
pub(super) enum Order {
    Sampled(Sampler),
    Stream(StreamPlanner),
}

impl Order {
    /// The batches of `epoch` from sample `from` of its order on (random
    /// access; the streaming mode always plans whole epochs, `from` 0).
    fn plan(&self, epoch: u64, from: u64) -> Plan {
        match self {
            Order::Sampled(s) => s.plan(epoch, from),
            Order::Stream(s) => s.plan(epoch),
        }
    }

    /// Where a loader built from `state` (checked already) goes on. Random
    /// access: at the saved batch when this world size planned it (the
    /// uninterrupted run's batches and numbering), else the rest of the
    /// epoch planned from the samples all ranks had taken (elastic resume).
    pub(super) fn resume_at(&self, state: &LoaderState) -> Result<Position> {
        let at = Position {
            epoch: state.epoch,
            batch: state.batch,
            samples: state.samples,
            from: 0,
        };
        match self {
            Order::Stream(_) => Ok(at),
            Order::Sampled(s) => {
                let same = s.plan(state.epoch, 0).before.get(state.batch) == Some(state.samples);
                if same {
                    return Ok(at);
                }
                s.check_from(state.samples)?;
                let rest = s.plan(state.epoch, state.samples);
                Ok(Position::new(state.epoch, 0, &rest.before))
            }
        }
    }
}

/// Join handles of the decode pool's threads.
pub(super) type DecodeThreads = Arc<Mutex<Vec<JoinHandle<()>>>>;

/// A parallel, prefetching loader of image batches. See the crate docs.
#[derive(Debug)]
pub struct Loader {
    pub(super) shared: Arc<Shared>,
    pub(super) order: Order,
    pub(super) cmd: Option<Sender<EpochCmd>>,
    pub(super) acks: Arc<Acks>,
    /// The generation of the newest epoch, and its cancel flag.
    pub(super) gen: u64,
    pub(super) current: Option<Arc<AtomicBool>>,
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) decode_pool: Option<Arc<rayon::ThreadPool>>,
    pub(super) decode_threads: DecodeThreads,
    pub(super) prefetch: usize,
    /// The next batch the consumer gets ([`state`](Self::state)).
    pub(super) position: Position,
    /// The position a resumed loader was built at, until its first epoch
    /// is asked for: [`epoch`](Self::epoch) of that epoch resumes there.
    pub(super) resumed: Option<Position>,
}

impl Loader {
    /// Starts configuring a loader over `source`.
    ///
    /// ```no_run
    /// # fn main() -> candle_wick::Result<()> {
    /// use candle_wick::source::ImageFolder;
    /// use candle_wick::Loader;
    /// let mut loader = Loader::builder(ImageFolder::new("data/train")?)
    ///     .batch_size(64)
    ///     .image_size(224)
    ///     .train_transforms()
    ///     .shuffle(42)
    ///     .build()?;
    /// for batch in loader.epoch(0) {
    ///     let batch = batch?;
    ///     println!("{:?} {:?}", batch.images()?.shape(), batch.labels()?.shape());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn builder(source: impl Source) -> LoaderBuilder {
        LoaderBuilder::new(Arc::new(source))
    }

    pub(super) fn start(
        shared: Arc<Shared>,
        order: Order,
        workers: usize,
        in_flight: usize,
        prefetch: usize,
        position: Position,
    ) -> Result<Self> {
        // Spawning the pool's threads ourselves keeps their handles, so
        // dropping the loader can join them (rayon's own drop does not wait).
        let handles: DecodeThreads = Arc::default();
        let spawned = handles.clone();
        let decode_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .spawn_handler(move |thread| {
                let handle = std::thread::Builder::new()
                    .name(format!("wick-decode-{}", thread.index()))
                    .spawn(|| {
                        // Token files' guard needs SIGBUS deliverable here.
                        crate::storage::mmap::unblock();
                        thread.run()
                    })?;
                crate::sync::lock(&spawned).push(handle);
                Ok(())
            })
            .build()
            .map_err(|e| Error::ThreadPool {
                source: Box::new(e),
            })?;
        let decode_pool = Arc::new(decode_pool);
        // Jobs deferred at the worker gate start again on this pool.
        shared.knobs.gate.set_pool(&decode_pool);
        // Begin, one message per batch in flight, End. A `Done` with a
        // batch holds a pool buffer, so those are bounded by the pool; a
        // failed or cancelled batch's `Done` holds none, and under
        // `BadSamples::Fail` a run of them can fill the channel and block a
        // worker in `send`. That never deadlocks: the uploader waits for
        // neither workers nor feeder, its own sends give up once the epoch
        // is cancelled, and no worker holds a gate pass while it sends.
        let (done_tx, done_rx) = bounded::<Msg>(in_flight + 2);
        let (cmd_tx, cmd_rx) = bounded::<EpochCmd>(1);
        let acks = Arc::new(Acks::default());
        let mut loader = Loader {
            shared: shared.clone(),
            order,
            cmd: Some(cmd_tx),
            acks: acks.clone(),
            gen: 0,
            current: None,
            threads: Vec::new(),
            decode_pool: Some(decode_pool.clone()),
            decode_threads: handles,
            prefetch,
            position,
            resumed: (position != Position::default()).then_some(position),
        };
        let (feeder_shared, feeder_acks) = (shared.clone(), acks.clone());
        loader.spawn("wick-feed", move || {
            feed(
                &feeder_shared,
                &decode_pool,
                &cmd_rx,
                &done_tx,
                &feeder_acks,
            );
        })?;
        loader.spawn("wick-upload", move || {
            let _exit = AckOnExit(&acks);
            upload_loop(&shared, &done_rx, &acks)
        })?;
        Ok(loader)
    }

    fn spawn(&mut self, name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map_err(|source| Error::Spawn {
                name: name.into(),
                source,
            })?;
        self.threads.push(handle);
        Ok(())
    }

    /// The batches of epoch `epoch`, in order. See [`Epoch`].
    ///
    /// On a loader built with
    /// [`LoaderBuilder::resume`](crate::LoaderBuilder::resume), the first
    /// call for the saved epoch resumes where the state says (as
    /// [`next_epoch`](Self::next_epoch)), so a loop `for e in start..n {
    /// loader.epoch(e) }` does not train the saved epoch's first batches
    /// again; [`epoch_from(e, 0)`](Self::epoch_from) restarts it on purpose.
    pub fn epoch(&mut self, epoch: u64) -> Epoch<'_> {
        match self.resumed {
            Some(p) if p.epoch == epoch => self.epoch_at(epoch, p.from, p.batch),
            _ => self.epoch_at(epoch, 0, 0),
        }
    }

    /// The batches from the loader's position on ([`state`](Self::state)):
    /// the rest of the epoch the consumer was in when it stopped taking
    /// batches, or the next epoch after one it finished; after
    /// [`LoaderBuilder::resume`](crate::LoaderBuilder::resume), the batches
    /// the saved run would have yielded next. A resumable training loop:
    ///
    /// ```no_run
    /// # fn main() -> candle_wick::Result<()> {
    /// # let saved: Option<candle_wick::LoaderState> = None;
    /// # let source = candle_wick::source::ImageFolder::new("data/train")?;
    /// let mut builder = candle_wick::Loader::builder(source).shuffle(42);
    /// if let Some(state) = saved {
    ///     builder = builder.resume(state);
    /// }
    /// let mut loader = builder.build()?;
    /// while loader.state().epoch < 90 {
    ///     for batch in loader.next_epoch() {
    ///         let batch = batch?;
    ///         // ... a training step; then, to checkpoint, keep
    ///         // `batch.state()` (serde) with the model's weights.
    ///         # let _ = batch.state();
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn next_epoch(&mut self) -> Epoch<'_> {
        let Position {
            epoch, batch, from, ..
        } = self.position;
        self.epoch_at(epoch, from, batch)
    }

    /// Where the loader is: the next batch [`next_epoch`](Self::next_epoch)
    /// yields (the one after the last batch the consumer took), with what
    /// decides which batch that is. Save it (serde) to resume the run
    /// later, in this process or another, with
    /// [`LoaderBuilder::resume`](crate::LoaderBuilder::resume). While an
    /// epoch is being iterated, [`Epoch::state`] and
    /// [`Batch::state`](crate::Batch::state) give the same.
    pub fn state(&self) -> LoaderState {
        self.position.state(&self.shared.identity)
    }

    /// The batches of epoch `epoch` from batch `start` on, to resume an
    /// interrupted epoch: they equal the batches a full run yields from
    /// there. A `start` past the end gives an empty epoch.
    pub fn epoch_from(&mut self, epoch: u64, start: usize) -> Epoch<'_> {
        self.epoch_at(epoch, 0, start)
    }

    /// Batch `start` on of `epoch`'s plan from sample `from` of its order.
    fn epoch_at(&mut self, epoch: u64, from: u64, start: usize) -> Epoch<'_> {
        self.resumed = None;
        let plan = self.order.plan(epoch, from);
        let total = plan.len();
        let before = Arc::new(plan.before.clone());
        self.position = Position::new(epoch, start, &before);
        let cancel = Arc::new(AtomicBool::new(false));
        let stream = match &self.order {
            Order::Stream(s) => {
                let shared = self.shared.clone();
                let retry = Retry {
                    retries: self.shared.retries,
                    cancel: cancel.clone(),
                    on_retry: Arc::new(move || shared.counters.read_retried()),
                };
                // Resumed: the records of the batches before `start` are
                // not read again.
                let mut consumed: Vec<usize> =
                    (0..start.min(total)).flat_map(|k| plan.batch(k)).collect();
                consumed.sort_unstable();
                Some(RecordIter(Box::new(crate::read::stream::records(
                    s,
                    epoch,
                    self.shared.source.clone(),
                    self.shared.parts.clone(),
                    retry,
                    consumed.into(),
                ))))
            }
            Order::Sampled(_) => None,
        };
        let start = start.min(total);
        let (out_tx, out_rx) = bounded(self.prefetch);
        // An earlier epoch still running was forgotten (`mem::forget`; a
        // dropped one is cancelled already): stop it, or its batches would
        // hold the pool and the uploader.
        if let Some(old) = self.current.take() {
            old.store(true, Ordering::Release);
            self.shared.wake();
        }
        self.current = Some(cancel.clone());
        self.gen += 1;
        let cmd = EpochCmd {
            epoch,
            gen: self.gen,
            plan,
            stream,
            start,
            cancel: cancel.clone(),
            out: out_tx,
        };
        let started = self.cmd.as_ref().is_some_and(|c| c.send(cmd).is_ok());
        self.shared.counters.epoch_started();
        Epoch {
            epoch,
            next: start,
            before,
            remaining: total - start,
            expected: total - start,
            rx: started.then_some(out_rx),
            cancel,
            gen: self.gen,
            loader: self,
        }
    }

    /// A fingerprint of what every rank must agree on: the source's length,
    /// shard table (file names and record counts, so a rank that skipped a
    /// damaged shard tail differs) and checksum
    /// ([`Source::digest`](crate::Source::digest)), batches per epoch,
    /// batch geometry and shuffle seed. Equal on every rank of a data-parallel job that
    /// sees the same data with the same settings, whatever the rank: gather
    /// it across ranks before training and stop if they differ (unequal
    /// batch counts hang an all-reduce).
    pub fn fingerprint(&self) -> u32 {
        let s = &self.shared;
        // The shuffle seed decides the ranks' shares; the augmentation
        // seed does not (the per-sample streams are keyed by the global
        // index), so ranks may differ in it.
        let mut text = format!(
            "wick-plan-v4 len {} batches {} batch {} shuffle {:?} digest {:08x}",
            s.source.len(),
            self.len(),
            s.schema.batch,
            s.identity.shuffle_seed,
            s.identity.source_digest,
        );
        for f in &s.schema.fields {
            let f = &f.field;
            text.push_str(&format!(" field {} {:?} {:?}", f.name, f.dtype, f.shape));
        }
        text.push_str(&format!(" shards {:08x}", shard_table(&*s.source)));
        crc32c::crc32c(text.as_bytes())
    }

    /// Batches per epoch for this rank. In the streaming mode with several
    /// ranks the count can change from epoch to epoch (shards are dealt
    /// anew); this is epoch 0's, and [`Epoch::len`] is exact.
    pub fn len(&self) -> usize {
        match &self.order {
            Order::Sampled(s) => s.num_batches(),
            Order::Stream(s) => s.num_batches(0),
        }
    }

    /// Whether an epoch has no batch (never true for a built loader: an
    /// empty source is rejected by `build`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This rank's batches of `epoch`, as source indices, in the order the
    /// loader yields them.
    pub fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        self.order.plan(epoch, 0).batch_indices()
    }

    /// The built-in image map's transform (for benchmarks; not part of the
    /// API); `None` under a user map.
    #[doc(hidden)]
    pub fn transform(&self) -> Option<&ImageTransform> {
        self.shared.transform.as_ref()
    }

    /// Decode workers active now (AUTOTUNE may change it between batches).
    pub fn workers(&self) -> usize {
        self.shared.knobs.gate.limit()
    }

    /// Batches in flight and prefetch depth now.
    pub fn queue_depths(&self) -> (usize, usize) {
        let k = &self.shared.knobs;
        (
            k.in_flight.load(Ordering::Relaxed),
            k.prefetch.load(Ordering::Relaxed),
        )
    }

    /// The decisions AUTOTUNE took so far, in order.
    pub fn autotune_history(&self) -> Vec<TuneStep> {
        self.shared.tuner.history()
    }

    /// The timeline, when built with [`LoaderBuilder::trace`]. Take it
    /// before iterating an epoch to add training steps with [`Trace::span`](crate::stats::Trace::span).
    pub fn trace(&self) -> Option<Arc<Trace>> {
        self.shared.trace.clone()
    }

    /// Counters summed over every epoch run so far.
    pub fn stats(&self) -> Stats {
        for (time, bytes) in self.shared.uploader.finished_copies() {
            self.shared.counters.batch_copied(time, bytes);
        }
        let mut stats = self.shared.counters.snapshot();
        stats.pinned_buffers = self.shared.pool.kept();
        stats.read_ahead = self.shared.readahead.as_ref().map_or(0, |r| r.depth());
        stats.step_slowdown = self
            .shared
            .tuner
            .step_slowdown()
            .map(|(ratio, workers, step)| crate::stats::StepSlowdown {
                ratio,
                workers,
                step: std::time::Duration::from_secs_f64(step),
            });
        let scratch = &self.shared.knobs.budget.scratch;
        (stats.decode_scratches, stats.decode_scratch_bytes) = (scratch.count(), scratch.memory(0));
        stats
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the command channel ends the feeder, whose end closes the
        // uploader's input; then the decode pool's threads are told to exit.
        // An epoch still running was forgotten: stop it first.
        if let Some(c) = self.current.take() {
            c.store(true, Ordering::Release);
            self.shared.wake();
        }
        self.cmd.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The feeder held the other reference to the pool; dropping the
        // last one tells its threads to exit once idle.
        self.decode_pool.take();
        let handles = std::mem::take(&mut *crate::sync::lock(&self.decode_threads));
        for t in handles {
            let _ = t.join();
        }
    }
}
