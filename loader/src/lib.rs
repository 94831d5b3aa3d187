//! # candle-wick
//!
//! A training-data loader that keeps a [Candle](https://github.com/huggingface/candle)
//! device fed: samples are read, decoded and augmented on the loader's own
//! pool of CPU threads straight into reusable batch buffers, put back in
//! order, and turned into device tensors by a prefetch thread before the
//! training step asks for them.
//!
//! ## Quick start
//!
//! ```no_run
//! use candle_wick::{ImageFolder, Loader};
//!
//! # fn main() -> candle_wick::Result<()> {
//! let train = ImageFolder::new("data/train")?; // root/<class>/<image>
//! let mut loader = Loader::builder(train)
//!     .batch_size(128)
//!     .image_size(224)
//!     .train_transforms() // RandomResizedCrop + horizontal flip
//!     .shuffle(42)        // a new permutation every epoch, reproducible
//!     .build()?; // workers, batches in flight, prefetch: AUTOTUNE
//! for epoch in 0..10 {
//!     for batch in loader.epoch(epoch) {
//!         let batch = batch?;
//!         // batch.images: f32 [128, 3, 224, 224], ImageNet-normalized
//!         // batch.labels: u32 [128]
//!         # let _ = batch;
//!     }
//!     println!("{:?}", loader.stats());
//! }
//! # Ok(()) }
//! ```
//!
//! ## Sources
//!
//! [`ImageFolder`], [`FileList`] (CSV/TSV), [`MemorySource`], and shards:
//! [`TfRecord`], [`WebDataset`] (tar), [`SafetensorsShards`] (pre-resized
//! pixels or encoded bytes, memory-mapped). Sharded sources are read by
//! random access or in the streaming mode
//! ([`LoaderBuilder::interleave`], [`LoaderBuilder::shuffle_buffer`]);
//! [`convert`] (and `wick convert`) writes any source as shards.
//!
//! ## What it guarantees
//!
//! - **Determinism**: the order comes from `(seed, epoch)` and every random
//!   draw of sample `i` from `(seed, epoch, i)`, so batches are bit-identical
//!   for any number of workers and any prefetch depth, on one kind of CPU
//!   (JPEG pixels can differ by one level between CPUs with and without FMA;
//!   see the README).
//! - **Bounded memory**: batch buffers, decode scratch and cache stay within
//!   [`LoaderBuilder::ram_budget`]; AUTOTUNE (the default for workers,
//!   batches in flight and prefetch) never grows past it.
//! - **Self-tuning and self-reporting**: AUTOTUNE grows parallelism only while
//!   the training loop waits for data; [`Stats::report`] and
//!   [`Stats::verdict`] say whether it starved and why.
//! - **Bad input**: a missing, empty or corrupt file is an error naming it,
//!   or, with [`BadSamples::Skip`], left out and listed; panics in sources
//!   or transforms become errors; decoders run with size limits.
//!
//! ## Feature flags
//!
//! - `cuda`: CUDA devices through candle-core's `cuda` feature.
//! - `metal`: Metal devices through candle-core's `metal` feature.
//! - `cli`: the `wick` command-line tool (`wick bench`, `wick convert`).
//! - `turbojpeg`: decode JPEGs with libjpeg-turbo (built from source; needs
//!   cmake and nasm), decoding only the crop window and downscaling in the
//!   DCT when the window is at least twice the output size.

#![deny(missing_docs)]

mod cache;
mod decode;
mod device;
mod error;
mod geometry;
mod layout;
mod order;
mod pipeline;
mod pool;
mod rng;
mod source;
mod stats;
mod transform;
mod tune;
pub mod write;

pub use cache::CacheMode;
pub use decode::{decode_rgb_into, JPEG_DECODER};
pub use device::NormalizeAt;
pub use error::{error_chain, Error, Result};
pub use layout::{Output, Slot, IMAGENET_MEAN, IMAGENET_STD};
pub use order::sampler::Sampler;
pub use order::stream::Interleave;
pub use pipeline::{BadSamples, Batch, Epoch, Loader, LoaderBuilder, Skipped};
pub use source::{
    open_path, shard_paths, Compression, Damage, FileList, ImageFolder, MemorySource, Record,
    RecordStream, SafetensorsShards, ShardInfo, ShardOptions, Source, TfRecord, TfRecordOptions,
    WebDataset, WebDatasetOptions,
};
pub use stats::trace::Trace;
pub use stats::SampleTimes;
pub use stats::{Stage, StageRates, Stats, Verdict};
pub use transform::{ImageTransform, Transforms};
pub use tune::{TuneStep, AUTOTUNE};

/// Locks `m`, going on when another holder panicked: the data behind every
/// lock in this crate is kept consistent by plain stores, so poisoning
/// carries nothing to act on.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Test hooks of the device upload; not part of the API.
#[doc(hidden)]
pub mod __test {
    pub use crate::device::ring::Guard;
}
