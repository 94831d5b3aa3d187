//! The loader: builder, long-lived threads, and the per-epoch iterator.
//!
//! Threads, created once per [`Loader`]:
//! - `wick-feed`: walks the epoch's batches in order, takes a buffer from the
//!   pool for each (blocking when none is free) and hands the batch to the
//!   decode pool. In the streaming mode it also reads the batch's records
//!   from the shards, sequentially.
//! - `wick-decode-{i}`: the loader's own rayon pool; the samples of a batch
//!   are read, decoded and transformed in parallel straight into their slots.
//! - `wick-upload`: puts finished batches back in batch order, turns each
//!   into device tensors and sends it into a bounded channel of `prefetch`
//!   batches that [`Epoch`] reads.

use crate::autotune::{Auto, Knobs, TuneStep, Tuner, MAX_QUEUE};
use crate::cache::{Cache, CacheMode};
use crate::device::{Finish, Geometry, Guard, Guards, NormalizeAt, Ready};
use crate::error::{Error, Result};
use crate::pool::{HostBuf, Pool};
use crate::sampler::{Plan, Sampler};
use crate::source::{Record, Source};
use crate::stats::{Counters, Stats};
use crate::stream::{Interleave, StreamPlanner, Streamed};
use crate::trace::{Trace, LANE_CONSUMER, LANE_DECODE, LANE_FEED, LANE_UPLOAD};
use crate::transform::{ImageTransform, Output, Slot, Transforms};
use candle_core::{DType, Device, Tensor};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to do with a sample that cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadSamples {
    /// The batch holding it is an `Err` naming the file (the default).
    #[default]
    Fail,
    /// Leave the sample out: its batch is one shorter, the sample is listed
    /// in [`Batch::skipped`] and counted in [`Stats::skipped`].
    ///
    /// Every rank still gets the same number of batches (data-parallel
    /// ranks step together), so a batch whose samples were all bad is
    /// yielded **empty**: test [`Batch::is_empty`] and skip that step's loss
    /// (a mean over no samples is NaN, which an all-reduce spreads to every
    /// rank), but keep stepping in lockstep.
    Skip,
}

/// A sample left out under [`BadSamples::Skip`].
#[derive(Debug)]
pub struct Skipped {
    /// The sample's key (its path for file-backed sources).
    pub key: String,
    /// Why it was left out.
    pub error: Error,
}

/// One batch, on the loader's device.
#[derive(Debug)]
pub struct Batch {
    /// `u8 [n, h, w, 3]` or `f32 [n, 3, h, w]`, as the loader's [`Output`] says.
    pub images: Tensor,
    /// `u32 [n]` class indices.
    pub labels: Tensor,
    /// The key of every image, in batch order.
    pub keys: Vec<String>,
    /// The source index of every image, in batch order.
    pub indices: Vec<usize>,
    /// Position of the batch in this rank's epoch.
    pub index: usize,
    /// Samples of this batch left out under [`BadSamples::Skip`].
    pub skipped: Vec<Skipped>,
    /// After the loader's last write to the batch on the device.
    ready: Ready,
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

    /// Number of images in the batch.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether every sample of the batch was skipped.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Which geometric transforms the builder was asked for.
#[derive(Debug, Clone, Copy)]
enum TransformChoice {
    Train,
    Eval,
    Custom(Transforms),
}

/// Configures a [`Loader`]; see [`Loader::builder`].
#[derive(Debug)]
pub struct LoaderBuilder {
    source: Arc<dyn Source>,
    batch_size: usize,
    workers: usize,
    prefetch: usize,
    in_flight: usize,
    shuffle: Option<u64>,
    seed: Option<u64>,
    drop_last: bool,
    size: (usize, usize),
    transforms: TransformChoice,
    output: Output,
    device: Device,
    shard: Option<(usize, usize)>,
    bad_samples: BadSamples,
    normalize_at: NormalizeAt,
    dtype: Option<DType>,
    interleave: Option<Interleave>,
    shuffle_buffer: Option<usize>,
    ram_budget: Option<u64>,
    trace: bool,
    cache: Option<(CacheMode, Option<PathBuf>)>,
    guards: Guards,
}

impl std::fmt::Debug for dyn Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Source({} samples)", self.len())
    }
}

impl LoaderBuilder {
    /// Samples per batch. Default 32.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Decode workers. Default [`AUTOTUNE`](crate::AUTOTUNE) (`0`): start
    /// with one and add workers while the training loop waits for data and
    /// throughput grows, up to the available cores and within the RAM
    /// budget, giving them back when they buy nothing (so a CPU trainer
    /// keeps its cores). `n > 0` fixes the count.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Batches made into device tensors ahead of the consumer. Default
    /// [`AUTOTUNE`](crate::AUTOTUNE) (`0`): start at 1 and deepen while the
    /// consumer waits and it helps (at most 8). `n > 0` fixes it.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// Host batch buffers being filled or waiting for upload at once: the
    /// memory bound of the decode stage. Default
    /// [`AUTOTUNE`](crate::AUTOTUNE) (`0`): start at 2, grow while it helps
    /// (at most 8). `n > 0` fixes it.
    pub fn batches_in_flight(mut self, n: usize) -> Self {
        self.in_flight = n;
        self
    }

    /// Host memory the loader may hold: batch buffers (in flight,
    /// prefetched, being uploaded and held by the consumer), the decode
    /// workers' scratch and the cache. AUTOTUNE never grows past it and the
    /// cache stops filling at it; `build` fails if the explicit settings
    /// cannot fit. [`Stats::memory_peak`] reports the peak. Default: a
    /// quarter of the memory available when the loader is built.
    ///
    /// A single image larger than the budget still decodes (the decoder's own
    /// limits apply); the budget then keeps every other buffer at its minimum.
    pub fn ram_budget(mut self, bytes: u64) -> Self {
        self.ram_budget = Some(bytes);
        self
    }

    /// Keep every sample after its first read, in memory, so later epochs
    /// skip reading it (and, with [`CacheMode::Decoded`], decoding it);
    /// augmentations still run every epoch. The cache fills during the first
    /// epoch within the RAM budget; samples that do not fit stay uncached
    /// (nothing is evicted, so there is no thrashing). Default: no cache.
    pub fn cache(mut self, mode: CacheMode) -> Self {
        self.cache = Some((mode, None));
        self
    }

    /// Like [`cache`](Self::cache), but in the file `path` (created anew,
    /// outside the RAM budget): for sources slower than the local disk, or
    /// decoded samples that do not fit in memory.
    pub fn cache_to(mut self, path: impl Into<PathBuf>, mode: CacheMode) -> Self {
        self.cache = Some((mode, Some(path.into())));
        self
    }

