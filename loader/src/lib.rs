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
//! use candle_wick::source::ImageFolder;
//! use candle_wick::Loader;
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
//!         // batch.images()?: f32 [128, 3, 224, 224], ImageNet-normalized
//!         // batch.labels()?: u32 [128]
//!         # let _ = batch;
//!     }
//!     println!("{:?}", loader.stats());
//! }
//! # Ok(()) }
//! ```
//!
//! ## The API
//!
//! The crate root holds what a training loop writes: [`Loader`] and its
//! [`LoaderBuilder`], the [`Epoch`] iterator and its [`Batch`]es, the
//! settings they take ([`Output`], [`Transforms`], [`Size`], [`Setting`] /
//! [`AUTOTUNE`], [`BadSamples`], [`CacheMode`], [`Interleave`]), [`Error`],
//! and [`open_path`]. Everything else is grouped by area:
//!
//! - [`source`]: where samples come from: [`source::ImageFolder`],
//!   [`source::FileList`] (CSV/TSV), [`source::MemorySource`], and shards
//!   ([`source::TfRecord`], [`source::WebDataset`] tar,
//!   [`source::SafetensorsShards`]), read at random or streamed
//!   ([`LoaderBuilder::interleave`]), language-model token files
//!   ([`source::TokenSource`]); records carry named parts
//!   ([`source::Record::parts`]); the [`Source`] trait for your own.
//! - [`map`]: the per-sample function, [`map::Map`] or a closure through
//!   [`map::map_fn`] ([`LoaderBuilder::map`]), writing the batch's
//!   [`fields`] in place; the built-in [`map::ImageClassification`] is one.
//! - [`ops`]: the image map's building blocks, for your own maps (crops,
//!   decode-and-resize into a slot, label maps, nearest resampling).
//! - [`write`](mod@write): shard writers of one shape, and [`write::convert`] (what
//!   `wick convert` runs).
//! - [`state`]: the resumable loader state, [`state::LoaderState`] and its
//!   [`state::Identity`] ([`Loader::state`], [`LoaderBuilder::resume`]).
//! - [`stats`]: what a loader measured ([`stats::Stats`], its report and
//!   [`stats::Verdict`]) and the Chrome-trace timeline.
//! - [`tune`]: AUTOTUNE: [`Setting`] and the decisions it records
//!   ([`tune::TuneStep`], [`Loader::autotune_history`]).
//!
//! ## What it guarantees
//!
//! - **Determinism**: the order comes from `(seed, epoch)` and every random
//!   draw of sample `i` from `(seed, epoch, i)`, so batches are bit-identical
//!   for any number of workers and any prefetch depth, on one kind of CPU
//!   (JPEG pixels can differ by one level between CPUs with and without FMA;
//!   see the book's [guarantees]).
//! - **Bounded memory**: batch buffers, decode scratch and cache stay within
//!   [`LoaderBuilder::ram_budget`]; AUTOTUNE (the default for workers,
//!   batches in flight and prefetch) never grows past it.
//! - **Self-tuning and self-reporting**: AUTOTUNE grows parallelism only while
//!   the training loop waits for data; [`stats::Stats::report`] and
//!   [`stats::Stats::verdict`] say whether it starved and why.
//! - **Bad input**: a missing, empty or corrupt file is an error naming it,
//!   or, with [`BadSamples::Skip`], left out and listed; panics in sources
//!   or maps become errors; decoders run with size limits.
//! - **Exact resume**: [`Batch::state`] continues an epoch, in any process,
//!   with exactly the batches the uninterrupted run would have given.
//!
//! ## The book
//!
//! The user guide, the guarantees each with its test, the feature flags,
//! the benchmarks and how the loader works are in the book, `docs/` in
//! the [repository] (`mdbook serve docs` to read it locally): start with
//! [getting started], [the Loader API] or [on a GPU].
//!
//! [repository]: https://github.com/wick-rs/wick
//! [guarantees]: https://github.com/wick-rs/wick/blob/main/docs/src/reference/guarantees.md
//! [getting started]: https://github.com/wick-rs/wick/blob/main/docs/src/guide/getting-started.md
//! [the Loader API]: https://github.com/wick-rs/wick/blob/main/docs/src/guide/loader.md
//! [on a GPU]: https://github.com/wick-rs/wick/blob/main/docs/src/guide/gpu.md
//!
//! ## Feature flags
//!
//! None is on by default: every local format but Parquet builds without
//! the network stack or a C build.
//!
//! - `parquet`: Parquet sources (`source::Parquet`) and the Hugging Face
//!   Hub's layouts; `wick convert --format parquet`.
//! - `remote`: `s3://`, `gs://`, `az://`, `http(s)://` and `file://` URLs
//!   anywhere a path goes, through object_store ([`storage`]).
//! - `full`: `parquet` and `remote`.
//! - `cuda`: CUDA devices through candle-core's `cuda` feature.
//! - `metal`: Metal devices through candle-core's `metal` feature.
//! - `cli`: the `wick` command-line tool (`wick bench`, `wick convert`,
//!   `wick inspect`); turns on `full`.
//! - `turbojpeg`: decode JPEGs with libjpeg-turbo (built from source; needs
//!   cmake and nasm), decoding only the crop window and downscaling in the
//!   DCT when the window is at least twice the output size.

