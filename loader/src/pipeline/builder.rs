//! The builder: every setting with its default, validated once in
//! [`LoaderBuilder::build`], which starts the loader.

use super::fill::BadSamples;
use super::loader::{Loader, Order};
use super::{Room, Shared};
use crate::cache::{Cache, CacheMode};
use crate::contract::{ShardInfo, Source};
use crate::device::{Finish, Guards};
use crate::error::{Error, Result};
use crate::fields::Schema;
use crate::geometry::Size;
use crate::layout::Output;
use crate::map::{ImageClassification, Map};
use crate::order::ranks::Ranks;
use crate::order::sampler::{Remainder, Sampler};
use crate::order::stream::{Interleave, StreamPlanner};
use crate::pool::Pool;
use crate::read::ahead::{ReadAhead, MAX_DEPTH};
use crate::state::{shard_table, Identity, LoaderState, Position};
use crate::stats::trace::Trace;
use crate::stats::Counters;
use crate::transform::{ImageTransform, Transforms};
use crate::tune::{default_budget, Auto, Budget, Gate, Knobs, Setting, Tuner, MAX_QUEUE};
use candle_core::Device;
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
    pub(super) workers: Setting,
    pub(super) prefetch: Setting,
    pub(super) in_flight: Setting,
    pub(super) shuffle: Option<u64>,
    pub(super) seed: Option<u64>,
    pub(super) remainder: Remainder,
    pub(super) size: Size,
    pub(super) transforms: TransformChoice,
    pub(super) output: Output,
    pub(super) device: Device,
    pub(super) ranks: Option<std::result::Result<Ranks, (usize, usize)>>,
    pub(super) bad_samples: BadSamples,
    pub(super) interleave: Option<Interleave>,
    pub(super) shuffle_buffer: Option<usize>,
    pub(super) shard_blocks: Option<crate::order::shards::ShardBlocks>,
    pub(super) ram_budget: Option<u64>,
    pub(super) trace: bool,
    pub(super) cache: Option<(CacheMode, Option<PathBuf>)>,
    pub(super) remote_cache: Option<crate::storage::RemoteCache>,
    pub(super) guards: Guards,
    pub(super) map: Option<Arc<dyn Map>>,
    /// Which image settings were given (they configure the built-in map).
    pub(super) image_settings: Vec<&'static str>,
    /// A saved state to continue from.
    pub(super) resume: Option<LoaderState>,
    pub(super) max_pixels: u64,
    pub(super) retries: u32,
    pub(super) bad_samples_log: Option<PathBuf>,
}

impl LoaderBuilder {
    /// Every setting at its default (each setter documents it).
    pub(super) fn new(source: Arc<dyn Source>) -> Self {
        Self {
            source,
            batch_size: 32,
            workers: Setting::Auto,
            prefetch: Setting::Auto,
            in_flight: Setting::Auto,
            shuffle: None,
            seed: None,
            remainder: Remainder::Split,
            size: Size::square(224),
            transforms: TransformChoice::Eval,
            output: Output::imagenet(),
            device: Device::Cpu,
            ranks: None,
            bad_samples: BadSamples::Fail,
            interleave: None,
            shuffle_buffer: None,
            shard_blocks: None,
            ram_budget: None,
            trace: false,
            cache: None,
            remote_cache: None,
            guards: Guards::default(),
            map: None,
            image_settings: Vec::new(),
            resume: None,
            max_pixels: crate::decode::DEFAULT_MAX_PIXELS,
            retries: 0,
            bad_samples_log: None,
        }
    }

    /// Tries a read that fails with a transient error
    /// ([`Error::is_transient`]: interrupted, timed out, `EIO`, `EAGAIN`,
    /// ...) up to `n` more times, waiting 10, 20, 40 ... ms (at most
    /// 200 ms) between tries, before the sample is bad
    /// ([`bad_samples`](Self::bad_samples) decides what then); its error
    /// then says how many tries there were ([`Error::Retried`]). An error
    /// about the data (a missing or corrupt file) is never retried.
    /// [`Stats::read_retries`](crate::stats::Stats::read_retries) counts
    /// the retries. Default 0. The streaming mode retries too, except
    /// a compressed TFRecord shard (read as one sequential stream).
    /// A transient error from the map (the token map reads its memory map
    /// itself) is retried the same way: the map runs again over the same
    /// record. Dropping the epoch stops the retries: no try is made after
    /// it.
    /// `EIO` is retried because network and FUSE file systems report
    /// transient faults with it (and a token file's page that could not
    /// be read is reported so).
    pub fn retry(mut self, n: u32) -> Self {
        self.retries = n;
        self
    }

