//! One sample on a decode worker: read (or a cache hit), decode and
//! transform straight into its slot, and the cache fill of a first read.

use super::feed::PreRead;
use super::fill::Outcome;
use super::{panic_message, safe_key, Shared};
use crate::cache::{Cache, CacheMode};
use crate::error::{Error, Result};
use crate::layout::Slot;
use crate::source::Record;
use crate::stats::trace::LANE_DECODE;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Puts a record just read into the cache (decoded first under
/// [`CacheMode::Decoded`](crate::CacheMode::Decoded) when the decode can be kept exactly), within what
/// the RAM budget leaves; the record comes back as the worker will use it.
pub(super) fn fill_cache(
    shared: &Shared,
    cache: &Cache,
    index: usize,
    record: Record,
) -> Result<Record, (String, Error)> {
    let record = match (cache.mode, record.rgb_size) {
        (CacheMode::Decoded, None) => {
            let mut px = Vec::new();
            match crate::decode::decode_for_cache(&record.key, &record.bytes, &mut px)
                .map_err(|e| (record.key.clone(), e))?
            {
                Some(wh) => {
                    px.truncate(wh.area() * 3);
                    Record {
                        bytes: px,
                        rgb_size: Some(wh),
                        ..record
                    }
                }
                // Kept encoded: decoded every epoch as an uncached run does.
                None => record,
            }
        }
        _ => record,
    };
    let k = &shared.knobs;
    let (f, p, w) = (
        k.in_flight.load(Ordering::Relaxed),
        k.prefetch.load(Ordering::Relaxed),
        k.gate.limit(),
    );
    if cache.put(index, &record, |after| k.budget.fits(f, p, w, after)) {
        shared.counters.cache_stored(record.bytes.len() as u64);
    }
    Ok(record)
}

/// Reads, decodes and transforms sample `index` into `slot`.
pub(super) fn process(
    shared: &Shared,
    epoch: u64,
    index: usize,
    slot: Slot<'_>,
    cancel: &AtomicBool,
    pre: PreRead,
) -> Outcome {
    if cancel.load(Ordering::Relaxed) {
        return Outcome::Cancelled;
    }
    let _pass = shared.knobs.gate.enter();
    // Again: the wait for a worker slot may have outlasted the epoch.
    if cancel.load(Ordering::Relaxed) {
        return Outcome::Cancelled;
    }
    // Taken after the gate, so the scratch held is the active workers'.
    let mut scratch = shared.knobs.budget.scratch.take(shared.knobs.gate.limit());
    let start = Instant::now();
    let run = || -> Result<(String, u32), (Option<String>, Error)> {
        let t0 = Instant::now();
        // A cache entry that cannot be read back is a miss: the source
        // gives what an uncached run reads (and the error is counted).
        let cached = match shared.cache.as_ref().and_then(|c| c.get(index)) {
            Some(Err(e)) => {
                shared.counters.cache_error(&e);
                None
            }
            hit => hit,
        };
        let hit = cached.is_some();
        let (record, read) = match (cached, pre) {
            (Some(r), _) => {
                shared.counters.cache_hit();
                (r, t0.elapsed())
            }
            (None, Some((record, read))) => (record, read),
            (None, None) => {
                let bytes = scratch.take_read_buffer();
                (shared.source.read_reusing(index, bytes), t0.elapsed())
            }
        };
        let mut record = record.map_err(|e| (None, e))?;
        if let (Some(cache), false) = (&shared.cache, hit) {
            record = fill_cache(shared, cache, index, record).map_err(|(k, e)| (Some(k), e))?;
        }
        let tr = &shared.transform;
        let times = match record.rgb_size {
            None => tr.apply_with(&mut scratch, &record.key, &record.bytes, epoch, index, slot),
            Some(wh) => {
                let t = Instant::now();
                let s = &mut scratch;
                tr.apply_decoded_with(s, &record.key, &record.bytes, wh, epoch, index, slot)
                    .map(|()| crate::stats::SampleTimes {
                        decode: Duration::ZERO,
                        transform: t.elapsed(),
                        decoded_bytes: record.bytes.len() as u64,
                    })
            }
        }
        .map_err(|e| (Some(record.key.clone()), e))?;
        shared.counters.sample(read, &times);
        scratch.recycle_read_buffer(record.bytes);
        Ok((record.key, record.label))
    };
    let result = catch_unwind(AssertUnwindSafe(run));
    if let Some(trace) = &shared.trace {
        let lane = LANE_DECODE + rayon::current_thread_index().unwrap_or(0) as u64;
        trace.record("read+decode+transform", lane, start, Instant::now());
    }
    match result {
        Ok(Ok((key, label))) => Outcome::Ok { key, label },
        Ok(Err((key, error))) => Outcome::Failed {
            key: key.unwrap_or_else(|| safe_key(shared, index)),
            error,
        },
        Err(payload) => {
            let key = safe_key(shared, index);
            Outcome::Failed {
                error: Error::WorkerPanic {
                    key: key.clone(),
                    message: panic_message(payload.as_ref()),
                },
                key,
            }
        }
    }
}
