//! One sample on a decode worker: read (or a cache hit), run the map
//! straight into the sample's slots, pad its padded fields, and the cache
//! fill of a first read.

use super::feed::PreRead;
use super::fill::{Claimed, Outcome};
use super::{panic_message, safe_key, Shared};
use crate::cache::{Cache, CacheMode};
use crate::contract::Record;
use crate::error::{Error, Result};
use crate::map::{pad_fields, Sample};
use crate::read::retry::{read_retrying, retrying};
use crate::stats::trace::LANE_DECODE;
use crate::stats::SampleTally;
use crate::storage::spans::Spans;
use crate::transform::PooledScratch;
use crate::tune::GatePass;
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
            let limits = shared.decode_limits();
            // Decoded alone when over a worker's share (the cache's own
            // budget decides whether it is kept).
            let _oversize = limits.oversize(&record.bytes);
            // Crops of the built-in map's images may be decoded at a
            // reduced scale (a loader with a user map has no cache).
            let out = shared.transform.as_ref().map(|t| t.out_size());
            match crate::decode::decode_for_cache(&record.key, &record.bytes, &mut px, &limits, out)
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

/// What one worker holds while it runs a batch's samples: the worker
/// gate's pass and, from its first sample, a scratch (taken after the
/// pass, so the scratch held is the active workers'). Taken once per run
/// of samples, not per sample: for a cheap map (a token window is a 4 KiB
/// copy) the gate's lock and wake-up and the scratch pool's lock cost more
/// than the sample.
pub(super) struct Worker<'a> {
    shared: &'a Shared,
    /// The run's samples, added to the shared counters by [`count`](Self::count).
    tally: SampleTally,
    /// When the previous sample of the run ended: the next one's start
    /// (one clock read a sample fewer). For an untimed run, when the run's
    /// samples not yet counted began.
    clock: Option<Instant>,
    /// Whether each sample reads the clock. A direct run of cheap samples
    /// (a token window's whole work is about a microsecond, and two clock
    /// reads were 5% of it) is timed as a whole by [`count`](Self::count)
    /// instead; the trace's per-sample spans need the clock.
    timed: bool,
    /// Declared before the pass, so it is given back first: a worker let
    /// in by the returned pass then finds it free (no extra scratch made,
    /// no warm one freed as surplus).
    scratch: Option<PooledScratch<'a>>,
    _pass: GatePass<'a>,
}

impl<'a> Worker<'a> {
    /// A worker holding `pass`, a place in the worker gate. `timed`:
    /// whether each sample is timed, or only the run (not when tracing).
    pub(super) fn enter(shared: &'a Shared, timed: bool, pass: GatePass<'a>) -> Self {
        let timed = timed || shared.trace.is_some();
        Self {
            shared,
            tally: SampleTally::default(),
            clock: (!timed).then(Instant::now),
            timed,
            scratch: None,
            _pass: pass,
        }
    }

    /// Adds the run's samples to the shared counters: before the run's
    /// samples are released, so a batch's samples are all counted by the
    /// time it is handed over. An untimed run's time is split between
    /// reading and the map as the samples timed so far split theirs.
    pub(super) fn count(&mut self) {
        let counters = &self.shared.counters;
        if let (false, Some(began)) = (self.timed, self.clock) {
            let now = Instant::now();
            self.tally.add_run(now - began, counters.read_share());
            self.clock = Some(now);
        }
        counters.samples(&std::mem::take(&mut self.tally));
    }
}

