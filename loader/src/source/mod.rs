//! Where samples come from: random-access sources of encoded records.

mod folder;
mod list;
pub(crate) mod mapguard;
mod megatron;
mod memory;
mod mixture;
mod open;
#[cfg(feature = "parquet")]
mod parquet;
pub(crate) mod readahead;
mod shards;
mod tensors;
pub(crate) mod tfrecord;
mod tokens;
mod webdataset;

pub use folder::{ImageFolder, ImageMaskFolders};
pub use list::FileList;
pub use megatron::{DocumentWindows, Megatron};
pub use memory::MemorySource;
pub use mixture::{BlendRule, Mixture, MixtureBuilder};
pub use open::{detect, open_path, DatasetKind, Detected};
#[cfg(feature = "parquet")]
pub use parquet::{
    cached_snapshot, hf_hub_cache, hub_files, HubFiles, HubLayout, HubOptions, Parquet,
    ParquetOptions, RowFilter,
};
pub(crate) use shards::{read_exact_at, shard_error};
pub use shards::{shard_paths, Damage, ShardInfo, ShardOptions};
pub use tensors::SafetensorsShards;
pub use tfrecord::{Compression, TfRecord, TfRecordOptions};
pub use tokens::{
    TokenFile, TokenLayout, TokenSource, TokenType, TokenWindows, WindowOrder, WindowStart,
};
pub use webdataset::{WebDataset, WebDatasetOptions};

use crate::error::{Error, Result};
use crate::geometry::Size;
use std::path::{Path, PathBuf};

/// One sample as a source stores it: a key, the encoded image and its
/// class (the common case), and any other named parts the loader's map
/// asked for ([`Source::read_parts`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Record {
    /// A name for the sample that a user can find it by: the file's path for
    /// file-backed sources.
    pub key: String,
    /// The encoded image (JPEG, PNG, ...).
    pub bytes: Vec<u8>,
    /// The class index.
    pub label: u32,
    /// `Some(size)` when `bytes` are already-decoded RGB u8 pixels,
    /// row-major (pre-resized safetensors shards); `None` for an encoded
    /// image.
    pub rgb_size: Option<Size>,
    /// Named parts, as the format stores them: WebDataset members by
    /// extension (`seg.png`, `json`, ...), `tf.train.Example` features by
    /// name, file-list columns by header, token windows as `tokens`.
    pub parts: Vec<(String, Value)>,
}

/// The value of one named part of a [`Record`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// Bytes as stored: an encoded member or file, a single bytes feature.
    Bytes(Vec<u8>),
    /// Text: a file-list column, a UTF-8 member.
    Text(String),
    /// A list of byte strings (a `bytes_list` feature of several values).
    BytesList(Vec<Vec<u8>>),
    /// 64-bit integers (an `int64_list` feature).
    Int64(Vec<i64>),
    /// 32-bit floats (a `float_list` feature).
    Float(Vec<f32>),
    /// Tokens (a window of a token file).
    Tokens(Vec<u32>),
    /// One row of a tensor (a safetensors tensor of one row per sample):
    /// its safetensors dtype name (`"F32"`, `"I64"`, ...), the row's shape
    /// and its little-endian bytes.
    Array {
        /// The element type, as safetensors names it.
        dtype: String,
        /// The row's shape (the tensor's without its first dimension).
        shape: Vec<usize>,
        /// The row's bytes, little-endian.
        data: Vec<u8>,
    },
}

/// Which parts of a record a loader's map reads
/// ([`Map::parts`](crate::map::Map::parts)); sources read only those.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Parts {
    /// The image and class only (the built-in image map).
    #[default]
    Default,
    /// The image and class, and these named parts.
    Named(Vec<String>),
    /// Every part the format stores.
    All,
}

impl Parts {
    /// Whether the part `name` is asked for.
    pub fn wants(&self, name: &str) -> bool {
        match self {
            Parts::Default => false,
            Parts::Named(names) => names.iter().any(|n| n == name),
            Parts::All => true,
        }
    }
}

impl Record {
    /// A record of an encoded image (JPEG, PNG, ...).
    pub fn encoded(key: impl Into<String>, bytes: Vec<u8>, label: u32) -> Self {
        Self {
            key: key.into(),
            bytes,
            label,
            rgb_size: None,
            parts: Vec::new(),
        }
    }

    /// A record of decoded RGB u8 pixels of `size`, row-major.
    pub fn decoded(key: impl Into<String>, pixels: Vec<u8>, size: Size, label: u32) -> Self {
        Self {
            rgb_size: Some(size),
            ..Self::encoded(key, pixels, label)
        }
    }

    /// This record with part `name` set to `value` (replacing one of the
    /// same name).
    pub fn with_part(mut self, name: impl Into<String>, value: Value) -> Self {
        let name = name.into();
        self.parts.retain(|(n, _)| *n != name);
        self.parts.push((name, value));
        self
    }

