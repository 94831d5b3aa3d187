//! The source contract: what one sample is ([`Record`], its named parts
//! [`Value`]), which parts a map asks for ([`Parts`]), and how a dataset
//! gives its samples ([`Source`]). Every format, combinator and user source
//! implements it; the loader reads through nothing else.

use crate::error::{Error, Result};
use crate::geometry::Size;
use std::path::PathBuf;
use std::sync::Arc;

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
///
/// Beside the reads (`len`, `read`, `read_reusing`, `read_parts`), every
/// method is a hint with a default that is right for a source that does
/// not override it. A wrapper around another source forwards them all
/// with [`forward_hints!`](crate::forward_hints) (the `Arc` and `Box`
/// impls forward everything, [`Mixture`](crate::source::Mixture) combines
/// its members').
///
/// When the trait may grow: a new method needs a use in the loader and
/// two sources that answer it differently; it comes with a default that
/// is right for every source that does not override it, named for what
/// the loader does with the answer, and it is added to `forward_hints!`
/// and the `Arc`/`Box` forwarding in the same change. What only one
/// format has belongs to that format's own type.
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
    /// [`ShardOptions::skip_damaged`](crate::source::ShardOptions::skip_damaged); empty otherwise.
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

    /// Whether the loader should read records ahead of its workers:
    /// when a read waits on the network (objects in S3, GCS, Azure or on
    /// an HTTP server), the loader reads the next records of the plan
    /// concurrently, as deep as the measured latency needs (and in the
    /// streaming mode starts the next shards' streams early). The default:
    /// whether any of [`shards`](Self::shards) is a URL. A source that
    /// reads ahead itself (Parquet, by row group) says `false`; one whose
    /// samples are remote files says `true`.
    fn wants_read_ahead(&self) -> bool {
        self.shards()
            .iter()
            .any(|s| crate::storage::is_url(&s.path))
    }

    /// Called by a loader before the first read of each epoch (and again
    /// for the epoch under way when it resumes or
    /// [`batches`](crate::Loader::batches) starts): the order of epoch
    /// `epoch`'s samples, when the source decides it, and the moment to
    /// prepare its reads (Parquet plans its row-group read-ahead along the
    /// order it gives; asked again for the same `(seed, epoch)` it keeps
    /// the reads under way). Two loaders running different epochs over
    /// one Parquet source take turns at that plan, reading ahead for the
    /// one that asked last.
    ///
    /// The order (a [`Mixture`](crate::source::Mixture) places its
    /// members' samples by weight, a Parquet source shuffles by block):
    /// an [`EpochOrder`] of `len()` positions, each an index below
    /// `len()`, repeats allowed, a pure function of `seed` (the loader's
    /// [`shuffle`](crate::LoaderBuilder::shuffle) seed, `None` without a
    /// shuffle) and `epoch`. The loader asks it only at the positions this
    /// rank reads, so an order that computes a position on demand costs
    /// nothing of the epoch's size; a `Vec<usize>` is one too. The loader
    /// cuts it into batches and ranks as it does its own permutation (with
    /// a seed, each stretch of `world_size * batch_size` is shuffled within
    /// itself), and resumes it exactly. `None` (the default): the loader's
    /// permutation. Only the random-access mode asks.
    fn begin_epoch(&self, seed: Option<u64>, epoch: u64) -> Option<Arc<dyn EpochOrder>> {
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

/// An epoch's order as a source gives it ([`Source::begin_epoch`]):
/// which source index sits at each position, asked position by position.
///
/// An order computed on demand (a keyed permutation, a block shuffle, a
/// mixture's placement) holds nothing of the epoch's size, and a loader
/// asks it only at the positions its rank reads: the same order serves one
/// rank or ten thousand. A `Vec<usize>` is an order too, for a source
/// small enough to list its epoch.
pub trait EpochOrder: Send + Sync + std::fmt::Debug {
    /// Positions in the epoch.
    fn len(&self) -> usize;

    /// Whether the epoch has no position.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The source index at `position` (below [`len`](Self::len)).
    fn at(&self, position: usize) -> usize;

    /// Every position's index, in order: `len()` entries (for small
    /// orders and tests).
    fn to_vec(&self) -> Vec<usize> {
        (0..self.len()).map(|p| self.at(p)).collect()
    }
}

impl EpochOrder for Vec<usize> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn at(&self, position: usize) -> usize {
        self[position]
    }

    fn to_vec(&self) -> Vec<usize> {
        self.clone()
    }
}

