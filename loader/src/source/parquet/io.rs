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

    pub(super) fn size(&self) -> u64 {
        self.len
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
            crate::lock(&self.reads.ranges).push((self.path.clone(), range.clone()));
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
                        o.start_range(r.clone())
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
        // Only the footer is read through here (the decoder reads from
        // `Chunks`): from `start` to the end.
        let bytes = self.read(start..self.len).map_err(to_parquet)?;
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

/// Decoded row groups, the most recently used kept, at most `capacity`.
#[derive(Debug)]
pub(super) struct RowGroupCache {
    capacity: usize,
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    slots: HashMap<Key, Arc<Slot>>,
    /// Least recently used first.
    order: VecDeque<Key>,
    /// Decoded bytes of the row groups held.
    bytes: HashMap<Key, u64>,
}

impl RowGroupCache {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            state: Mutex::default(),
        }
    }

    /// Whether row group `key` is held or being decoded.
    pub(super) fn contains(&self, key: Key) -> bool {
        crate::lock(&self.state).slots.contains_key(&key)
    }

    /// Bytes of the decoded row groups held.
    pub(super) fn memory(&self) -> u64 {
        crate::lock(&self.state).bytes.values().sum()
    }

    /// Row group `key`, decoded by `decode` unless held (or being decoded
    /// by another thread, which this one waits for).
    pub(super) fn get(
        &self,
        key: Key,
        decode: impl FnOnce() -> Result<RecordBatch>,
    ) -> Result<Arc<RecordBatch>> {
        let slot = {
            let mut s = crate::lock(&self.state);
            if let Some(i) = s.order.iter().position(|k| *k == key) {
                s.order.remove(i);
            }
            s.order.push_back(key);
            let slot = s.slots.entry(key).or_default().clone();
            while s.order.len() > self.capacity {
                let old = s.order.pop_front().expect("over capacity");
                s.slots.remove(&old);
                s.bytes.remove(&old);
            }
            slot
        };
        let mut held = crate::lock(&slot.batch);
        if let Some(b) = &*held {
            return Ok(b.clone());
        }
        let batch = Arc::new(decode()?);
        *held = Some(batch.clone());
        drop(held);
        let mut s = crate::lock(&self.state);
        if s.slots.get(&key).is_some_and(|k| Arc::ptr_eq(k, &slot)) {
            s.bytes.insert(key, batch.get_array_memory_size() as u64);
        }
        Ok(batch)
    }
}