    /// Record a timeline of every sample's decode, every upload and the
    /// consumer's waits; add training steps with [`Trace::span`] through
    /// [`Loader::trace`], and write it with [`Trace::write_chrome_json`].
    /// Default off.
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// Shuffle every epoch with a permutation drawn from `(seed, epoch)`, and
    /// use `seed` for the augmentations too unless [`seed`](Self::seed)
    /// sets theirs (in either order). Default: source order.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle = Some(seed);
        self
    }

    /// Streaming mode: read the source's shards sequentially,
    /// `cycle_length` at a time, `block_length` records from each in turn
    /// (tf.data's deterministic `interleave`), then through a shuffle buffer
    /// (see [`shuffle_buffer`](Self::shuffle_buffer)). With
    /// [`shuffle`](Self::shuffle) the shard order is reshuffled every epoch;
    /// ranks get whole shards, dealt round robin after the shuffle, and every
    /// rank runs the batch count of the rank with the fewest records.
    /// WebDataset's `shardshuffle=True` + `.shuffle(n)` is
    /// `interleave(1, 1)` + `shuffle_buffer(n)`.
    ///
    /// Needs a sharded source ([`crate::TfRecord`], [`crate::WebDataset`],
    /// [`crate::SafetensorsShards`]); compressed TFRecords can only be read
    /// this way. Default: random access, where the whole epoch is one
    /// permutation (a better shuffle when the storage allows random reads).
    pub fn interleave(mut self, cycle_length: usize, block_length: usize) -> Self {
        self.interleave = Some(Interleave {
            cycle_length,
            block_length,
        });
        self
    }

    /// Records held in the streaming mode's shuffle buffer (their encoded
    /// bytes stay in memory). Default 1,024 when shuffling; ignored without
    /// [`shuffle`](Self::shuffle). Needs [`interleave`](Self::interleave).
    pub fn shuffle_buffer(mut self, records: usize) -> Self {
        self.shuffle_buffer = Some(records);
        self
    }

    /// Seed of the augmentation draws. Default: the seed given to
    /// [`shuffle`](Self::shuffle), or 0 without shuffling. The order of the
    /// two calls does not matter.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Drop the short last batch (and, when sharded, any tail that cannot
    /// give every rank a full batch). Default `false`: with random access
    /// every sample is used every epoch. In the streaming mode with several
    /// ranks an epoch stops at the batch count every rank's shards fill;
    /// the records a rank holds beyond it are read in other epochs, which
    /// deal the shards differently (reshuffled with a seed, rotated by one
    /// shard per epoch without).
    pub fn drop_last(mut self, yes: bool) -> Self {
        self.drop_last = yes;
        self
    }

    /// Output images are `size x size`. Default 224.
    pub fn image_size(mut self, size: usize) -> Self {
        self.size = (size, size);
        self
    }

    /// Output images are `height x width`. Default 224 x 224.
    pub fn image_size_hw(mut self, height: usize, width: usize) -> Self {
        self.size = (height, width);
        self
    }

    /// torchvision's training augmentation: [`Transforms::train`].
    pub fn train_transforms(mut self) -> Self {
        self.transforms = TransformChoice::Train;
        self
    }

    /// torchvision's evaluation transform for the image size:
    /// [`Transforms::eval`]. This is the default.
    pub fn eval_transforms(mut self) -> Self {
        self.transforms = TransformChoice::Eval;
        self
    }

    /// Any [`Transforms`].
    pub fn transforms(mut self, t: Transforms) -> Self {
        self.transforms = TransformChoice::Custom(t);
        self
    }

    /// Element type and layout of the images. Default [`Output::imagenet`]:
    /// `f32` NCHW normalized with ImageNet's mean and std.
    pub fn output(mut self, output: Output) -> Self {
        self.output = output;
        self
    }

    /// Device of the batch tensors. Default [`Device::Cpu`].
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Use only shard `rank` of `world_size` (data-parallel training).
    /// Default: the `RANK` and `WORLD_SIZE` environment variables when both
    /// are set, as torchrun sets them, one shard when neither is, and an
    /// error from `build` when only one is.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.shard = Some((rank, world_size));
        self
    }

    /// Where [`Output::F32Nchw`] normalization happens. Default
    /// [`NormalizeAt::Auto`]: on the device for GPUs (u8 crosses the bus, 4x
    /// fewer bytes than f32), on the host for the CPU.
    pub fn normalize_at(mut self, at: NormalizeAt) -> Self {
        self.normalize_at = at;
        self
    }

    /// Element type of the image tensors for [`Output::F32Nchw`]: `F32`
    /// (default), `BF16` or `F16`, converted on the device.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Policy for unreadable or undecodable samples. Default [`BadSamples::Fail`].
    pub fn bad_samples(mut self, policy: BadSamples) -> Self {
        self.bad_samples = policy;
        self
    }

    /// Test-only: removes one ordering guard of the device upload, so a GPU
    /// test can show that it catches the guard's absence. Batches may then
    /// be wrong: never use it outside such a test.
    #[doc(hidden)]
    pub fn __without_guard(mut self, guard: crate::__test::Guard) -> Self {
        self.guards = Guards { skip: Some(guard) };
        self
    }

    /// Validates the settings, starts the loader's threads and returns it.
    pub fn build(self) -> Result<Loader> {
        if self.source.is_empty() {
            return Err(Error::InvalidConfig("the source has no samples".into()));
        }
        let (rank, world_size) = match self.shard {
            Some(s) => s,
            None => shard_from_env()?,
        };
        let order = match self.interleave {
            Some(il) => Order::Stream(StreamPlanner::new(
                self.source.shards(),
                self.batch_size,
                self.shuffle,
                self.drop_last,
                (rank, world_size),
                il,
                self.shuffle_buffer.unwrap_or(1024),
            )?),
            None if self.shuffle_buffer.is_some() => {
                return Err(Error::InvalidConfig(
                    "shuffle_buffer applies to the streaming mode: set interleave(..) too".into(),
                ))
            }
            None => Order::Sampled(Sampler::new(
                self.source.len(),
                self.batch_size,
                self.shuffle,
                self.drop_last,
                rank,
                world_size,
            )?),
        };
        let (h, w) = self.size;
        let transforms = match self.transforms {
            TransformChoice::Train => Transforms::train(),
            TransformChoice::Eval => Transforms::eval(h.max(w)),
            TransformChoice::Custom(t) => t,
        };
        let finish = Finish::new(self.output, self.normalize_at, self.dtype, &self.device)?;
        let host_output = finish.host_output(self.output);
        let seed = self.seed.or(self.shuffle).unwrap_or(0);
        let transform = ImageTransform::new(transforms, host_output, h, w, seed)?;
        let auto = Auto {
            workers: self.workers == 0,
            in_flight: self.in_flight == 0,
            prefetch: self.prefetch == 0,
        };
        let max_workers = if auto.workers {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.workers
        };
        let pick = |auto: bool, start: usize, n: usize| if auto { start } else { n };
        let workers = pick(auto.workers, 1, self.workers);
        let in_flight = pick(auto.in_flight, 2, self.in_flight);
        let prefetch = pick(auto.prefetch, 1, self.prefetch);
        let elem = match host_output {
            Output::U8Nhwc => 1,
            Output::F32Nchw { .. } => 4,
        };
        let knobs = Knobs {
            gate: crate::autotune::Gate::new(workers),
            in_flight: in_flight.into(),
            prefetch: prefetch.into(),
            max_workers,
            // Pinned buffers hold the labels too.
            batch_bytes: (self.batch_size * transform.slot_len() * elem
                + if self.device.is_cuda() {
                    4 * self.batch_size
                } else {
                    0
                }) as u64,
            pinned: self.device.is_cuda(),
            in_flight_high: in_flight.into(),
            budget: self
                .ram_budget
                .unwrap_or_else(crate::autotune::default_budget),
            scratch: Default::default(),
        };
        if !knobs.fits(in_flight, prefetch, 0, 0) {
            let held = if knobs.pinned {
                format!("{in_flight} page-locked, in flight")
            } else {
                format!("{in_flight} in flight, {prefetch} prefetched, one uploading, one held")
            };
            return Err(Error::InvalidConfig(format!(
                "ram_budget of {} bytes cannot hold {} batches of {} bytes ({held}): raise it or \
                 lower batch_size",
                knobs.budget,
                knobs.memory(in_flight, prefetch, 0, 0) / knobs.batch_bytes.max(1),
                knobs.batch_bytes
            )));
        }
        let counters = Counters::default();
        counters.set_workers(workers);
        counters.set_memory(knobs.memory(in_flight, prefetch, workers, 0));
        let geo = Geometry {
            batch: self.batch_size,
            height: h,
            width: w,
            host_output,
        };
        let guards = self.guards;
        let uploader = crate::device::Uploader::new(&self.device, finish, geo, guards)?;
        // CUDA: page-locked buffers for the batches in flight now, more from
        // the same allocator as AUTOTUNE grows, none freed while it tunes.
        let pinned = crate::device::pinned_alloc(&self.device, geo, guards);
        let shared = Arc::new(Shared {
            pool: Pool::new(in_flight, geo.elems(), host_output, pinned)?,
            tuner: Tuner::new(auto),
            knobs,
            trace: self.trace.then(|| Arc::new(Trace::new())),
            cache: self
                .cache
                .map(|(mode, path)| Cache::new(mode, self.source.len(), path.as_deref()))
                .transpose()?,
            uploader,
            room: Room::default(),
            source: self.source,
            transform,
            geo,
            counters,
            device: self.device,
            bad_samples: self.bad_samples,
        });
        let channel = if auto.prefetch { MAX_QUEUE } else { prefetch };
        let most_in_flight = if auto.in_flight { MAX_QUEUE } else { in_flight };
        Loader::start(shared, order, max_workers, most_in_flight, channel)
    }
}