/// One shard of a sharded source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard file.
    pub path: PathBuf,
    /// Records in the shard (after any damaged tail was left out).
    pub records: usize,
    /// Index of the shard's first record in the source.
    pub first: usize,
}

/// A region of a shard that was left out because it is damaged; see
/// [`ShardOptions::skip_damaged`](crate::source::ShardOptions::skip_damaged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The shard file.
    pub path: PathBuf,
    /// Byte offset where the damage starts.
    pub offset: u64,
    /// What is wrong there.
    pub reason: String,
}

/// Forwards every hint of [`Source`] (all but the reads: `key`, `shards`,
/// `damage`, `digest`, `wants_read_ahead`, `begin_epoch`, `memory`) to a
/// field holding the wrapped source, inside a wrapper's `impl Source`: the
/// wrapper writes its reads, and keeps the source's order, read-ahead,
/// shards, resume checksum and memory without naming each (a hint added
/// to the trait later is forwarded too). `stream_shard` is left at its
/// default, so the streaming mode reads through the wrapper's
/// `read_parts`.
///
/// ```
/// use candle_wick::source::{MemorySource, Parts, Record, Source};
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// /// Counts the bytes read from any source.
/// struct Counted<S> {
///     inner: S,
///     bytes: AtomicU64,
/// }
///
/// impl<S: Source> Source for Counted<S> {
///     fn len(&self) -> usize {
///         self.inner.len()
///     }
///     fn read(&self, index: usize) -> candle_wick::Result<Record> {
///         self.read_parts(index, &Parts::Default, Vec::new())
///     }
///     fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> candle_wick::Result<Record> {
///         let record = self.inner.read_parts(index, parts, bytes)?;
///         self.bytes.fetch_add(record.bytes.len() as u64, Ordering::Relaxed);
///         Ok(record)
///     }
///     candle_wick::forward_hints!(inner);
/// }
///
/// let inner = MemorySource::new(vec![Record::encoded("a", vec![1, 2, 3], 0)]);
/// let counted = Counted { inner, bytes: AtomicU64::new(0) };
/// counted.read(0).unwrap();
/// assert_eq!(counted.bytes.load(Ordering::Relaxed), 3);
/// ```
#[macro_export]
macro_rules! forward_hints {
    ($field:tt) => {
        fn key(&self, index: usize) -> ::std::string::String {
            $crate::Source::key(&self.$field, index)
        }
        fn shards(&self) -> &[$crate::source::ShardInfo] {
            $crate::Source::shards(&self.$field)
        }
        fn damage(&self) -> &[$crate::source::Damage] {
            $crate::Source::damage(&self.$field)
        }
        fn digest(&self) -> u32 {
            $crate::Source::digest(&self.$field)
        }
        fn wants_read_ahead(&self) -> bool {
            $crate::Source::wants_read_ahead(&self.$field)
        }
        fn begin_epoch(
            &self,
            seed: ::std::option::Option<u64>,
            epoch: u64,
        ) -> ::std::option::Option<::std::sync::Arc<dyn $crate::source::EpochOrder>> {
            $crate::Source::begin_epoch(&self.$field, seed, epoch)
        }
        fn memory(&self) -> u64 {
            $crate::Source::memory(&self.$field)
        }
    };
}

