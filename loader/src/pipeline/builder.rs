//! The builder: every setting with its default, validated once in
//! [`LoaderBuilder::build`], which starts the loader.

use super::fill::BadSamples;
use super::loader::{Loader, Order};
use super::{Room, Shared};
use crate::cache::{Cache, CacheMode};
use crate::device::{Finish, Geometry, Guards, NormalizeAt};
use crate::error::{Error, Result};
use crate::layout::Output;
use crate::order::sampler::Sampler;
use crate::order::stream::{Interleave, StreamPlanner};
use crate::pool::Pool;
use crate::source::Source;
use crate::stats::trace::Trace;
use crate::stats::Counters;
use crate::transform::{ImageTransform, Transforms};
use crate::tune::{default_budget, Auto, Budget, Gate, Knobs, Tuner, MAX_QUEUE};
use candle_core::{DType, Device};
use std::path::PathBuf;
use std::sync::Arc;

/// Which geometric transforms the builder was asked for.
#[derive(Debug, Clone, Copy)]
pub(super) enum TransformChoice {
    Train,
    Eval,
    Custom(Transforms),
}

/// Configures a [`Loader`]; see [`Loader::builder`].
#[derive(Debug)]
pub struct LoaderBuilder {
    pub(super) source: Arc<dyn Source>,
    pub(super) batch_size: usize,
    pub(super) workers: usize,
    pub(super) prefetch: usize,
    pub(super) in_flight: usize,
    pub(super) shuffle: Option<u64>,
    pub(super) seed: Option<u64>,
    pub(super) drop_last: bool,
    pub(super) size: (usize, usize),
    pub(super) transforms: TransformChoice,
    pub(super) output: Output,
    pub(super) device: Device,
    pub(super) shard: Option<(usize, usize)>,
    pub(super) bad_samples: BadSamples,
    pub(super) normalize_at: NormalizeAt,
    pub(super) dtype: Option<DType>,
    pub(super) interleave: Option<Interleave>,
    pub(super) shuffle_buffer: Option<usize>,
    pub(super) ram_budget: Option<u64>,
    pub(super) trace: bool,
    pub(super) cache: Option<(CacheMode, Option<PathBuf>)>,
    pub(super) guards: Guards,
}

impl LoaderBuilder {
    /// Every setting at its default (each setter documents it).
    pub(super) fn new(source: Arc<dyn Source>) -> Self {
        Self {
            source,
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
    /// cannot fit. [`Stats::memory_peak`](crate::Stats::memory_peak) reports the peak. Default: a
    /// quarter of the memory available when the loader is built.
    ///
    /// A single image larger than the budget still decodes (the decoder's own
    /// limits apply); the budget then keeps every other buffer at its minimum.
    pub fn ram_budget(mut self, bytes: u64) -> Self {
        self.ram_budget = Some(bytes);
        self
    }

    /// Keep every sample after its first read, in memory, so later epochs
    /// skip reading it (and, with [`CacheMode::Decoded`](crate::CacheMode::Decoded), decoding it);
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
    /// consumer's waits; add training steps with [`Trace::span`](crate::Trace::span) through
    /// [`Loader::trace`], and write it with [`Trace::write_chrome_json`](crate::Trace::write_chrome_json).
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

    /// torchvision's training augmentation: [`Transforms::train`](crate::Transforms::train).
    pub fn train_transforms(mut self) -> Self {
        self.transforms = TransformChoice::Train;
        self
    }

    /// torchvision's evaluation transform for the image size:
    /// [`Transforms::eval`](crate::Transforms::eval). This is the default.
    pub fn eval_transforms(mut self) -> Self {
        self.transforms = TransformChoice::Eval;
        self
    }

    /// Any [`Transforms`](crate::Transforms).
    pub fn transforms(mut self, t: Transforms) -> Self {
        self.transforms = TransformChoice::Custom(t);
        self
    }

    /// Element type and layout of the images. Default [`Output::imagenet`](crate::Output::imagenet):
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

    /// Where [`Output::F32Nchw`](crate::Output::F32Nchw) normalization happens. Default
    /// [`NormalizeAt::Auto`](crate::NormalizeAt::Auto): on the device for GPUs (u8 crosses the bus, 4x
    /// fewer bytes than f32), on the host for the CPU.
    pub fn normalize_at(mut self, at: NormalizeAt) -> Self {
        self.normalize_at = at;
        self
    }

    /// Element type of the image tensors for [`Output::F32Nchw`](crate::Output::F32Nchw): `F32`
    /// (default), `BF16` or `F16`, converted on the device.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Policy for unreadable or undecodable samples. Default [`BadSamples::Fail`](crate::BadSamples::Fail).
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
        // Pinned buffers hold the labels too.
        let labels = if self.device.is_cuda() { 4 } else { 0 };
        let batch_bytes = (self.batch_size * (transform.slot_len() * elem + labels)) as u64;
        let budget = self.ram_budget.unwrap_or_else(default_budget);
        let knobs = Knobs {
            gate: Gate::new(workers),
            in_flight: in_flight.into(),
            prefetch: prefetch.into(),
            max_workers,
            budget: Budget::new(budget, batch_bytes, self.device.is_cuda(), in_flight),
        };
        knobs.budget.check_start(in_flight, prefetch)?;
        let counters = Counters::default();
        counters.set_workers(workers);
        counters.set_memory(knobs.budget.memory(in_flight, prefetch, workers, 0));
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
        let (alloc, keep) = crate::device::buffers(&self.device, geo, guards);
        let shared = Arc::new(Shared {
            pool: Pool::new(in_flight, alloc, keep)?,
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

pub(super) fn shard_from_env() -> Result<(usize, usize)> {
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