/// Reads sample `index` and runs the loader's map on it, into the
/// claimed sample's slots, as `worker`.
pub(super) fn process(
    worker: &mut Worker<'_>,
    epoch: u64,
    index: usize,
    claim: &mut Claimed<'_>,
    cancel: &AtomicBool,
    pre: PreRead,
) -> Outcome {
    if cancel.load(Ordering::Relaxed) {
        return Outcome::Cancelled;
    }
    let shared = worker.shared;
    // An untimed sample's clock stands still at the run's start (its
    // times are zero; `Worker::count` adds the run's).
    let timed = worker.timed;
    let start = worker.clock.unwrap_or_else(Instant::now);
    let now = || if timed { Instant::now() } else { start };
    let Worker { scratch, tally, .. } = worker;
    let scratch = scratch.get_or_insert_with(|| {
        let k = &shared.knobs;
        let mut scratch = k.budget.scratch.take(k.gate.limit());
        scratch.limits = shared.decode_limits();
        scratch
    });
    let run = || -> Result<(String, Instant), (Option<String>, Error)> {
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
        let readahead = shared.readahead.as_ref();
        let (record, read, read_end) = match (cached, pre) {
            (Some(r), _) => {
                shared.counters.cache_hit();
                if let Some(ra) = readahead {
                    ra.discard(index);
                }
                let now = now();
                (r, now - start, now)
            }
            (None, Some((record, read))) => (record, read, start),
            (None, None) => {
                let on_retry = || shared.counters.read_retried();
                // Read ahead (its time is the wait for it), or read here.
                let ahead = readahead.and_then(|ra| ra.take(index, cancel));
                let record = match ahead {
                    Some((record, retried)) => {
                        (0..retried).for_each(|_| on_retry());
                        record
                    }
                    None => {
                        let read = (index, &*shared.parts, scratch.take_read_buffer());
                        Spans::run(shared.spans.as_ref(), || {
                            read_retrying(&*shared.source, read, shared.retries, cancel, &on_retry)
                        })
                    }
                };
                let now = now();
                (record, now - start, now)
            }
        };
        let mut record = record.map_err(|e| (None, e))?;
        // The map starts where the read ended, or after the cache fill.
        let mut t1 = read_end;
        if let (Some(cache), false) = (&shared.cache, hit) {
            record = fill_cache(shared, cache, index, record).map_err(|(k, e)| (Some(k), e))?;
            t1 = now();
        }
        let schema = &shared.schema;
        // A transient error from the map (a token window's page that
        // could not be read: the map reads the file itself) is retried as
        // a source's read is, under `retry(n)`; the map runs again over the
        // same record and writes its slots anew.
        // (The map's errors are retried; `finish`'s, inside, are not.)
        let on_retry = || shared.counters.read_retried();
        let mapped = retrying(shared.retries, cancel, &on_retry, || {
            let id = (shared.seed, epoch, index);
            let slots = claim.slots();
            let mut sample = Sample::new(&record, id, &schema.fields, slots, scratch);
            shared.map.map(&mut sample)?;
            Ok(sample.finish(&schema.fields))
        });
        let key = || Some(record.key.clone());
        let (lens, times) = mapped.map_err(|e| (key(), e))?.map_err(|e| (key(), e))?;
        if schema.padded {
            let mut slots: Vec<&mut [u8]> = claim.slots().collect();
            pad_fields(&record.key, &schema.fields, &lens, &mut slots)
                .map_err(|e| (Some(record.key.clone()), e))?;
        }
        let end = now();
        let times = times.unwrap_or_else(|| crate::stats::SampleTimes {
            decode: Duration::ZERO,
            transform: end - t1,
            decoded_bytes: 0,
        });
        tally.add(read, &times);
        scratch.recycle_read_buffer(record.bytes);
        Ok((record.key, end))
    };
    let result = catch_unwind(AssertUnwindSafe(run));
    let end = match &result {
        Ok(Ok((_, end))) => *end,
        _ => Instant::now(),
    };
    if timed {
        worker.clock = Some(end);
    }
    if let Some(trace) = &shared.trace {
        let lane = LANE_DECODE + rayon::current_thread_index().unwrap_or(0) as u64;
        trace.record("read+map", lane, start, end);
    }
    let result = result.map(|r| r.map(|(key, _)| key));
    match result {
        Ok(Ok(key)) => Outcome::Ok { key },
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