    /// Part `name`, if the record has it.
    pub fn part(&self, name: &str) -> Option<&Value> {
        self.parts.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Part `name`, or an error naming the record, the part and the parts
    /// it has.
    pub fn require(&self, name: &str) -> Result<&Value> {
        self.part(name).ok_or_else(|| {
            let have: Vec<&str> = self.parts.iter().map(|(n, _)| n.as_str()).collect();
            Error::Transform {
                key: self.key.clone(),
                reason: format!("the record has no part {name:?} (it has {have:?})"),
                source: None,
            }
        })
    }

    /// The bytes of part `name` ([`Value::Bytes`] or [`Value::Text`]), or
    /// an error naming the record and the part.
    pub fn part_bytes(&self, name: &str) -> Result<&[u8]> {
        match self.require(name)? {
            Value::Bytes(b) => Ok(b),
            Value::Text(t) => Ok(t.as_bytes()),
            other => Err(Error::Transform {
                key: self.key.clone(),
                reason: format!("part {name:?} is {}, not bytes", other.kind()),
                source: None,
            }),
        }
    }
}

impl Value {
    /// What kind of value this is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Bytes(_) => "bytes",
            Value::Text(_) => "text",
            Value::BytesList(_) => "a bytes list",
            Value::Int64(_) => "an int64 list",
            Value::Float(_) => "a float list",
            Value::Tokens(_) => "tokens",
            Value::Array { .. } => "a tensor row",
        }
    }
}

/// Records of one shard in order, read sequentially: exactly
/// [`ShardInfo::records`] items, an `Err` standing for a damaged record.
pub type RecordStream = Box<dyn Iterator<Item = Result<Record>> + Send>;

/// A random-access dataset of encoded records.
///
/// `read` is called concurrently from the decode workers, so a source is
/// `Send + Sync` and reads through `&self`.
pub trait Source: Send + Sync + 'static {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether the source has no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads sample `index` (`0..len()`).
    ///
    /// A file that is missing, unreadable or empty gives an error naming it.
    fn read(&self, index: usize) -> Result<Record>;

    /// [`read`](Self::read), with `bytes` as the record's byte buffer: a
    /// buffer the caller reuses from sample to sample (cleared, then
    /// refilled, keeping its capacity), so steady-state reading allocates no
    /// byte buffer per sample. The default drops `bytes` and calls `read`.
    fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
        drop(bytes);
        self.read(index)
    }

    /// [`read_reusing`](Self::read_reusing), with the named parts `parts`
    /// asks for as well ([`Record::parts`]). The default ignores `parts`:
    /// a source that stores no named parts gives image + class records,
    /// and a map asking for a part gets an error naming it.
    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let _ = parts;
        self.read_reusing(index, bytes)
    }

    /// The key of sample `index` without reading its bytes, used to name a
    /// sample in errors before it was read. Defaults to `"#index"`.
    fn key(&self, index: usize) -> String {
        format!("#{index}")
    }

    /// The shards of a sharded source (TFRecord, WebDataset, safetensors),
    /// in index order: shard `k` holds samples `first..first + records`.
    /// Empty for sources without shards, which then cannot stream.
    fn shards(&self) -> &[ShardInfo] {
        &[]
    }

    /// Reads shard `shard` sequentially, for the streaming mode
    /// ([`crate::LoaderBuilder::interleave`]), each record with the named
    /// `parts` (as [`Source::read_parts`] gives them). `None` (the default)
    /// means the loader reads the shard's records with
    /// [`Source::read_parts`] in order, which for a file-backed shard is a
    /// sequential read already; a source whose records cannot be reached
    /// by offset (compressed TFRecord) returns its own reader.
    fn stream_shard(&self, shard: usize, parts: &Parts) -> Result<Option<RecordStream>> {
        let _ = (shard, parts);
        Ok(None)
    }

    /// Damaged regions that were left out when the source was opened with
    /// [`ShardOptions::skip_damaged`]; empty otherwise.
    fn damage(&self) -> &[Damage] {
        &[]
    }

    /// A checksum of what decides which record each index holds, beyond
    /// [`len`](Self::len) and [`shards`](Self::shards): the names, order
    /// and labels of an image folder's or file list's samples (relative
    /// to its root, so a dataset may move), a token source's files,
    /// lengths, window length and window order. A loader's resume state
    /// keeps it, and a state saved over another source is refused. `0`
    /// (the default) for a source that says nothing more; a user source
    /// whose order can change without its length should return one.
    fn digest(&self) -> u32 {
        0
    }

    /// Whether reading a record waits on the network (objects in S3, GCS,
    /// Azure or on an HTTP server): the loader then reads the next records
    /// of the plan ahead of its workers, concurrently, as deep as the
    /// measured latency needs. `false` (the default) for local data.
    fn is_remote(&self) -> bool {
        false
    }

    /// The order of epoch `epoch`'s samples, when the source decides it
    /// (a [`Mixture`] places its members' samples by weight): `len()`
    /// indices below `len()`, repeats allowed, a pure function of `seed`
    /// (the loader's [`shuffle`](crate::LoaderBuilder::shuffle) seed,
    /// `None` without a shuffle) and `epoch`. The loader cuts it into
    /// batches and ranks as it does its own permutation (with a seed, each
    /// stretch of `world_size * batch_size` is shuffled within itself), and
    /// resumes it exactly. `None` (the default): the loader's permutation.
    /// Only the random-access mode asks.
    fn epoch_order(&self, seed: Option<u64>, epoch: u64) -> Option<Vec<usize>> {
        let _ = (seed, epoch);
        None
    }

    /// Bytes the source holds in memory beyond its index (a Parquet
    /// source's decoded row groups), counted in the loader's RAM budget.
    /// `0` (the default) for a source that holds nothing per read.
    fn memory(&self) -> u64 {
        0
    }
}