#![deny(missing_docs)]

// Every Rust block of the README and the book is compiled by `cargo test`
// (doctests); blocks that include an example by anchor are `ignore`d here
// and built as the examples themselves.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
mod book_doctests {
    #[doc = include_str!("../../docs/src/guide/loader.md")]
    struct Loader;
    #[doc = include_str!("../../docs/src/guide/sources.md")]
    struct Sources;
    #[cfg(feature = "parquet")]
    #[doc = include_str!("../../docs/src/guide/hub.md")]
    struct Hub;
    #[doc = include_str!("../../docs/src/guide/shards.md")]
    struct Shards;
    #[doc = include_str!("../../docs/src/guide/images.md")]
    struct Images;
    #[doc = include_str!("../../docs/src/guide/maps.md")]
    struct Maps;
    #[doc = include_str!("../../docs/src/guide/ranks.md")]
    struct Ranks;
    #[doc = include_str!("../../docs/src/guide/storage.md")]
    struct Storage;
    #[doc = include_str!("../../docs/src/guide/scale.md")]
    struct Scale;
    #[doc = include_str!("../../docs/src/guide/resume.md")]
    struct Resume;
    #[doc = include_str!("../../docs/src/guide/bad-data.md")]
    struct BadData;
    #[doc = include_str!("../../docs/src/guide/performance.md")]
    struct Performance;
    #[doc = include_str!("../../docs/src/guide/gpu.md")]
    struct Gpu;
}

mod cache;
mod contract;
mod decode;
mod device;
mod error;
pub mod fields;
mod formats;
mod geometry;
mod layout;
pub mod map;
pub mod ops;
mod order;
mod pipeline;
mod pool;
mod read;
mod rng;
pub mod source;
pub mod state;
pub mod stats;
pub mod storage;
mod sync;
mod transform;
pub mod tune;
pub mod write;

pub use cache::CacheMode;
pub use error::{error_chain, Error, Result};
pub use geometry::Size;
pub use layout::{FloatType, NormalizeAt, Output, IMAGENET_MEAN, IMAGENET_STD};
pub use order::ranks::Ranks;
pub use order::sampler::Remainder;
pub use order::shards::ShardBlocks;
pub use order::stream::Interleave;
pub use pipeline::{BadSamples, Batch, Epoch, Loader, LoaderBuilder, Skipped};
pub use source::{open_path, Source};
pub use state::LoaderState;
pub use transform::Transforms;
pub use tune::{Setting, AUTOTUNE};

/// The per-sample code the loader runs, for benchmarks, tests and the `wick`
/// tool (`wick inspect` reads JPEG frame headers with it) that time
/// or check it outside the pipeline. Not part of the API: it changes with
/// the pipeline, without notice.
#[doc(hidden)]
pub mod __bench {
    pub use crate::decode::limits::{jpeg_frame, JpegFrame};
    #[cfg(feature = "turbojpeg")]
    pub use crate::decode::turbo_whole;
    pub use crate::decode::{decode_rgb_into, JPEG_DECODER};
    pub use crate::layout::{HostLayout, Slot};
    pub use crate::stats::SampleTimes;
    pub use crate::transform::ImageTransform;
}

/// Test hooks of the device upload; not part of the API.
#[doc(hidden)]
pub mod __test {
    pub use crate::device::ring::Guard;
}