fn shard_from_env() -> Result<(usize, usize)> {
    let var = |name| std::env::var(name).ok();
    match (var("RANK"), var("WORLD_SIZE")) {
        (Some(r), Some(w)) => match (r.trim().parse(), w.trim().parse()) {
            (Ok(r), Ok(w)) => Ok((r, w)),
            _ => Err(Error::InvalidConfig(format!(
                "RANK={r:?} and WORLD_SIZE={w:?} must be integers (or call shard())"
            ))),
        },
        (None, None) => Ok((0, 1)),
        (r, w) => Err(Error::InvalidConfig(format!(
            "RANK={r:?} and WORLD_SIZE={w:?}: set both (as torchrun does) or neither, or call \
             shard(rank, world_size); with one alone every rank would read the same batches"
        ))),
    }
}

/// What the loader's threads share.
#[derive(Debug)]
struct Shared {
    source: Arc<dyn Source>,
    knobs: Knobs,
    tuner: Tuner,
    trace: Option<Arc<Trace>>,
    cache: Option<Cache>,
    transform: ImageTransform,
    pool: Pool,
    counters: Counters,
    device: Device,
    bad_samples: BadSamples,
    geo: Geometry,
    uploader: crate::device::Uploader,
    /// Signalled when the prefetch queue may have room for the uploader.
    room: Room,
}

impl Shared {
    /// Wakes whatever waits and may have to see a cancel: the feeder in the
    /// pool, the uploader at the prefetch queue.
    fn wake(&self) {
        self.pool.wake();
        self.room.notify();
    }
}

/// Wakes the upload thread when the prefetch queue may have room for the
/// next batch: the consumer took one (and AUTOTUNE may have changed the
/// prefetch depth), or the epoch was cancelled. (It polled every 200 µs
/// while a consumer held the epoch without taking batches.)
#[derive(Debug, Default)]
struct Room {
    lock: Mutex<()>,
    cv: Condvar,
}

impl Room {
    fn notify(&self) {
        let _guard = crate::lock(&self.lock);
        self.cv.notify_all();
    }

