//! Ranged reads of Parquet files, local or in object storage, for the
//! `parquet` crate's readers: the footer by its own ranges, a row group's
//! projected column chunks fetched together (concurrently from a store)
//! and decoded from memory; and the bounded cache of decoded row groups.

use crate::error::{Error, Result};
use crate::storage::Blob;
use arrow_array::RecordBatch;
use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Ranges closer than this are fetched as one request.
const COALESCE: u64 = 1 << 20;

/// Bytes a read from an offset (a footer's parse, a page header outside
/// the chunks fetched) gets at most: what a footer or header can need.
const OUTSIDE_READ: u64 = 64 << 20;

/// What a dataset's files read: bytes, and (when asked, for tests) the
/// ranges.
#[derive(Debug, Default)]
pub(super) struct Reads {
    pub(super) bytes: AtomicU64,
    pub(super) record: AtomicBool,
    pub(super) ranges: Mutex<Vec<(PathBuf, Range<u64>)>>,
}

/// One Parquet file, open for positioned reads.
#[derive(Debug)]
pub(super) struct ParquetFile {
    pub(super) path: PathBuf,
    blob: Blob,
    len: u64,
    reads: Arc<Reads>,
}

impl ParquetFile {
    pub(super) fn open(path: &Path, reads: Arc<Reads>) -> Result<Self> {
        let (blob, len) = Blob::open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            blob,
            len,
            reads,
        })
    }

    /// File `path` as `manifest` lists it (`listed`): opened with no
    /// request when it has a version, its reads pinned to it.
    pub(super) fn open_listed(
        path: &Path,
        (manifest, listed): (&Path, &crate::formats::shards::manifest::Listed),
        reads: Arc<Reads>,
    ) -> Result<Self> {
        let (blob, len) = crate::formats::shards::manifest::open_listed(path, manifest, listed)?;
        Ok(Self {
            path: path.to_path_buf(),
            blob,
            len,
            reads,
        })
    }

    pub(super) fn size(&self) -> u64 {
        self.len
    }

    /// The object's version (entity tag), for a file in a store that
    /// gives one.
    pub(super) fn version(&self) -> Option<String> {
        self.blob.version()
    }

    /// Bytes `range` of the file, counted.
    pub(super) fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.count(&range);
        let mut buf = vec![0; (range.end - range.start) as usize];
        self.blob.read_exact_at(&self.path, range.start, &mut buf)?;
        Ok(Bytes::from(buf))
    }

    fn count(&self, range: &Range<u64>) {
        self.reads
            .bytes
            .fetch_add(range.end - range.start, Ordering::Relaxed);
        if self.reads.record.load(Ordering::Relaxed) {
            crate::sync::lock(&self.reads.ranges).push((self.path.clone(), range.clone()));
        }
    }

    /// `ranges` of the file, coalesced where close, fetched at once
    /// (concurrent requests to a store).
    pub(super) fn fetch(self: &Arc<Self>, mut ranges: Vec<Range<u64>>) -> Result<Chunks> {
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in ranges {
            match merged.last_mut() {
                Some(m) if r.start <= m.end + COALESCE => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let parts = match &self.blob {
            #[cfg(feature = "remote")]
            Blob::Remote(o) => {
                let pending: Vec<_> = merged
                    .iter()
                    .map(|r| {
                        self.count(r);
                        o.start_range(r.clone(), true)
                    })
                    .collect();
                merged
                    .iter()
                    .zip(pending)
                    .map(|(r, p)| Ok((r.start, p.wait()?)))
                    .collect::<Result<Vec<_>>>()?
            }
            _ => merged
                .iter()
                .map(|r| Ok((r.start, self.read(r.clone())?)))
                .collect::<Result<Vec<_>>>()?,
        };
        Ok(Chunks {
            file: self.clone(),
            parts,
        })
    }

    /// A `parquet` error about this file as the loader's error.
    pub(super) fn error(
        &self,
        what: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Dataset {
            path: self.path.clone(),
            reason: what.to_string(),
            source: Some(Box::new(e)),
        }
    }
}

fn to_parquet(e: Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl Length for ParquetFile {
    fn len(&self) -> u64 {
        self.len
    }
}

/// Reads of the footer and page index go straight to the file.
impl ChunkReader for ParquetFile {
    type T = std::io::Cursor<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        // The footer is read through here (the decoder reads from
        // `Chunks`), and a page header a chunk's size in the footer left
        // out: a bounded window, never the rest of a remote file.
        let end = self.len.min(start.saturating_add(OUTSIDE_READ));
        let bytes = self.read(start.min(end)..end).map_err(to_parquet)?;
        Ok(std::io::Cursor::new(bytes))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.read(start..start + length as u64).map_err(to_parquet)
    }
}

/// A row group's fetched column chunks: the decoder's reads are served
/// from them (a read outside them goes to the file, counted).
#[derive(Debug)]
pub(super) struct Chunks {
    file: Arc<ParquetFile>,
    parts: Vec<(u64, Bytes)>,
}

impl Chunks {
    fn slice(&self, start: u64, length: usize) -> Option<Bytes> {
        let end = start + length as u64;
        self.parts.iter().find_map(|(at, bytes)| {
            let last = at + bytes.len() as u64;
            (start >= *at && end <= last)
                .then(|| bytes.slice((start - at) as usize..(end - at) as usize))
        })
    }
}

impl Length for Chunks {
    fn len(&self) -> u64 {
        self.file.len
    }
}

impl ChunkReader for Chunks {
    type T = std::io::Cursor<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let part = self
            .parts
            .iter()
            .find(|(at, b)| start >= *at && start < at + b.len() as u64);
        match part {
            Some((at, bytes)) => Ok(std::io::Cursor::new(bytes.slice((start - at) as usize..))),
            None => self.file.get_read(start),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self.slice(start, length) {
            Some(b) => Ok(b),
            None => self.file.get_bytes(start, length),
        }
    }
}

/// A decoded row group of a projection.
pub(super) type Key = (usize, usize, u64);

/// One cache entry: the decoder holds its lock while it decodes, so a
/// row group is decoded once however many workers want it at once (they
/// wait); a failed decode leaves it empty for the next to try.
#[derive(Debug, Default)]
struct Slot {
    batch: Mutex<Option<Arc<RecordBatch>>>,
}

/// Decoded row groups, the most recently used kept: at most `capacity`
/// of them and `max_bytes` of memory, counting the groups being decoded
/// (at the size their footer gives, until they are done). A group over
/// the limit on its own is refused before it is fetched.
#[derive(Debug)]
pub(super) struct RowGroupCache {
    capacity: usize,
    max_bytes: u64,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    slots: HashMap<Key, Arc<Slot>>,
    /// Least recently used first.
    order: VecDeque<Key>,
    /// Bytes of each row group held (decoded) or being decoded (its
    /// footer's estimate).
    bytes: HashMap<Key, u64>,
    total: u64,
}

impl CacheState {
    fn forget(&mut self, key: &Key) {
        self.slots.remove(key);
        if let Some(b) = self.bytes.remove(key) {
            self.total -= b;
        }
        if let Some(i) = self.order.iter().position(|k| k == key) {
            self.order.remove(i);
        }
    }
}

impl RowGroupCache {
    pub(super) fn new(capacity: usize, max_bytes: u64) -> Self {
        Self {
            capacity: capacity.max(1),
            max_bytes,
            state: Mutex::default(),
        }
    }

    /// The limit in bytes.
    pub(super) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Whether row group `key` is held or being decoded.
    pub(super) fn contains(&self, key: Key) -> bool {
        crate::sync::lock(&self.state).slots.contains_key(&key)
    }

    /// Whether `bytes` more would fit beside what is held and being
    /// decoded (for read-ahead, which does not evict to make room).
    pub(super) fn has_room(&self, bytes: u64) -> bool {
        crate::sync::lock(&self.state).total + bytes <= self.max_bytes
    }

    /// Bytes of the decoded row groups held and being decoded.
    pub(super) fn memory(&self) -> u64 {
        crate::sync::lock(&self.state).total
    }

    /// Row group `key`, decoded by `decode` unless held (or being decoded
    /// by another thread, which this one waits for); `estimate` is its
    /// decoded size as its footer gives it, counted until it is decoded.
    pub(super) fn get(
        &self,
        key: Key,
        estimate: u64,
        decode: impl FnOnce() -> Result<RecordBatch>,
    ) -> Result<Arc<RecordBatch>> {
        let slot = {
            let mut s = crate::sync::lock(&self.state);
            if let Some(i) = s.order.iter().position(|k| *k == key) {
                s.order.remove(i);
            }
            s.order.push_back(key);
            let slot = s.slots.entry(key).or_default().clone();
            if let std::collections::hash_map::Entry::Vacant(e) = s.bytes.entry(key) {
                e.insert(estimate);
                s.total += estimate;
            }
            while s.order.len() > 1 && (s.order.len() > self.capacity || s.total > self.max_bytes) {
                let old = s.order.pop_front().expect("more than one");
                s.forget(&old);
            }
            slot
        };
        let mut held = crate::sync::lock(&slot.batch);
        if let Some(b) = &*held {
            return Ok(b.clone());
        }
        let decoded = decode();
        let mut s = crate::sync::lock(&self.state);
        let mine = s.slots.get(&key).is_some_and(|k| Arc::ptr_eq(k, &slot));
        let batch = match decoded {
            Ok(b) => Arc::new(b),
            Err(e) => {
                if mine {
                    s.forget(&key);
                }
                return Err(e);
            }
        };
        *held = Some(batch.clone());
        drop(held);
        if mine {
            let size = batch.get_array_memory_size() as u64;
            let old = s.bytes.insert(key, size).unwrap_or(0);
            s.total = s.total - old + size;
            // Decoded larger than its footer said: others make room.
            while s.total > self.max_bytes {
                let Some(&oldest) = s.order.iter().find(|k| **k != key) else {
                    break;
                };
                s.forget(&oldest);
            }
        }
        Ok(batch)
    }
}
