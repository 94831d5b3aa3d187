//! Large ranged reads for the shard-block shuffle
//! ([`LoaderBuilder::shard_blocks`](crate::LoaderBuilder::shard_blocks)):
//! a loader's reads of remote shards go through chunks of 32 MiB (the
//! whole object when smaller), each fetched with one ranged GET and kept
//! in memory, least recently used first out, within a byte limit. Under
//! that order a rank reads one window of a few shards at a time, so a
//! chunk serves every sample in it: a request per 32 MiB instead of one
//! or more per sample, and each byte fetched about once.
//!
//! With a cache directory ([`RemoteCache::disk`](crate::storage::RemoteCache::disk))
//! the chunks go to the node's copy of each object in it instead
//! (`remote/chunks.rs`: a sparse file a chunk at a time, fetched by one
//! process of the node under a lock, the others finding it there), so a
//! window may be many times the memory, the ranks of a node that share a
//! part fetch its chunks once, and the directory's limit evicts the
//! oldest copies.
//!
//! A chunk wanted by several threads at once is fetched by the first; the
//! others wait for it (a fetch that fails or panics wakes them, and the
//! next one tries again). The loader's workers and read-ahead threads run
//! their reads inside [`Spans::run`]; reads anywhere else (an index pass,
//! a stream, another loader) are untouched.

use super::remote::chunks::Chunks;
use super::remote::Object;
use super::Bytes;
use crate::error::Result;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// One chunk's place in the memory.
#[derive(Debug)]
enum Slot {
    /// Being fetched by some thread.
    Fetching,
    /// Fetched; `used` is the tick of its last read.
    Ready { bytes: Bytes, used: u64 },
}

/// Most objects whose copies in the cache directory a loader keeps open.
const OPEN_COPIES: usize = 256;

#[derive(Debug, Default)]
struct State {
    /// By object key and chunk number.
    chunks: HashMap<(Arc<str>, u64), Slot>,
    /// Bytes of the chunks held and being fetched.
    held: u64,
    tick: u64,
    /// Objects' copies in the cache directory, open, with their last use.
    copies: HashMap<Arc<str>, (Arc<Chunks>, u64)>,
}

/// A loader's chunks of remote shards in memory ([module docs](self)).
#[derive(Debug)]
pub(crate) struct Spans {
    chunk: u64,
    capacity: u64,
    state: Mutex<State>,
    changed: Condvar,
}

thread_local! {
    static SPANS: std::cell::RefCell<Option<Arc<Spans>>> = const { std::cell::RefCell::new(None) };
}

impl Spans {
    /// Chunks kept within `capacity` bytes (a chunk being read is kept
    /// while it is read, whatever the limit).
    pub(crate) fn new(capacity: u64) -> Arc<Self> {
        Arc::new(Self {
            chunk: super::remote::chunks::chunk_bytes(),
            capacity,
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    /// Bytes of chunks held in memory now (and being fetched into it).
    pub(crate) fn memory(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).held
    }

    /// Runs `f` with `spans` serving this thread's reads of remote blobs
    /// (none: as they are).
    pub(crate) fn run<T>(spans: Option<&Arc<Self>>, f: impl FnOnce() -> T) -> T {
        let Some(spans) = spans else { return f() };
        let outer = SPANS.with(|s| s.borrow_mut().replace(spans.clone()));
        // Put back even if `f` panics.
        struct Restore(Option<Arc<Spans>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                SPANS.with(|s| *s.borrow_mut() = self.0.take());
            }
        }
        let _restore = Restore(outer);
        f()
    }

    /// A read of `buf.len()` bytes of `o` at `offset` through the thread's
    /// chunks, if [`run`](Self::run) set them and the bytes are inside the
    /// object (else the caller reads, and says what is wrong).
    pub(crate) fn read(o: &Object, offset: u64, buf: &mut [u8]) -> Option<Result<()>> {
        let spans = SPANS.with(|s| s.borrow().clone())?;
        let end = offset.checked_add(buf.len() as u64)?;
        if buf.is_empty() || end > o.len() {
            return None;
        }
        Some(spans.read_at(o, offset, buf))
    }

    fn read_at(&self, o: &Object, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset + buf.len() as u64;
        if super::cache_has_dir() {
            return self.copy_of(o)?.read(offset, buf);
        }
        for c in offset / self.chunk..end.div_ceil(self.chunk) {
            let bytes = self.chunk_of(o, c)?;
            let start = c * self.chunk;
            let (from, to) = (offset.max(start), end.min(start + bytes.len() as u64));
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&bytes[(from - start) as usize..(to - start) as usize]);
        }
        Ok(())
    }