    /// Waits while `full()` holds. Every change to what `full` reads is
    /// followed by a `notify` under the lock, so no wake-up is lost; the
    /// timeout is only a backstop (10 Hz, not a poll).
    fn wait_while(&self, mut full: impl FnMut() -> bool) {
        let mut guard = crate::lock(&self.lock);
        while full() {
            guard = match self.cv.wait_timeout(guard, Duration::from_millis(100)) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// A batch filled on the host, not yet on the device.
#[derive(Debug)]
struct HostBatch {
    buf: HostBuf,
    labels: Vec<u32>,
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

/// A batch between the uploader and [`Epoch::next`]. One that is dropped
/// undelivered (the epoch was dropped, or the channel with it) is waited
/// for first: its tensors were allocated on the loader's stream and are
/// freed on the dropping thread's, which nothing else orders after the
/// loader's writes ([`Guard::Undelivered`]).
#[derive(Debug)]
struct Pending {
    batch: Option<Batch>,
    guards: Guards,
}

impl Pending {
    fn take(mut self) -> Batch {
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
        let mut done = crate::lock(&self.done);
        *done = (*done).max(gen);
        self.cv.notify_all();
    }

    /// Blocks until generation `gen` (or any later one) is acknowledged.
    fn wait(&self, gen: u64) {
        let mut done = crate::lock(&self.done);
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

/// How epochs are ordered: a sampler over random access, or shard streams.
#[derive(Debug)]
enum Order {
    Sampled(Sampler),
    Stream(StreamPlanner),
}

impl Order {
    fn plan(&self, epoch: u64) -> Plan {
        match self {
            Order::Sampled(s) => s.plan(epoch),
            Order::Stream(s) => s.plan(epoch),
        }
    }
}

/// The records of a streamed epoch, read by the feeder.
struct RecordIter(Box<dyn Iterator<Item = Streamed> + Send>);

impl std::fmt::Debug for RecordIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordIter")
    }
}

/// A record the feeder read, with the time the read took.
type PreRead = Option<(Result<Record>, Duration)>;

/// An epoch for the feeder thread.
#[derive(Debug)]
struct EpochCmd {
    epoch: u64,
    gen: u64,
    plan: Plan,
    stream: Option<RecordIter>,
    start: usize,
    cancel: Arc<AtomicBool>,
    out: Sender<Result<Pending>>,
}

/// Join handles of the decode pool's threads.
type DecodeThreads = Arc<Mutex<Vec<JoinHandle<()>>>>;

/// A parallel, prefetching loader of image batches. See the crate docs.
#[derive(Debug)]
pub struct Loader {
    shared: Arc<Shared>,
    order: Order,
    cmd: Option<Sender<EpochCmd>>,
    acks: Arc<Acks>,
    /// The generation of the newest epoch, and its cancel flag.
    gen: u64,
    current: Option<Arc<AtomicBool>>,
    threads: Vec<JoinHandle<()>>,
    decode_pool: Option<Arc<rayon::ThreadPool>>,
    decode_threads: DecodeThreads,
    prefetch: usize,
}

impl Loader {
    /// Starts configuring a loader over `source`.
    ///
    /// ```no_run
    /// # fn main() -> candle_wick::Result<()> {
    /// use candle_wick::{ImageFolder, Loader};
    /// let mut loader = Loader::builder(ImageFolder::new("data/train")?)
    ///     .batch_size(64)
    ///     .image_size(224)
    ///     .train_transforms()
    ///     .shuffle(42)
    ///     .build()?;
    /// for batch in loader.epoch(0) {
    ///     let batch = batch?;
    ///     println!("{:?} {:?}", batch.images.shape(), batch.labels.shape());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn builder(source: impl Source) -> LoaderBuilder {
        LoaderBuilder {
            source: Arc::new(source),
            batch_size: 32,
            workers: 0,
            prefetch: 0,
            in_flight: 0,
            shuffle: None,
            seed: None,
            drop_last: false,
            size: (224, 224),
            transforms: TransformChoice::Eval,
            output: Output::imagenet(),
            device: Device::Cpu,
            shard: None,
            bad_samples: BadSamples::Fail,
            normalize_at: NormalizeAt::Auto,
            dtype: None,
            interleave: None,
            shuffle_buffer: None,
            ram_budget: None,
            trace: false,
            cache: None,
            guards: Guards::default(),
        }
    }

    fn start(
        shared: Arc<Shared>,
        order: Order,
        workers: usize,
        in_flight: usize,
        prefetch: usize,
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
                    .spawn(|| thread.run())?;
                crate::lock(&spawned).push(handle);
                Ok(())
            })
            .build()
            .map_err(Error::ThreadPool)?;
        let decode_pool = Arc::new(decode_pool);
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
        };
        let feeder_shared = shared.clone();
        loader.spawn("wick-feed", move || {
            feed(&feeder_shared, &decode_pool, &cmd_rx, &done_tx);
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
    pub fn epoch(&mut self, epoch: u64) -> Epoch<'_> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of epoch `epoch` from batch `start` on, to resume an
    /// interrupted epoch: they equal the batches a full run yields from
    /// there. A `start` past the end gives an empty epoch.
    pub fn epoch_from(&mut self, epoch: u64, start: usize) -> Epoch<'_> {
        let plan = self.order.plan(epoch);
        let total = plan.batches.len();
        let stream = match &self.order {
            Order::Stream(s) => Some(RecordIter(Box::new(
                s.records(epoch, self.shared.source.clone()),
            ))),
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
        let cancel = Arc::new(AtomicBool::new(false));
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
            remaining: total - start,
            expected: total - start,
            rx: started.then_some(out_rx),
            cancel,
            gen: self.gen,
            loader: self,
        }
    }

    /// A fingerprint of what every rank must agree on: the source's length
    /// and shard table (file names and record counts, so a rank that
    /// skipped a damaged shard tail differs), batches per epoch, batch
    /// geometry and seed. Equal on every rank of a data-parallel job that
    /// sees the same data with the same settings, whatever the rank: gather
    /// it across ranks before training and stop if they differ (unequal
    /// batch counts hang an all-reduce).
    pub fn fingerprint(&self) -> u32 {
        let s = &self.shared;
        let mut text = format!(
            "wick-plan-v1 len {} batches {} geo {}x{}x{} seed {}",
            s.source.len(),
            self.len(),
            s.geo.batch,
            s.geo.height,
            s.geo.width,
            s.transform.seed()
        );
        for shard in s.source.shards() {
            let name = shard.path.file_name().unwrap_or(shard.path.as_os_str());
            text.push_str(&format!(
                " | {} {} {}",
                name.to_string_lossy(),
                shard.first,
                shard.records
            ));
        }
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
        let plan = self.order.plan(epoch);
        plan.batches
            .iter()
            .map(|r| plan.order[r.clone()].to_vec())
            .collect()
    }

    /// The per-sample function the workers run.
    pub fn transform(&self) -> &ImageTransform {
        &self.shared.transform
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
    /// before iterating an epoch to add training steps with [`Trace::span`].
    pub fn trace(&self) -> Option<Arc<Trace>> {
        self.shared.trace.clone()
    }

    /// Counters summed over every epoch run so far.
    pub fn stats(&self) -> Stats {
        for (time, bytes) in self.shared.uploader.finished_copies() {
            self.shared.counters.batch_copied(time, bytes);
        }
        let mut stats = self.shared.counters.snapshot();
        stats.pinned_buffers = self.shared.pool.pinned();
        let scratch = &self.shared.knobs.scratch;
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
        let handles = std::mem::take(&mut *crate::lock(&self.decode_threads));
        for t in handles {
            let _ = t.join();
        }
    }
}

/// The batches of one epoch, in order: an [`ExactSizeIterator`] of
/// `Result<Batch>`.
///
/// A batch with a bad sample is an `Err` under [`BadSamples::Fail`]; the
/// iterator goes on with the next batch, so `?` stops the epoch while a
/// tolerant loop can carry on. Dropping the epoch early cancels the decode
/// work still queued and returns once the loader's threads are idle.
#[derive(Debug)]
pub struct Epoch<'a> {
    loader: &'a mut Loader,
    rx: Option<Receiver<Result<Pending>>>,
    cancel: Arc<AtomicBool>,
    gen: u64,
    remaining: usize,
    expected: usize,
}

impl Epoch<'_> {
    /// The loader's counters, as [`Loader::stats`].
    pub fn stats(&self) -> Stats {
        self.loader.stats()
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
                // The cache and the timeline count in the RAM budget.
                let cache = shared.cache.as_ref().map_or(0, Cache::memory)
                    + shared.trace.as_ref().map_or(0, |t| t.memory());
                shared
                    .tuner
                    .on_batch(&shared.knobs, &shared.counters, cache, &|n| {
                        shared.pool.set_capacity(n)
                    });
                self.remaining -= 1;
                // A place in the prefetch queue, at the depth now chosen.
                shared.room.notify();
                // The consumer's stream waits for the loader's writes, on
                // the consumer's thread ([`Guard::Ready`]).
                let guards = shared.uploader.guards();
                Some(item.and_then(|p| {
                    let batch = p.take();
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

/// The feeder thread: one epoch command at a time, batches in order.
fn feed(
    shared: &Arc<Shared>,
    decode_pool: &rayon::ThreadPool,
    cmds: &Receiver<EpochCmd>,
    done: &Sender<Msg>,
) {
    for cmd in cmds {
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
        let mut dispatched = 0;
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
            let skip = plan
                .batches
                .get(..start)
                .map_or(0, |b| b.iter().map(|r| r.len()).sum());
            skipped = caught(format!("the records before batch {start}"), || {
                for _ in 0..skip {
                    if cancel.load(Ordering::Relaxed) || stream.0.next().is_none() {
                        break;
                    }
                }
                Ok(())
            });
        }
        for index in start..plan.batches.len() {
            if cancel.load(Ordering::Relaxed) {
                break;
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
            let n = plan.batches[index].len();
            let table = match SlotTable::new(buf, n, shared.transform.slot_len()) {
                Ok(table) => table,
                Err(failed) => {
                    let (buf, e) = *failed;
                    shared.pool.release(Some(buf));
                    fail(index, e);
                    dispatched += 1;
                    break;
                }
            };
            let job = Arc::new(Filling::new(
                shared.clone(),
                plan.clone(),
                index,
                (epoch, gen),
                cancel.clone(),
                done.clone(),
                table,
                pre,
            ));
            shared.counters.batch_started();
            dispatched += 1;
            if n == 0 {
                job.complete();
            }
            for _ in 0..decode_pool.current_num_threads().min(n) {
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
fn read_batch(
    plan: &Plan,
    index: usize,
    stream: &mut (dyn Iterator<Item = Streamed> + Send),
    cancel: &AtomicBool,
) -> Result<Option<Vec<PreRead>>> {
    let mut records = Vec::with_capacity(plan.batches[index].len());
    for &want in &plan.order[plan.batches[index].clone()] {
        if cancel.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let t = Instant::now();
        match stream.next() {
            Some((got, record)) if got == want => records.push(Some((record, t.elapsed()))),
            _ => {
                return Err(Error::PipelineStopped {
                    delivered: index,
                    expected: plan.batches.len(),
                })
            }
        }
    }
    Ok(Some(records))
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

fn fill_cache(
    shared: &Shared,
    cache: &Cache,
    index: usize,
    record: Record,
) -> Result<Record, (String, Error)> {
    let record = match (cache.mode, record.rgb_size) {
        (CacheMode::Decoded, None) => {
            let mut px = Vec::new();
            match crate::decode::decode_for_cache(&record.key, &record.bytes, &mut px)
                .map_err(|e| (record.key.clone(), e))?
            {
                Some(wh) => {
                    px.truncate(wh.0 * wh.1 * 3);
                    Record {
                        bytes: px,
                        rgb_size: Some(wh),
                        ..record
                    }
                }
                // Kept encoded: decoded every epoch as an uncached run does.
                None => record,
            }
        }
        _ => record,
    };
    let k = &shared.knobs;
    let (f, p, w) = (
        k.in_flight.load(Ordering::Relaxed),
        k.prefetch.load(Ordering::Relaxed),
        k.gate.limit(),
    );
    if cache.put(index, &record, |after| k.fits(f, p, w, after)) {
        shared.counters.cache_stored(record.bytes.len() as u64);
    }
    Ok(record)
}

/// One sample's fate in a batch.
enum Outcome {
    Ok { key: String, label: u32 },
    Failed { key: String, error: Error },
    Cancelled,
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Reads, decodes and transforms sample `index` into `slot`.
/// `Source::key(index)`, or `#index` when the user's `key` panics too (it
/// is asked for on the error path, where a source that panicked in `read`
/// often panics again).
fn safe_key(shared: &Shared, index: usize) -> String {
    catch_unwind(AssertUnwindSafe(|| shared.source.key(index)))
        .unwrap_or_else(|_| format!("#{index}"))
}

fn process(
    shared: &Shared,
    epoch: u64,
    index: usize,
    slot: Slot<'_>,
    cancel: &AtomicBool,
    pre: PreRead,
) -> Outcome {
    if cancel.load(Ordering::Relaxed) {
        return Outcome::Cancelled;
    }
    let _pass = shared.knobs.gate.enter();
    // Again: the wait for a worker slot may have outlasted the epoch.
    if cancel.load(Ordering::Relaxed) {
        return Outcome::Cancelled;
    }
    // Taken after the gate, so the scratch held is the active workers'.
    let mut scratch = shared.knobs.scratch.take(shared.knobs.gate.limit());
    let start = Instant::now();
    let run = || -> Result<(String, u32), (Option<String>, Error)> {
        let t0 = Instant::now();
        // A cache entry that cannot be read back is a miss: the source
        // gives what an uncached run reads (and the error is counted).
        let cached = match shared.cache.as_ref().and_then(|c| c.get(index)) {
            Some(Err(e)) => {
                shared.counters.cache_error(&e);
                None
            }
            hit => hit,
        };
        let hit = cached.is_some();
        let (record, read) = match (cached, pre) {
            (Some(r), _) => {
                shared.counters.cache_hit();
                (r, t0.elapsed())
            }
            (None, Some((record, read))) => (record, read),
            (None, None) => {
                let bytes = scratch.take_read_buffer();
                (shared.source.read_reusing(index, bytes), t0.elapsed())
            }
        };
        let mut record = record.map_err(|e| (None, e))?;
        if let (Some(cache), false) = (&shared.cache, hit) {
            record = fill_cache(shared, cache, index, record).map_err(|(k, e)| (Some(k), e))?;
        }
        let tr = &shared.transform;
        let times = match record.rgb_size {
            None => tr.apply_with(&mut scratch, &record.key, &record.bytes, epoch, index, slot),
            Some(wh) => {
                let t = Instant::now();
                let s = &mut scratch;
                tr.apply_decoded_with(s, &record.key, &record.bytes, wh, epoch, index, slot)
                    .map(|()| crate::transform::SampleTimes {
                        decode: Duration::ZERO,
                        transform: t.elapsed(),
                        decoded_bytes: record.bytes.len() as u64,
                    })
            }
        }
        .map_err(|e| (Some(record.key.clone()), e))?;
        shared.counters.sample(read, &times);
        scratch.recycle_read_buffer(record.bytes);
        Ok((record.key, record.label))
    };
    let result = catch_unwind(AssertUnwindSafe(run));
    if let Some(trace) = &shared.trace {
        let lane = LANE_DECODE + rayon::current_thread_index().unwrap_or(0) as u64;
        trace.record("read+decode+transform", lane, start, Instant::now());
    }
    match result {
        Ok(Ok((key, label))) => Outcome::Ok { key, label },
        Ok(Err((key, error))) => Outcome::Failed {
            key: key.unwrap_or_else(|| safe_key(shared, index)),
            error,
        },
        Err(payload) => {
            let key = safe_key(shared, index);
            Outcome::Failed {
                error: Error::WorkerPanic {
                    key: key.clone(),
                    message: panic_message(payload.as_ref()),
                },
                key,
            }
        }
    }
}

/// A batch buffer being filled by several jobs at once, and the one owner
/// of raw pointers into it: each sample's slot goes to exactly one claimant
/// ([`claim`](Self::claim)), a slot's borrow ends before the claim is
/// released, and the buffer comes back ([`take_buf`](Self::take_buf)) only
/// once every slot has been released. So no two slices alias and none
/// outlives the buffer, whatever the threads do.
struct SlotTable {
    /// The buffer the slots point into, until taken.
    buf: Mutex<Option<HostBuf>>,
    slots: Vec<RawSlot>,
    /// The next slot to hand out.
    next: AtomicUsize,
    /// Slots not yet released.
    left: AtomicUsize,
}

/// A pointer to one sample's slot (only a [`SlotTable`] holds them).
enum RawSlot {
    U8(*mut u8, usize),
    F32(*mut f32, usize),
}

// SAFETY: the pointers point into `buf`'s heap memory, which the table owns
// and gives back only once every slot is released (`take_buf`), and `claim`
// hands each slot to one claimant, whose slice borrow ends before its
// release; sending or sharing the table so creates no shared mutable access.
unsafe impl Send for SlotTable {}
// SAFETY: as for `Send`: through `&SlotTable` a slot is reached only by its
// one claimant.
unsafe impl Sync for SlotTable {}

/// Slot [`index`](Self::index) of a [`SlotTable`], this claimant's alone
/// until [`release`](Self::release)d. A claim dropped unreleased keeps its
/// buffer from being taken back (the batch never completes): the loader
/// catches every panic inside a claim, so it always releases.
struct Claimed<'a> {
    table: &'a SlotTable,
    index: usize,
}

impl SlotTable {
    /// The first `n` slots of `slot_len` elements of `buf`; the buffer
    /// back with the error if they cannot be had (boxed: a rare path, and
    /// a pinned buffer is large).
    fn new(mut buf: HostBuf, n: usize, slot_len: usize) -> Result<Self, Box<(HostBuf, Error)>> {
        let slots = match buf.slots(n, slot_len) {
            Ok(slots) => slots
                .into_iter()
                .map(|slot| match slot {
                    Slot::U8(s) => RawSlot::U8(s.as_mut_ptr(), s.len()),
                    Slot::F32(s) => RawSlot::F32(s.as_mut_ptr(), s.len()),
                })
                .collect(),
            Err(e) => return Err(Box::new((buf, e))),
        };
        // The slots point into the buffer's heap memory, which moving the
        // `HostBuf` value into the mutex does not move.
        Ok(Self {
            buf: Mutex::new(Some(buf)),
            slots,
            next: AtomicUsize::new(0),
            left: AtomicUsize::new(n),
        })
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    /// The next slot nobody has claimed, in order; `None` once all are.
    fn claim(&self) -> Option<Claimed<'_>> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        (index < self.slots.len()).then_some(Claimed { table: self, index })
    }

    /// The buffer, once every slot has been released (`None` before, and
    /// after it was taken).
    fn take_buf(&self) -> Option<HostBuf> {
        // Acquire: pairs with each release's AcqRel, so every slot's writes
        // happen before the buffer is read.
        if self.left.load(Ordering::Acquire) != 0 {
            return None;
        }
        crate::lock(&self.buf).take()
    }
}

impl Claimed<'_> {
    /// Which slot (the sample's position in the batch).
    fn index(&self) -> usize {
        self.index
    }

    /// The slot to write; borrowed from the claim, so it ends before the
    /// claim is released.
    fn slot(&mut self) -> Slot<'_> {
        // SAFETY: `claim` handed `index` to this claim only (`next` gives
        // each index once), so no other slice of this slot exists; the
        // buffer is alive and unmoved in `table.buf`, since `take_buf` gives
        // it out only once `left` is 0, which needs this claim's release,
        // and the slice's borrow of `self` ends before `release` can run.
        unsafe {
            match self.table.slots[self.index] {
                RawSlot::U8(p, n) => Slot::U8(std::slice::from_raw_parts_mut(p, n)),
                RawSlot::F32(p, n) => Slot::F32(std::slice::from_raw_parts_mut(p, n)),
            }
        }
    }

    /// Gives the slot back; `true` for the last one, after which
    /// [`SlotTable::take_buf`] returns the buffer.
    fn release(self) -> bool {
        // AcqRel: this slot's writes happen before the last release's
        // reader takes the buffer.
        self.table.left.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// One batch being filled. Its samples are claimed one at a time, in
/// order, by as many runner jobs as the decode pool has threads, and the job
/// that completes the last sample hands the batch over. Runners are queued
/// first-in first-out, so the workers finish a batch before they start the
/// next, and no job ever blocks waiting for another: a worker never holds
/// back a finished batch while it helps with a later one (as a nested
/// `par_iter` waiting for its last sample would).
struct Filling {
    shared: Arc<Shared>,
    plan: Arc<Plan>,
    index: usize,
    epoch: u64,
    gen: u64,
    cancel: Arc<AtomicBool>,
    done: Sender<Msg>,
    /// The batch buffer and its samples' slots; the buffer is taken by
    /// `finish`.
    table: SlotTable,
    pre: Vec<Mutex<PreRead>>,
    outcomes: Vec<Mutex<Option<Outcome>>>,
}

impl Filling {
    /// Batch `index` of `plan` into the slots of `table`, with the records
    /// `pre` read ahead (stream mode; `None` for random access).
    #[allow(clippy::too_many_arguments)]
    fn new(
        shared: Arc<Shared>,
        plan: Arc<Plan>,
        index: usize,
        (epoch, gen): (u64, u64),
        cancel: Arc<AtomicBool>,
        done: Sender<Msg>,
        table: SlotTable,
        mut pre: Vec<PreRead>,
    ) -> Self {
        let n = table.len();
        pre.resize_with(n, || None);
        Self {
            shared,
            plan,
            index,
            epoch,
            gen,
            cancel,
            done,
            table,
            pre: pre.into_iter().map(Mutex::new).collect(),
            outcomes: (0..n).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn indices(&self) -> &[usize] {
        &self.plan.order[self.plan.batches[self.index].clone()]
    }

    /// Claims and processes samples until none are left to claim.
    fn run(&self) {
        let indices = self.indices();
        while let Some(mut claim) = self.table.claim() {
            let j = claim.index();
            let pre = crate::lock(&self.pre[j]).take();
            let shared = &self.shared;
            // `process` catches the sample's own panics; this catches the
            // rest, so every claim is released and the batch completes (an
            // unwind out of a rayon job would abort the process: the pool
            // has no panic handler).
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let slot = claim.slot();
                process(shared, self.epoch, indices[j], slot, &self.cancel, pre)
            }))
            .unwrap_or_else(|payload| Outcome::Failed {
                key: safe_key(shared, indices[j]),
                error: Error::WorkerPanic {
                    key: safe_key(shared, indices[j]),
                    message: panic_message(payload.as_ref()),
                },
            });
            *crate::lock(&self.outcomes[j]) = Some(outcome);
            if claim.release() {
                self.complete();
            }
        }
    }

    /// Hands the finished batch (or its error) to the uploader.
    fn complete(&self) {
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
        let _ = self.done.send(Msg::Done(self.gen, filled));
    }

    /// Compacts the kept samples to the front of the buffer and builds the
    /// batch.
    fn finish(&self) -> Filled {
        let (shared, index) = (&*self.shared, self.index);
        let indices = self.indices();
        let slot_len = shared.transform.slot_len();
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
        let mut batch = HostBatch {
            buf,
            labels: Vec::with_capacity(indices.len()),
            keys: Vec::with_capacity(indices.len()),
            indices: Vec::with_capacity(indices.len()),
            skipped: Vec::new(),
        };
        for (slot, (outcome, &source_index)) in self.outcomes.iter().zip(indices).enumerate() {
            match crate::lock(outcome).take().unwrap_or(Outcome::Cancelled) {
                Outcome::Ok { key, label } => {
                    let kept = batch.keys.len();
                    if kept != slot {
                        if let Err(e) = batch.buf.move_slot(slot, kept, slot_len) {
                            shared.pool.release(Some(batch.buf));
                            return Filled {
                                index,
                                result: Some(Err(e)),
                            };
                        }
                    }
                    batch.keys.push(key);
                    batch.labels.push(label);
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

/// The uploader's view of the running epoch.
struct Running {
    gen: u64,
    out: Option<Sender<Result<Pending>>>,
    cancel: Arc<AtomicBool>,
    next: usize,
    pending: BTreeMap<usize, Option<Result<HostBatch>>>,
    received: usize,
    dispatched: Option<usize>,
}

/// Gives back what a batch that will never be delivered holds: its buffer
/// (a batch that failed or was cancelled gave it back already).
fn discard(shared: &Shared, result: Option<Result<HostBatch>>) {
    if let Some(Ok(host)) = result {
        shared.pool.release(Some(host.buf));
    }
    shared.counters.batch_dropped();
}

/// The uploader thread: reorder, upload, hand over.
fn upload_loop(shared: &Shared, done: &Receiver<Msg>, acks: &Acks) {
    let mut running: Option<Running> = None;
    for msg in done {
        match msg {
            Msg::Begin {
                gen,
                out,
                first,
                cancel,
            } => {
                // An epoch still running here was forgotten and then
                // cancelled: what it left is given back; its late batches
                // are discarded as they come (their generation is old).
                if let Some(old) = running.take() {
                    old.pending.into_values().for_each(|r| discard(shared, r));
                }
                running = Some(Running {
                    gen,
                    out: Some(out),
                    cancel,
                    next: first,
                    pending: BTreeMap::new(),
                    received: 0,
                    dispatched: None,
                });
            }
            Msg::Done(gen, filled) => match running.as_mut() {
                Some(r) if r.gen == gen => {
                    r.received += 1;
                    r.pending.insert(filled.index, filled.result);
                    flush(shared, r);
                }
                _ => discard(shared, filled.result),
            },
            Msg::End { gen, dispatched } => {
                if let Some(r) = running.as_mut().filter(|r| r.gen == gen) {
                    r.dispatched = Some(dispatched);
                }
            }
        }
        if let Some(gen) = running
            .as_ref()
            .filter(|r| r.dispatched == Some(r.received))
            .map(|r| r.gen)
        {
            // Dropping the epoch's sender ends its channel after the last batch.
            running = None;
            acks.ack(gen);
        }
    }
}

/// Records a span on the upload lane when dropped.
struct TraceSpan<'a>(&'a Trace, &'static str, Instant);

impl Drop for TraceSpan<'_> {
    fn drop(&mut self) {
        self.0.record(self.1, LANE_UPLOAD, self.2, Instant::now());
    }
}

/// Hands over every batch that is next in order.
fn flush(shared: &Shared, r: &mut Running) {
    while let Some(result) = r.pending.remove(&r.next) {
        let index = r.next;
        r.next += 1;
        let live = r.out.is_some() && !r.cancel.load(Ordering::Relaxed);
        let item = match result {
            None => {
                shared.counters.batch_dropped();
                continue;
            }
            Some(Err(e)) => {
                shared.counters.batch_dropped();
                Err(e)
            }
            Some(Ok(host)) if !live => {
                shared.pool.release(Some(host.buf));
                shared.counters.batch_dropped();
                continue;
            }
            Some(Ok(host)) => {
                let t = Instant::now();
                let _span = shared.trace.as_ref().map(|tr| TraceSpan(tr, "upload", t));
                // A panic in the device step (candle's ops) is this batch's
                // error, not the end of the upload thread and the loader.
                let (buf, labels, geo) = (host.buf, host.labels, shared.geo);
                let uploaded = caught(format!("batch {index} (upload)"), || {
                    shared.uploader.upload(&shared.device, buf, labels, geo)
                });
                match uploaded {
                    Ok(up) => {
                        shared.pool.release(up.reusable);
                        shared.counters.batch_uploaded(t.elapsed());
                        for (time, bytes) in shared.uploader.finished_copies() {
                            shared.counters.batch_copied(time, bytes);
                        }
                        Ok(Pending {
                            batch: Some(Batch {
                                images: up.images,
                                labels: up.labels,
                                keys: host.keys,
                                indices: host.indices,
                                index,
                                skipped: host.skipped,
                                ready: up.ready,
                            }),
                            guards: shared.uploader.guards(),
                        })
                    }
                    Err(e) => {
                        shared.pool.release(None);
                        shared.counters.batch_dropped();
                        Err(e)
                    }
                }
            }
        };
        if let Some(out) = &r.out {
            // The prefetch depth AUTOTUNE chose, below the channel's size.
            shared.room.wait_while(|| {
                out.len() >= shared.knobs.prefetch.load(Ordering::Relaxed)
                    && !r.cancel.load(Ordering::Relaxed)
                    && out.len() < out.capacity().unwrap_or(usize::MAX)
            });
            // Never blocks for good: an epoch forgotten with a full channel
            // has a receiver nobody reads, and is cancelled.
            let mut item = item;
            loop {
                match out.send_timeout(item, Duration::from_millis(20)) {
                    Ok(()) => break,
                    Err(crossbeam_channel::SendTimeoutError::Timeout(back))
                        if !r.cancel.load(Ordering::Relaxed) =>
                    {
                        item = back;
                    }
                    Err(_) => {
                        r.out = None;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::MemorySource;

    /// Three threads fill a table: each slot goes to one of them, the
    /// buffer comes back only after the last release (to the one thread
    /// told it was last), with every slot's writes in it.
    #[test]
    fn a_slot_table_hands_each_slot_out_once_and_the_buffer_back_last() {
        for round in 0..50 {
            let table = SlotTable::new(HostBuf::U8(vec![0; 8 * 3]), 8, 3).unwrap();
            let go = std::sync::Barrier::new(3);
            let lasts = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        go.wait();
                        while let Some(mut claim) = table.claim() {
                            let j = claim.index();
                            match claim.slot() {
                                Slot::U8(px) => px.fill(j as u8 + 1),
                                Slot::F32(_) => unreachable!(),
                            }
                            assert!(table.take_buf().is_none(), "a claim is still held");
                            if claim.release() {
                                lasts.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(lasts.load(Ordering::Relaxed), 1, "round {round}");
            let Some(HostBuf::U8(px)) = table.take_buf() else {
                panic!("round {round}: the buffer comes back once every slot is released")
            };
            let want: Vec<u8> = (1..=8).flat_map(|j| [j; 3]).collect();
            assert_eq!(px, want, "round {round}");
            assert!(table.take_buf().is_none(), "taken once");
        }
    }

    /// The uploader's protocol, message by message: batches are handed over
    /// in index order whatever order they finish in, a cancelled batch
    /// (`Done(None)`) is passed over, `End` before the last `Done` waits
    /// for it, a late batch of an older generation is given back and never
    /// delivered, and every buffer returns to the pool.
    #[test]
    fn the_uploader_reorders_skips_and_keeps_generations_apart() {
        // A broken protocol hangs (a channel that never ends): fail instead.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            uploader_protocol();
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hang: watchdog expired"),
            // A panic in the body (the harness prints it) or success.
            r => r.expect("the protocol test panicked"),
        }
    }

    fn uploader_protocol() {
        let records = (0..4)
            .map(|i| Record::encoded(format!("r{i}"), vec![1], 0))
            .collect();
        let loader = Loader::builder(MemorySource::new(records))
            .batch_size(2)
            .image_size(2)
            .output(Output::U8Nhwc)
            .workers(1)
            .batches_in_flight(8)
            .prefetch(8)
            .shard(0, 1)
            .build()
            .unwrap();
        let shared = loader.shared.clone();
        let (tx, rx) = bounded::<Msg>(64);
        let acks = Arc::new(Acks::default());
        let uploader = {
            let (shared, acks) = (shared.clone(), acks.clone());
            std::thread::spawn(move || upload_loop(&shared, &rx, &acks))
        };
        let never = AtomicBool::new(false);
        let slot = 2 * shared.transform.slot_len();
        // Batch `index` of a generation, its bytes all `tag`.
        let done = |gen: u64, index: usize, tag: u8| {
            let mut buf = shared.pool.acquire(&never).unwrap().unwrap();
            match &mut buf {
                HostBuf::U8(v) => {
                    v.clear();
                    v.resize(slot, tag);
                }
                _ => unreachable!("a CPU loader with U8 output"),
            }
            let host = HostBatch {
                buf,
                labels: vec![tag as u32; 2],
                keys: vec![format!("k{index}"); 2],
                indices: vec![2 * index, 2 * index + 1],
                skipped: Vec::new(),
            };
            Msg::Done(
                gen,
                Filled {
                    index,
                    result: Some(Ok(host)),
                },
            )
        };
        let begin = |gen: u64, out: Sender<Result<Pending>>| Msg::Begin {
            gen,
            out,
            first: 0,
            cancel: Arc::new(AtomicBool::new(false)),
        };
        let delivered = |rx: Receiver<Result<Pending>>| -> Vec<(usize, u8)> {
            rx.iter()
                .map(|p| {
                    let b = p.unwrap().take();
                    let px = b.images.flatten_all().unwrap().to_vec1::<u8>().unwrap();
                    assert!(px.iter().all(|&x| x == px[0]), "batch {} torn", b.index);
                    assert_eq!(b.labels.to_vec1::<u32>().unwrap(), [px[0] as u32; 2]);
                    (b.index, px[0])
                })
                .collect()
        };

        // Generation 1: finished out of order, batch 1 cancelled, End
        // before the last two.
        let (out, got) = bounded(16);
        tx.send(begin(1, out)).unwrap();
        tx.send(done(1, 2, 12)).unwrap();
        tx.send(done(1, 0, 10)).unwrap();
        let none = Filled {
            index: 1,
            result: None,
        };
        tx.send(Msg::Done(1, none)).unwrap();
        tx.send(Msg::End {
            gen: 1,
            dispatched: 5,
        })
        .unwrap();
        tx.send(done(1, 4, 14)).unwrap();
        tx.send(done(1, 3, 13)).unwrap();
        // The channel ends once all five are back.
        assert_eq!(delivered(got), [(0, 10), (2, 12), (3, 13), (4, 14)]);
        acks.wait(1);

        // Generation 2 begins while generation 1's stragglers still arrive
        // (a forgotten epoch): those are given back, not delivered.
        let (out, got) = bounded(16);
        tx.send(begin(2, out)).unwrap();
        tx.send(done(1, 0, 99)).unwrap();
        tx.send(done(2, 1, 21)).unwrap();
        tx.send(done(1, 1, 98)).unwrap();
        tx.send(Msg::End {
            gen: 1,
            dispatched: 9,
        })
        .unwrap();
        tx.send(done(2, 0, 20)).unwrap();
        tx.send(Msg::End {
            gen: 2,
            dispatched: 2,
        })
        .unwrap();
        assert_eq!(delivered(got), [(0, 20), (1, 21)]);
        acks.wait(2);
        drop(tx);
        uploader.join().unwrap();
        assert_eq!(shared.pool.out(), 0, "every buffer is back in the pool");
    }
}