/// `Source` for smart pointers to a source, forwarding every method.
macro_rules! forward_source {
    ($($ptr:ident)::+) => {
        impl<S: Source + ?Sized> Source for $($ptr)::+<S> {
            fn len(&self) -> usize {
                (**self).len()
            }
            fn read(&self, index: usize) -> Result<Record> {
                (**self).read(index)
            }
            fn read_reusing(&self, index: usize, bytes: Vec<u8>) -> Result<Record> {
                (**self).read_reusing(index, bytes)
            }
            fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
                (**self).read_parts(index, parts, bytes)
            }
            fn key(&self, index: usize) -> String {
                (**self).key(index)
            }
            fn shards(&self) -> &[ShardInfo] {
                (**self).shards()
            }
            fn stream_shard(&self, shard: usize, parts: &Parts) -> Result<Option<RecordStream>> {
                (**self).stream_shard(shard, parts)
            }
            fn damage(&self) -> &[Damage] {
                (**self).damage()
            }
            fn digest(&self) -> u32 {
                (**self).digest()
            }
            fn is_remote(&self) -> bool {
                (**self).is_remote()
            }
            fn epoch_order(&self, seed: Option<u64>, epoch: u64) -> Option<Vec<usize>> {
                (**self).epoch_order(seed, epoch)
            }
            fn memory(&self) -> u64 {
                (**self).memory()
            }
        }
    };
}
forward_source!(std::sync::Arc);
forward_source!(Box);

/// File extensions (lower case) that the file-backed sources treat as images.
pub(crate) const IMAGE_EXTENSIONS: &[&str] =
    &["jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"];

/// Whether `path` has one of [`IMAGE_EXTENSIONS`], matched case-insensitively.
pub(crate) fn is_image_path(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// Largest sample file a file-backed source reads (512 MiB): a larger one
/// is an error rather than an allocation of its size.
pub(crate) const MAX_FILE_BYTES: u64 = 512 << 20;

/// Reads a whole sample file into `bytes` (cleared first; its capacity is
/// reused), naming the file on failure.
pub(crate) fn read_file_into(path: &Path, mut bytes: Vec<u8>) -> Result<Vec<u8>> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_FILE_BYTES {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!("sample file is {len} bytes, over the {MAX_FILE_BYTES}-byte limit"),
            source: None,
        });
    }
    bytes.clear();
    bytes.reserve(len as usize);
    // `take` bounds the read even if the file grows after the size check.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&mut file, MAX_FILE_BYTES + 1),
        &mut bytes,
    )
    .map_err(io)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!("sample file grew over the {MAX_FILE_BYTES}-byte limit while read"),
            source: None,
        });
    }
    if bytes.is_empty() {
        return Err(Error::EmptyFile {
            key: path.display().to_string(),
        });
    }
    Ok(bytes)
}

/// Record `index` of a list of labelled files (the path is the key), its
/// bytes read into `bytes`.
pub(crate) fn read_labeled(
    samples: &[(PathBuf, u32)],
    index: usize,
    bytes: Vec<u8>,
) -> Result<Record> {
    check_index(index, samples.len())?;
    let (path, label) = &samples[index];
    Ok(Record::encoded(
        path.display().to_string(),
        crate::storage::read_whole(path, bytes, MAX_FILE_BYTES)?,
        *label,
    ))
}