    /// Lists every bad sample in the file at `path`, one JSON line each
    /// (`{"key", "reason", "epoch", "index", "pid"}`, the reason with its
    /// whole cause chain), each key once however many epochs meet it: a
    /// quarantine list to fix the dataset with, under either
    /// [`BadSamples`] policy. Appends to the file (created if missing);
    /// `build` fails if it cannot be opened.
    ///
    /// Each line is one append `write`, so a kill leaves no line cut short
    /// and loaders or ranks sharing the file never mix inside a line (on
    /// a local file system); a line cut by an earlier kill stays its own
    /// line. Keys the file already lists when the loader is built are not
    /// listed again (by key, whatever the reason), so a resumed run does
    /// not repeat them. One loader writes at most 10,000 lines, then one
    /// `{"truncated": true, "limit": 10000, ...}` line and no more, and
    /// keeps at most 10,000 keys from the file besides its own.
    pub fn bad_samples_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.bad_samples_log = Some(path.into());
        self
    }

    /// The most pixels (width x height) an image's header may declare: a
    /// larger one is refused before anything is allocated for it
    /// ([`Error::ImageTooLarge`], a bad sample). Default 89,478,485,
    /// Pillow's decompression-bomb limit. Whether an image is refused
    /// depends on the image and this limit only (never on the worker count
    /// or the RAM budget, so a resumed run refuses the same images); an
    /// image whose decoded pixels exceed what the RAM budget grants each
    /// decode worker is decoded while no other such image is (one at a
    /// time in the process), and its buffers are given back after it.
    pub fn max_pixels(mut self, pixels: u64) -> Self {
        self.max_pixels = pixels;
        self
    }

    /// Continues a run from `state` (from [`Loader::state`],
    /// [`Batch::state`](crate::Batch::state) or
    /// [`Epoch::state`](crate::Epoch::state), saved in this process or
    /// another): [`Loader::next_epoch`] then yields exactly the batches the
    /// uninterrupted run would have yielded from there, with any worker
    /// count, batches in flight, prefetch depth, device or RAM budget.
    /// `build` refuses a state whose source or settings differ from this
    /// loader's, naming each difference ([`Error::StateMismatch`]).
    ///
    /// In the random-access mode resuming costs nothing, and the state
    /// may come from a job of another world size (elastic resume: the rest
    /// of the epoch is planned from the samples all ranks had taken, each
    /// exactly once; see [`LoaderState`]). In the streaming mode the loader
    /// replays its shuffle buffer over the indices of the records before
    /// the saved batch without reading them (but a compressed TFRecord
    /// shard's, which cannot skip); mid-epoch it resumes on the same world
    /// size only.
    pub fn resume(mut self, state: LoaderState) -> Self {
        self.resume = Some(state);
        self
    }

    /// Samples per batch. Default 32.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Decode workers. Default [`AUTOTUNE`](crate::AUTOTUNE): start with
    /// one and add workers while the training loop waits for data and
    /// throughput grows, up to the cores this process may use (its CPU
    /// affinity and its cgroup's quota) over the node's local ranks, within the RAM
    /// budget, giving them back when they buy nothing (so a CPU trainer
    /// keeps its cores). A number fixes the count (`0` is an error from
    /// `build`).
    pub fn workers(mut self, n: impl Into<Setting>) -> Self {
        self.workers = n.into();
        self
    }

    /// Batches made into device tensors ahead of the consumer. Default
    /// [`AUTOTUNE`](crate::AUTOTUNE): start at 1 and deepen while the
    /// consumer waits and it helps (at most 8). A number fixes it (`0` is
    /// an error from `build`).
    pub fn prefetch(mut self, n: impl Into<Setting>) -> Self {
        self.prefetch = n.into();
        self
    }

    /// Host batch buffers being filled or waiting for upload at once: the
    /// memory bound of the decode stage. Default
    /// [`AUTOTUNE`](crate::AUTOTUNE): start at 2, grow while it helps (at
    /// most 8). A number fixes it (`0` is an error from `build`).
    pub fn batches_in_flight(mut self, n: impl Into<Setting>) -> Self {
        self.in_flight = n.into();
        self
    }

    /// Host memory the loader may hold: batch buffers (in flight,
    /// prefetched, being uploaded and held by the consumer), the decode
    /// workers' scratch and the cache. AUTOTUNE never grows past it and the
    /// cache stops filling at it; `build` fails if the explicit settings
    /// cannot fit. [`Stats::memory_peak`](crate::stats::Stats::memory_peak) reports the peak. Default: a
    /// quarter of the memory available when the loader is built (the
    /// smaller of `MemAvailable` and what the process's cgroup, its
    /// container, has left under its limit), divided among the node's
    /// local ranks (`LOCAL_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_SIZE`,
    /// `MPI_LOCALNRANKS` or `SLURM_NTASKS_PER_NODE`); each loader of a
    /// rank takes that much.
    ///
    /// Decode scratch is part of it: an image whose decoded pixels exceed
    /// what the budget leaves each decode worker (the budget less the
    /// batch buffers, shared among the workers) is refused from its header
    /// ([`Error::ImageTooLarge`], a bad sample) rather than decoded past
    /// the budget.
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

    /// Keep remote objects (a URL source's shards and sample files) in a
    /// local cache: in memory within its limit, counted in the RAM budget,
    /// and optionally in a directory a restarted run reads again. The
    /// cache serves the whole process: this sets
    /// [`storage::set_cache`](crate::storage::set_cache) when the loader is
    /// built. Default: none (every read goes to the store).
    pub fn remote_cache(mut self, cache: crate::storage::RemoteCache) -> Self {
        self.remote_cache = Some(cache);
        self
    }

    /// Record a timeline of every sample's decode, every upload and the
    /// consumer's waits; add training steps with [`Trace::span`](crate::stats::Trace::span) through
    /// [`Loader::trace`], and write it with [`Trace::write_chrome_json`](crate::stats::Trace::write_chrome_json).
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
    /// Needs a sharded source ([`crate::source::TfRecord`], [`crate::source::WebDataset`],
    /// [`crate::source::SafetensorsShards`]); compressed TFRecords can only be read
    /// this way. Default: random access, where the whole epoch is one
    /// permutation (a better shuffle when the storage allows random reads).
    pub fn interleave(mut self, cycle_length: usize, block_length: usize) -> Self {
        self.interleave = Some(Interleave {
            cycle_length,
            block_length,
        });
        self
    }

    /// Random access by shard blocks: each epoch the shards are put in a
    /// keyed order, cut into parts (one per rank by default), and each
    /// part's samples shuffled within windows; rank `r` of as many ranks
    /// as parts reads only part `r`, one window of a few shards at a time
    /// ([`ShardBlocks`](crate::ShardBlocks) has the settings and their
    /// defaults). Remote shards are then read in 32 MiB ranged requests,
    /// not a request per sample, kept in memory (within a quarter of the
    /// RAM budget) or, with a cache directory
    /// ([`RemoteCache::disk`](crate::storage::RemoteCache::disk)), in the
    /// node's copies of the shards there, which the node's ranks share:
    /// for a dataset in object storage too large for each rank to read at
    /// random. A sample moves only within its window (at
    /// most `window` places) while every batch still mixes the shards of a
    /// window; resume is exact, and elastic (any world size) because the
    /// parts stay as the first run cut them. Mosaic Streaming's
    /// canonical nodes with its block shuffle, and LitData's chunk
    /// shuffle, do the same.
    ///
    /// Needs a sharded source ([`crate::source::TfRecord`],
    /// [`crate::source::WebDataset`], [`crate::source::SafetensorsShards`])
    /// and the random-access mode; with [`shuffle`](Self::shuffle) the order
    /// is new every epoch, without it the shards keep their stored order
    /// (cut and dealt the same way).
    pub fn shard_blocks(mut self, blocks: crate::ShardBlocks) -> Self {
        self.shard_blocks = Some(blocks);
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
    /// give every rank a full batch): `remainder(Remainder::Drop)`; `false`
    /// is `remainder(Remainder::Split)`, the default: with random access
    /// every sample is used every epoch. In the streaming mode with several
    /// ranks an epoch stops at the batch count every rank's shards fill;
    /// the records a rank holds beyond it are read in other epochs, which
    /// deal the shards differently (reshuffled with a seed, rotated by one
    /// shard per epoch without).
    pub fn drop_last(mut self, yes: bool) -> Self {
        self.remainder = if yes {
            Remainder::Drop
        } else {
            Remainder::Split
        };
        self
    }

    /// What an epoch does with the samples that do not fill a batch on
    /// every rank: split them evenly (default), drop them, or pad the epoch
    /// by wrap-around as PyTorch's `DistributedSampler` does. See
    /// [`Remainder`]. The streaming mode takes `Split` and `Drop`.
    pub fn remainder(mut self, remainder: Remainder) -> Self {
        self.remainder = remainder;
        self
    }

    /// Size of the output images: a number for a square (`image_size(224)`)
    /// or a [`Size`] (`image_size(Size::new(320, 240))`, width first as
    /// everywhere in wick). Default 224 x 224.
    pub fn image_size(mut self, size: impl Into<Size>) -> Self {
        self.size = size.into();
        self.image_settings.push("image_size");
        self
    }

    /// torchvision's training augmentation: [`Transforms::train`](crate::Transforms::train).
    pub fn train_transforms(mut self) -> Self {
        self.transforms = TransformChoice::Train;
        self.image_settings.push("train_transforms");
        self
    }

    /// torchvision's evaluation transform for the image size:
    /// [`Transforms::eval`](crate::Transforms::eval). This is the default.
    pub fn eval_transforms(mut self) -> Self {
        self.transforms = TransformChoice::Eval;
        self.image_settings.push("eval_transforms");
        self
    }

    /// Any [`Transforms`](crate::Transforms).
    pub fn transforms(mut self, t: Transforms) -> Self {
        self.transforms = TransformChoice::Custom(t);
        self.image_settings.push("transforms");
        self
    }

    /// What the images are: `u8` NHWC as decoded, or normalized floats
    /// NCHW of a type, computed on the host or the device (one setting:
    /// see [`Output`]). Default [`Output::imagenet`]: `f32` normalized with
    /// ImageNet's mean and std, on the device for GPUs (u8 crosses the bus,
    /// 4x fewer bytes than f32) and on the host for the CPU.
    pub fn output(mut self, output: Output) -> Self {
        self.output = output;
        self.image_settings.push("output");
        self
    }

    /// Device of the batch tensors. Default [`Device::Cpu`].
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Use only shard `rank` of `world_size` (data-parallel training): as
    /// [`ranks`](Self::ranks) with [`Ranks::new`]; `build` fails unless
    /// `rank < world_size`.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.ranks = Some(Err((rank, world_size)));
        self
    }

    /// This process's rank and the job's world size (data-parallel
    /// training: every rank gets a disjoint share of each epoch and the
    /// same number of batches). Default: [`Ranks::from_env`], the
    /// launcher's variables (torchrun, Open MPI, PMI, SLURM), one process
    /// when none is set; a contradiction among them fails `build`.
    pub fn ranks(mut self, ranks: Ranks) -> Self {
        self.ranks = Some(Ok(ranks));
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
    pub fn __without_guard(mut self, guard: crate::device::ring::Guard) -> Self {
        self.guards = Guards { skip: Some(guard) };
        self
    }

    /// The per-sample function (a [`Map`], or a closure through
    /// [`map_fn`](crate::map::map_fn)) in place of the built-in image
    /// classification map: its fields become the batch's tensors, by name
    /// ([`Batch::get`](crate::Batch::get)). The image settings
    /// (`image_size`, the transforms, `output`) configure the built-in map
    /// and are refused with a user map, and so is the cache (it keeps image
    /// + class records only, for now).
    pub fn map(mut self, map: impl Map) -> Self {
        self.map = Some(Arc::new(map));
        self
    }

    /// The shard-block shuffle's settings for this run: as given, else as
    /// the resumed state was saved with, else the defaults
    /// ([`ShardBlocks`](crate::ShardBlocks)).
    fn choose_blocks(
        &self,
        given: crate::order::shards::ShardBlocks,
        world_size: usize,
    ) -> Result<crate::order::shards::Blocks> {
        use crate::order::shards::Blocks;
        let shards = self.source.shards();
        if shards.is_empty() {
            return Err(Error::InvalidConfig(
                "shard_blocks needs a sharded source (TfRecord, WebDataset, \
                 SafetensorsShards); this one has no shards"
                    .into(),
            ));
        }
        let records: usize = shards.iter().map(|s| s.records).sum();
        if records != self.source.len() {
            return Err(Error::InvalidConfig(format!(
                "shard_blocks: the source's shards hold {records} samples of its {}",
                self.source.len()
            )));
        }
        let saved = self
            .resume
            .as_ref()
            .and_then(|s| Blocks::parse(&s.identity.mode));
        let partitions = given
            .partitions
            .or(saved.map(|b| b.partitions))
            .unwrap_or(world_size);
        if partitions == 0 || given.window == Some(0) {
            return Err(Error::InvalidConfig(
                "shard_blocks: partitions and window must be at least 1".into(),
            ));
        }
        let window = match given.window.or(saved.map(|b| b.window)) {
            Some(w) => w,
            None => {
                // Remote shards with a cache directory: the chunks go there.
                let remote = shards.iter().any(|s| crate::storage::is_url(&s.path));
                let local_ranks = crate::tune::local_ranks(&|k| std::env::var(k).ok()) as u64;
                let disk = crate::storage::cache_dir_limit(self.remote_cache.as_ref())
                    .filter(|_| remote)
                    .map_or(0, |limit| limit / 4 / local_ranks);
                let memory = self.ram_budget.unwrap_or(4 << 30) / 8;
                auto_window(shards, memory.max(disk))?.max(self.batch_size)
            }
        };
        // A round deals each part the batches of the ranks that share it
        // (consecutive ranks: a node's), so those ranks read one part.
        let lane = saved
            .map(|b| b.lane)
            .unwrap_or(self.batch_size * (world_size / partitions).max(1));
        Ok(Blocks {
            partitions,
            window,
            lane,
        })
    }

    /// Validates the settings, starts the loader's threads and returns it.
    pub fn build(self) -> Result<Loader> {
        if self.source.is_empty() {
            return Err(Error::InvalidConfig("the source has no samples".into()));
        }
        let ranks = match self.ranks {
            Some(Ok(ranks)) => ranks,
            Some(Err((rank, world_size))) => Ranks::new(rank, world_size)?,
            None => Ranks::from_env()?,
        };
        let (rank, world_size) = (ranks.rank(), ranks.world_size());
        let drop_last = match (self.interleave, self.remainder) {
            (Some(_), Remainder::Pad) => {
                return Err(Error::InvalidConfig(
                    "remainder(Pad) applies to random access: the streaming mode gives each \
                     rank whole shards (use Split or Drop)"
                        .into(),
                ))
            }
            (_, r) => r == Remainder::Drop,
        };
        let budget = self.ram_budget.unwrap_or_else(default_budget);
        if self.interleave.is_some() && self.shard_blocks.is_some() {
            return Err(Error::InvalidConfig(
                "shard_blocks applies to random access: the streaming mode (interleave) reads \
                 whole shards already"
                    .into(),
            ));
        }
        let blocks = match self.shard_blocks {
            Some(b) => Some(self.choose_blocks(b, world_size)?),
            None => None,
        };
        let order = match self.interleave {
            Some(il) => Order::Stream(StreamPlanner::new(
                self.source.shards(),
                self.batch_size,
                self.shuffle,
                drop_last,
                (rank, world_size),
                il,
                self.shuffle_buffer.unwrap_or(1024),
            )?),
            None if self.shuffle_buffer.is_some() => {
                return Err(Error::InvalidConfig(
                    "shuffle_buffer applies to the streaming mode: set interleave(..) too".into(),
                ))
            }
            None => {
                let sampler = Sampler::new(
                    self.source.len(),
                    self.batch_size,
                    self.shuffle,
                    self.remainder,
                    rank,
                    world_size,
                )?;
                Order::Sampled(match blocks {
                    Some(blocks) => sampler.by_shards(blocks, shard_records(&*self.source)),
                    None => sampler.ordered_by(self.source.clone())?,
                })
            }
        };
        let seed = self.seed.or(self.shuffle).unwrap_or(0);
        let (map, transform, finish, finish_field): (Arc<dyn Map>, _, _, _) = match self.map {
            None => {
                let Size {
                    width: w,
                    height: h,
                } = self.size;
                let transforms = match self.transforms {
                    TransformChoice::Train => Transforms::train(),
                    TransformChoice::Eval => Transforms::eval(h.max(w)),
                    TransformChoice::Custom(t) => t,
                };
                let finish = Finish::new(self.output, &self.device)?;
                let host_output = finish.host_layout();
                let transform = ImageTransform::new(transforms, host_output, self.size, seed)?;
                let map = Arc::new(ImageClassification::new(transform.clone()));
                (map, Some(transform), finish, Some(0))
            }
            Some(map) => {
                if let Some(first) = self.image_settings.first() {
                    return Err(Error::InvalidConfig(format!(
                        "{first}(..) configures the built-in image map; a loader with a user \
                         map writes the map's own fields"
                    )));
                }
                if self.cache.is_some() {
                    return Err(Error::InvalidConfig(
                        "the cache keeps image + class records; it does not work with a user \
                         map yet"
                            .into(),
                    ));
                }
                let finish = Finish::new(Output::U8Nhwc, &self.device)?;
                (map, None, finish, None)
            }
        };
        let schema =
            Arc::new(Schema::new(&map.fields(), self.batch_size)?.with_views(&map.views())?);
        schema.check_device(&self.device)?;
        let identity = Identity {
            order_version: crate::state::ORDER_VERSION.into(),
            seed,
            shuffle_seed: self.shuffle,
            batch_size: self.batch_size,
            remainder: self.remainder.name().into(),
            world_size,
            mode: match (self.interleave, self.shuffle) {
                // The buffer shuffles only a shuffled stream.
                (Some(il), Some(_)) => format!(
                    "streaming ({il:?}, shuffle buffer {})",
                    self.shuffle_buffer.unwrap_or(1024)
                ),
                (Some(il), None) => format!("streaming ({il:?})"),
                (None, _) => match &blocks {
                    Some(b) => format!("random access, {}", b.describe()),
                    None => "random access".into(),
                },
            },
            source_len: self.source.len(),
            source_shards: shard_table(&*self.source),
            source_digest: self.source.digest(),
            max_pixels: self.max_pixels,
            bad_samples: format!("{:?}", self.bad_samples),
            fields: schema
                .fields
                .iter()
                .map(|f| format!("{} {:?} {:?}", f.field.name, f.field.dtype, f.field.shape))
                .chain(schema.views.iter().map(|v| {
                    let v = &v.view;
                    format!("{} = {}[{}..{}]", v.name, v.of, v.start, v.start + v.len)
                }))
                .collect(),
            map: transform
                .as_ref()
                .map(|t: &ImageTransform| format!("{} {:?}", t.describe(), self.output)),
        };
        // Checked before any thread starts.
        let position = match &self.resume {
            Some(state) => {
                state.check(&identity)?;
                order.resume_at(state)?
            }
            None => Position::default(),
        };
        // Where AUTOTUNE starts each setting it owns.
        let start = |name: &str, s: Setting, auto_start: usize| match s {
            Setting::Fixed(0) => Err(Error::InvalidConfig(format!(
                "{name}(0): give at least 1, or AUTOTUNE to let the loader tune it"
            ))),
            Setting::Fixed(n) => Ok((false, n)),
            _ => Ok((true, auto_start)),
        };
        let (auto_workers, workers) = start("workers", self.workers, 1)?;
        let (auto_in_flight, in_flight) = start("batches_in_flight", self.in_flight, 2)?;
        let (auto_prefetch, prefetch) = start("prefetch", self.prefetch, 1)?;
        let auto = Auto {
            workers: auto_workers,
            in_flight: auto_in_flight,
            prefetch: auto_prefetch,
        };
        let max_workers = if auto.workers {
            crate::tune::core_ceiling()
        } else {
            workers
        };
        // Page-locked buffers hold every region at its aligned offset.
        let batch_bytes = if self.device.is_cuda() {
            schema.packed_bytes
        } else {
            schema.batch_bytes()
        } as u64;
        if let Some(cache) = &self.remote_cache {
            if cache.memory_limit() > budget / 2 {
                return Err(Error::InvalidConfig(format!(
                    "the remote cache's {} bytes of memory are over half the {budget}-byte RAM \
                     budget: lower it, or raise ram_budget",
                    cache.memory_limit()
                )));
            }
            crate::storage::set_cache(cache)?;
        }
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
        let guards = self.guards;
        let uploader =
            crate::device::Uploader::new(&self.device, finish, finish_field, &schema, guards)?;
        // CUDA: page-locked buffers for the batches in flight now, more from
        // the same allocator as AUTOTUNE grows, none freed while it tunes.
        let (alloc, keep) = crate::device::buffers(&self.device, schema.clone(), guards);
        if !keep {
            // Heap batches: as many as can be in flight and queued at once.
            let most = |n: usize| n.max(crate::tune::MAX_QUEUE);
            crate::device::keep_batch_memory(&schema, most(in_flight) + most(prefetch));
        }
        let parts = Arc::new(map.parts());
        // Remote shards in blocks: read by chunk, a quarter of the budget.
        let remote = |s: &ShardInfo| crate::storage::is_url(&s.path);
        let spans = (blocks.is_some() && self.source.shards().iter().any(remote))
            .then(|| crate::storage::spans::Spans::new(budget / 4));
        // A remote source's records are read ahead of the workers.
        let readahead = self.source.wants_read_ahead().then(|| {
            let source = self.source.clone();
            ReadAhead::new(
                source,
                parts.clone(),
                self.retries,
                spans.clone(),
                (self.batch_size, MAX_DEPTH),
            )
        });
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
            parts,
            map,
            schema,
            seed,
            transform,
            counters,
            device: self.device,
            bad_samples: self.bad_samples,
            identity: Arc::new(identity),
            max_pixels: self.max_pixels,
            retries: self.retries,
            quarantine: self
                .bad_samples_log
                .as_deref()
                .map(super::quarantine::Quarantine::open)
                .transpose()?,
            readahead,
            spans,
            direct: Default::default(),
            #[cfg(test)]
            force_direct: Default::default(),
        });
        let channel = if auto.prefetch { MAX_QUEUE } else { prefetch };
        let most_in_flight = if auto.in_flight { MAX_QUEUE } else { in_flight };
        Loader::start(
            shared,
            order,
            max_workers,
            most_in_flight,
            channel,
            position,
        )
    }
}

/// Each shard's record count, in index order.
fn shard_records(source: &dyn Source) -> Vec<usize> {
    source.shards().iter().map(|s| s.records).collect()
}

/// The shard-block window that `bytes` hold: the largest power of two of
/// samples whose bytes fit, the bytes a sample measured on up to eight
/// shards spread over the index (their sizes: a request each for objects
/// in a store).
fn auto_window(shards: &[ShardInfo], bytes: u64) -> Result<usize> {
    let with: Vec<&ShardInfo> = shards.iter().filter(|s| s.records > 0).collect();
    let picked = (0..with.len().min(8)).map(|i| with[i * with.len() / with.len().min(8)]);
    let (mut measured, mut records) = (0u64, 0u64);
    for s in picked {
        measured += crate::storage::Blob::open(&s.path)?.1;
        records += s.records as u64;
    }
    let per = measured.div_ceil(records.max(1)).max(1);
    let fit = (bytes / per).max(1);
    Ok(1usize << (63 - fit.leading_zeros()).min(40))
}
