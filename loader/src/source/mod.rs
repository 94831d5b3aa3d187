//! Where samples come from: random-access sources of encoded records.
//!
//! This module is the public face of three places inside the crate: the
//! contract every source implements ([`Source`], [`Record`], [`Value`],
//! [`Parts`]), the on-disk formats (image folders and lists, TFRecord,
//! WebDataset and safetensors shards, token files and Megatron datasets,
//! Parquet and the Hugging Face Hub layouts) with [`detect`] and
//! [`open_path`], and the sources made of other sources ([`Mixture`],
//! [`MemorySource`]).

mod memory;
mod mixture;

pub use crate::contract::{
    Damage, EpochOrder, Parts, Record, RecordStream, ShardInfo, Source, Value,
};
pub use crate::formats::hf_cache::{cached_snapshot, hf_hub_cache};
pub use crate::formats::images::{FileList, ImageFolder, ImageMaskFolders};
#[cfg(feature = "parquet")]
pub use crate::formats::parquet::{
    hub_files, HubFiles, HubLayout, HubOptions, Parquet, ParquetOptions, RowFilter,
};
pub use crate::formats::shards::{
    Compression, SafetensorsShards, ShardOptions, TfRecord, TfRecordOptions, WebDataset,
    WebDatasetOptions,
};
pub use crate::formats::tokens::{
    DocumentWindows, Megatron, TokenFile, TokenLayout, TokenSource, TokenType, TokenWindows,
    WindowOrder, WindowStart,
};
pub use crate::formats::{detect, open_path, DatasetKind, Detected};
pub use crate::storage::local::shard_paths;
pub use memory::MemorySource;
pub use mixture::{BlendRule, Mixture, MixtureBuilder};