/// The reads a source derives from its general one, inside its
/// `impl Source`: `read` and `read_reusing` through `read_parts` with the
/// default parts (`reads_through!(read_parts)`), or `read` through
/// `read_reusing` with a new buffer (`reads_through!(read_reusing)`).
macro_rules! reads_through {
    (read_parts) => {
        fn read(&self, index: usize) -> crate::error::Result<crate::contract::Record> {
            self.read_parts(index, &crate::contract::Parts::Default, Vec::new())
        }
        fn read_reusing(
            &self,
            index: usize,
            bytes: Vec<u8>,
        ) -> crate::error::Result<crate::contract::Record> {
            self.read_parts(index, &crate::contract::Parts::Default, bytes)
        }
    };
    (read_reusing) => {
        fn read(&self, index: usize) -> crate::error::Result<crate::contract::Record> {
            self.read_reusing(index, Vec::new())
        }
    };
}
pub(crate) use reads_through;

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
            fn wants_read_ahead(&self) -> bool {
                (**self).wants_read_ahead()
            }
            fn begin_epoch(
                &self,
                seed: Option<u64>,
                epoch: u64,
            ) -> Option<std::sync::Arc<dyn EpochOrder>> {
                (**self).begin_epoch(seed, epoch)
            }
            fn memory(&self) -> u64 {
                (**self).memory()
            }
        }
    };
}
forward_source!(std::sync::Arc);
forward_source!(Box);

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
    use std::path::PathBuf;

    /// A source whose every hint differs from the default.
    struct Hinted {
        shards: Vec<ShardInfo>,
        damage: Vec<Damage>,
    }

    impl Source for Hinted {
        fn len(&self) -> usize {
            3
        }
        fn read(&self, index: usize) -> Result<Record> {
            Ok(Record::encoded(format!("r{index}"), vec![1], 0))
        }
        fn key(&self, index: usize) -> String {
            format!("hinted-{index}")
        }
        fn shards(&self) -> &[ShardInfo] {
            &self.shards
        }
        fn damage(&self) -> &[Damage] {
            &self.damage
        }
        fn digest(&self) -> u32 {
            77
        }
        fn wants_read_ahead(&self) -> bool {
            true
        }
        fn begin_epoch(&self, seed: Option<u64>, epoch: u64) -> Option<Arc<dyn EpochOrder>> {
            Some(Arc::new(vec![
                2,
                seed.unwrap_or(0) as usize % 3,
                epoch as usize % 3,
            ]))
        }
        fn memory(&self) -> u64 {
            4096
        }
    }

    /// A wrapper that writes only its reads.
    struct Wrapped {
        inner: Hinted,
    }

    impl Source for Wrapped {
        fn len(&self) -> usize {
            self.inner.len()
        }
        fn read(&self, index: usize) -> Result<Record> {
            self.inner.read(index)
        }
        forward_hints!(inner);
    }

    /// Every hint reaches a wrapper that forwards with `forward_hints!`:
    /// none is silently left at its default.
    #[test]
    fn forward_hints_keeps_every_hint() {
        let path = PathBuf::from("s.tar");
        let inner = Hinted {
            shards: vec![ShardInfo {
                path: path.clone(),
                records: 3,
                first: 0,
            }],
            damage: vec![Damage {
                path,
                offset: 9,
                reason: "cut".into(),
            }],
        };
        let w = Wrapped { inner };
        let i = &w.inner;
        assert_eq!(w.key(1), i.key(1));
        assert_eq!(w.shards(), i.shards());
        assert_eq!(w.damage(), i.damage());
        assert_eq!(w.digest(), i.digest());
        assert_eq!(w.wants_read_ahead(), i.wants_read_ahead());
        let order = |s: &dyn Source| s.begin_epoch(Some(4), 5).map(|o| o.to_vec());
        assert_eq!(order(&w), order(i));
        assert_eq!(w.memory(), i.memory());
    }
}