    /// `o`'s copy in the cache directory, open (kept open for the next
    /// reads, the least recently used closed past [`OPEN_COPIES`]).
    fn copy_of(&self, o: &Object) -> Result<Arc<Chunks>> {
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.tick += 1;
            let tick = state.tick;
            // Looked up by the key's text: no allocation on a read that finds it.
            if let Some((copy, used)) = state.copies.get_mut(o.key()) {
                *used = tick;
                return Ok(copy.clone());
            }
        }
        // Opened outside the lock (it may wait on another process's);
        // two threads opening one object at once both hold it until one
        // copy is kept: each is the same file.
        let copy = Chunks::of(o.clone())?.1;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.copies.len() >= OPEN_COPIES {
            let oldest = state
                .copies
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                state.copies.remove(&k);
            }
        }
        state.tick += 1;
        let tick = state.tick;
        let kept = state.copies.entry(o.key().into()).or_insert((copy, tick));
        Ok(kept.0.clone())
    }

    /// Chunk `c` of `o`: held, or fetched now (or by another thread, waited for).
    fn chunk_of(&self, o: &Object, c: u64) -> Result<Bytes> {
        let key: (Arc<str>, u64) = (o.key().into(), c);
        let range = c * self.chunk..((c + 1) * self.chunk).min(o.len());
        let size = range.end - range.start;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            state.tick += 1;
            let tick = state.tick;
            match state.chunks.get_mut(&key) {
                Some(Slot::Ready { bytes, used }) => {
                    *used = tick;
                    return Ok(bytes.clone());
                }
                Some(Slot::Fetching) => {
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                None => break,
            }
        }
        state.chunks.insert(key.clone(), Slot::Fetching);
        state.held += size;
        self.evict(&mut state);
        drop(state);
        // Whatever happens to the fetch (an error, a panic), the slot is
        // given up unless filled, and the waiters wake.
        struct Fetch<'a> {
            spans: &'a Spans,
            key: Option<(Arc<str>, u64)>,
            size: u64,
        }
        impl Drop for Fetch<'_> {
            fn drop(&mut self) {
                if let Some(key) = self.key.take() {
                    let mut state = self.spans.state.lock().unwrap_or_else(|e| e.into_inner());
                    state.chunks.remove(&key);
                    state.held -= self.size;
                    drop(state);
                    self.spans.changed.notify_all();
                }
            }
        }
        let mut fetch = Fetch {
            spans: self,
            key: Some(key),
            size,
        };
        let bytes = o.read_range(range, false)?;
        let key = fetch.key.take().unwrap_or_else(|| unreachable!());
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.tick += 1;
        let used = state.tick;
        state.chunks.insert(
            key,
            Slot::Ready {
                bytes: bytes.clone(),
                used,
            },
        );
        drop(state);
        self.changed.notify_all();
        Ok(bytes)
    }

    /// Drops the least recently read chunks until what is held fits the
    /// limit (or only chunks being fetched are left).
    fn evict(&self, state: &mut State) {
        while state.held > self.capacity {
            let oldest = state
                .chunks
                .iter()
                .filter_map(|(k, s)| match s {
                    Slot::Ready { used, bytes } => Some((*used, k.clone(), bytes.len() as u64)),
                    Slot::Fetching => None,
                })
                .min_by_key(|(used, ..)| *used);
            let Some((_, key, len)) = oldest else { return };
            state.chunks.remove(&key);
            state.held -= len;
        }
    }
}