/// How the loader retries reads that fail with a transient error
/// ([`Error::is_transient`]) in the streaming mode: see [`read_retrying`].
#[derive(Clone)]
pub(crate) struct Retry {
    pub(crate) retries: u32,
    pub(crate) cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(crate) on_retry: std::sync::Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Retry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retry")
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// `source.read_parts(index, parts, bytes)`, tried up to `retries` more
/// times while it fails with a transient error ([`Error::is_transient`]),
/// waiting as [`retry_wait`] says, calling `on_retry` for each retry. An
/// error after retries says how many tries there were ([`Error::Retried`]).
/// Once `cancel` is set (the epoch is dropped) no more tries are made: the
/// last error comes back at once (the sample is not delivered, so what it
/// says matters to no one, and a read that keeps failing may take seconds
/// a try).
pub(crate) fn read_retrying(
    source: &dyn Source,
    (index, parts, bytes): (usize, &Parts, Vec<u8>),
    retries: u32,
    cancel: &std::sync::atomic::AtomicBool,
    on_retry: &dyn Fn(),
) -> Result<Record> {
    let mut bytes = Some(bytes);
    retrying(retries, cancel, on_retry, || {
        source.read_parts(index, parts, bytes.take().unwrap_or_default())
    })
}

/// Runs `attempt` until it succeeds, fails with an error that is not
/// transient, was tried `retries` more times, or `cancel` is set: waiting
/// as [`retry_wait`] says and calling `on_retry` before each retry. The
/// error after more than one try says how many ([`Error::Retried`]). A
/// source's reads ([`read_retrying`]) and a map's run are retried so.
pub(crate) fn retrying<T>(
    retries: u32,
    cancel: &std::sync::atomic::AtomicBool,
    on_retry: &dyn Fn(),
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    use std::sync::atomic::Ordering;
    let mut result = attempt();
    let mut attempts = 1;
    while let Err(e) = &result {
        if attempts > retries || !e.is_transient() {
            break;
        }
        retry_wait(attempts, cancel);
        if cancel.load(Ordering::Relaxed) {
            break;
        }
        on_retry();
        attempts += 1;
        result = attempt();
    }
    result.map_err(|e| tried(e, attempts))
}

/// The longest wait between two tries of a read.
const RETRY_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(200);

/// The wait before retry number `attempts` of a read: 10, 20, 40, 80,
/// 160, then 200 ms ([`RETRY_WAIT_MAX`]).
fn retry_delay(attempts: u32) -> std::time::Duration {
    let doubled = 10u64 << attempts.saturating_sub(1).min(5);
    std::time::Duration::from_millis(doubled).min(RETRY_WAIT_MAX)
}

/// Waits before retry number `attempts` of a read as [`retry_delay`]
/// says, cut short by `cancel`.
pub(crate) fn retry_wait(attempts: u32, cancel: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let until = Instant::now() + retry_delay(attempts);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if cancel.load(Ordering::Relaxed) || left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(2)));
    }
}

/// A read's error after `attempts` tries: [`Error::Retried`] when there
/// was more than one.
pub(crate) fn tried(e: Error, attempts: u32) -> Error {
    match attempts {
        0 | 1 => e,
        attempts => Error::Retried {
            attempts,
            source: Box::new(e),
        },
    }
}

/// The key of file `index` of a list of labelled files.
pub(crate) fn labeled_key(samples: &[(PathBuf, u32)], index: usize) -> String {
    samples
        .get(index)
        .map_or_else(|| format!("#{index}"), |(p, _)| p.display().to_string())
}

/// A checksum of labelled samples: each path relative to `root` (the
/// full path when it is not under it) and its label, in order.
pub(crate) fn labeled_digest(samples: &[(PathBuf, u32)], root: &Path) -> u32 {
    samples.iter().fold(0, |crc, (path, label)| {
        let rel = path.strip_prefix(root).unwrap_or(path);
        let crc = crc32c::crc32c_append(crc, rel.as_os_str().as_encoded_bytes());
        crc32c::crc32c_append(crc, &label.to_le_bytes())
    })
}

/// Checks `index` against `len`.
pub(crate) fn check_index(index: usize, len: usize) -> Result<()> {
    if index < len {
        Ok(())
    } else {
        Err(Error::IndexOutOfRange { index, len })
    }
}

impl std::fmt::Debug for dyn Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Source({} samples)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_extensions_match_case_insensitively() {
        assert!(is_image_path(Path::new("a/b.JPG")));
        assert!(is_image_path(Path::new("a/b.jpeg")));
        assert!(is_image_path(Path::new("b.Png")));
        assert!(!is_image_path(Path::new("b.txt")));
        assert!(!is_image_path(Path::new("jpg")));
    }

    /// The waits double from 10 ms up to the documented 200 ms.
    #[test]
    fn retry_waits_double_up_to_200_ms() {
        let waits: Vec<u128> = (1..=8).map(|a| retry_delay(a).as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 200, 200, 200]);
    }
}
