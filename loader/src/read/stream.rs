//! The streaming mode's reads: each shard of a rank's epoch read front to
//! back, in the order [`StreamPlanner`] plans, with retries, remote shards
//! read ahead on threads of their own.

use crate::contract::{Parts, Record, RecordStream, ShardInfo, Source};
use crate::error::{Error, Result};
use crate::order::stream::StreamPlanner;
use crate::read::retry::{read_retrying, retry_wait, tried, Retry};
use crate::storage::Sequential;
use std::sync::Arc;

/// A record read from a shard, with its index in the source.
pub(crate) type Streamed = (usize, Result<Record>);

/// The records of the epoch for this rank, in the plan's order, read
/// sequentially from the shards.
///
/// `consumed` (sorted): the records a resumed epoch delivered before its
/// resume point. They come out in their places, as the shuffle buffer
/// needs them to, but unread (an error saying so, which the feeder
/// discards): a resume reads only the records it delivers, but for a
/// source's own sequential reader (a compressed TFRecord shard), which
/// cannot skip.
pub(crate) fn records(
    planner: &StreamPlanner,
    epoch: u64,
    source: Arc<dyn Source>,
    parts: Arc<Parts>,
    retry: Retry,
    consumed: Arc<[usize]>,
) -> impl Iterator<Item = Streamed> + Send {
    let shards = planner.shards().to_vec();
    // A remote shard's stream starts before the interleave reaches it.
    let upcoming = planner.rank_shards(epoch, planner.rank());
    let ahead = if source.wants_read_ahead() {
        SHARDS_AHEAD
    } else {
        0
    };
    let mut started = std::collections::VecDeque::new();
    let mut called = 0;
    planner.order_of(epoch, move |s| {
        let open = |s: usize| {
            let read = (parts.clone(), retry.clone(), consumed.clone());
            shard_stream(&source, &shards[s], s, read)
        };
        let have = called + started.len();
        for &next in upcoming
            .iter()
            .skip(have)
            .take((called + 1 + ahead).saturating_sub(have))
        {
            started.push_back((next, open(next)));
        }
        called += 1;
        match started.pop_front() {
            Some((first, stream)) if first == s => stream,
            _ => {
                started.clear();
                open(s)
            }
        }
    })
}

/// Exactly `info.records` items of shard `s`, numbered with source indices,
/// with the named `parts` (a source's own shard reader gives what it
/// stores). A record that fails with a transient error is tried again as
/// `retry` says: read again, or, from a source's own sequential reader (a
/// compressed TFRecord shard), by reopening the shard's stream and reading
/// up to it again ([`Reopening`]).
fn shard_stream(
    source: &Arc<dyn Source>,
    info: &ShardInfo,
    s: usize,
    (parts, retry, consumed): (Arc<Parts>, Retry, Arc<[usize]>),
) -> Box<dyn Iterator<Item = Streamed> + Send> {
    let range = info.first..info.first + info.records;
    let path = info.path.clone();
    let gap = move |i: usize| Error::Shard {
        path: path.clone(),
        offset: 0,
        reason: format!("stream ended before record {i} that the index holds"),
        source: None,
    };
    match source.stream_shard(s, &parts) {
        Ok(Some(stream)) => Box::new(
            range
                .zip(
                    Reopening {
                        source: source.clone(),
                        shard: s,
                        parts: parts.clone(),
                        retry,
                        path: info.path.clone(),
                        stream,
                        done: 0,
                    }
                    .map(Some)
                    .chain(std::iter::repeat_with(|| None)),
                )
                .map(move |(i, r)| (i, r.unwrap_or_else(|| Err(gap(i))))),
        ),
        Ok(None) if source.wants_read_ahead() => {
            produced(source.clone(), (range, &info.path), parts, retry, consumed)
        }
        Ok(None) => {
            let source = source.clone();
            let path = info.path.clone();
            Box::new(range.map(move |i| {
                if consumed.binary_search(&i).is_ok() {
                    return (i, Err(not_read(&path, i)));
                }
                let Retry {
                    retries,
                    cancel,
                    on_retry,
                } = &retry;
                let read = (i, &*parts, Vec::new());
                (
                    i,
                    read_retrying(&*source, read, *retries, cancel, &**on_retry),
                )
            }))
        }
        Err(e) => {
            // Every record of the shard fails with the one cause.
            let lost = shard_lost(&info.path, "cannot open shard for streaming", e);
            Box::new(range.map(move |i| (i, Err(lost()))))
        }
    }
}

/// Records of a remote shard buffered ahead of its stream.
const STREAM_BUFFER: usize = 64;

/// Remote shards whose streams start before the interleave reaches them.
const SHARDS_AHEAD: usize = 2;

/// Records `range` of a remote shard, read on a thread of their own
/// (`wick-stream`) into a buffer of [`STREAM_BUFFER`] records, through
/// windows of the object ([`Sequential`]): a request per window, not per
/// record, and the reads of the shards in the cycle (and the next ones)
/// overlap instead of each stalling the interleave. The thread ends with
/// the shard, when the stream is dropped, or when the epoch is.
///
/// A record whose read still fails with a transient error after the
/// retries (the store is unreachable or paused) loses the rest of the
/// shard: its later records fail at once, naming it, rather than each
/// waiting out its own retries.
fn produced(
    source: Arc<dyn Source>,
    (range, path): (std::ops::Range<usize>, &std::path::Path),
    parts: Arc<Parts>,
    retry: Retry,
    consumed: Arc<[usize]>,
) -> Box<dyn Iterator<Item = Streamed> + Send> {
    let path = path.to_path_buf();
    let (tx, rx) = crossbeam_channel::bounded(STREAM_BUFFER);
    let all = range.clone();
    let run = move || {
        let mut windows = Sequential::default();
        let Retry {
            retries,
            cancel,
            on_retry,
        } = &retry;
        let mut lost: Option<String> = None;
        for i in range {
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            if consumed.binary_search(&i).is_ok() {
                if tx.send((i, Err(not_read(&path, i)))).is_err() {
                    break;
                }
                continue;
            }
            if let Some(why) = &lost {
                let e = Error::Shard {
                    path: path.clone(),
                    offset: 0,
                    reason: format!("not read: {why}"),
                    source: None,
                };
                if tx.send((i, Err(e))).is_err() {
                    break;
                }
                continue;
            }
            let read = || {
                read_retrying(
                    &*source,
                    (i, &*parts, Vec::new()),
                    *retries,
                    cancel,
                    &**on_retry,
                )
            };
            let record = windows.run(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|p| {
                    let message = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "non-string panic payload".into());
                    Err(Error::WorkerPanic {
                        key: format!("#{i}"),
                        message,
                    })
                })
            });
            // Failed for good on a transient cause: tried `retries` more
            // times (`Retried`), or not to be retried at all.
            let gone = |e: &Error| matches!(e, Error::Retried { .. }) || e.is_transient();
            if let Err(e) = record.as_ref().map_err(|e| (gone(e), e)) {
                if e.0 {
                    let chain = crate::error::error_chain(e.1);
                    lost = Some(format!(
                        "record {i} of the shard failed after its retries: {chain}"
                    ));
                }
            }
            if tx.send((i, record)).is_err() {
                break;
            }
        }
    };
    match std::thread::Builder::new()
        .name("wick-stream".into())
        .spawn(run)
    {
        Ok(_) => Box::new(rx.into_iter()),
        Err(e) => {
            let e = e.to_string();
            Box::new(all.map(move |i| {
                let why = format!("cannot start a thread to stream record {i}: {e}");
                (i, Err(Error::InvalidConfig(why)))
            }))
        }
    }
}

/// The stand-in for record `i`, delivered before a resume point and not
/// read again.
fn not_read(path: &std::path::Path, i: usize) -> Error {
    Error::Shard {
        path: path.to_path_buf(),
        offset: 0,
        reason: format!("record {i} was delivered before the resume point: not read again"),
        source: None,
    }
}

/// The error of every record of a shard lost to one `cause` (it cannot be
/// opened, or its stream cannot be reopened): `reason`, naming the shard.
fn shard_lost(
    path: &std::path::Path,
    reason: &'static str,
    cause: Error,
) -> impl Fn() -> Error + Send + 'static {
    let (path, cause) = (path.to_path_buf(), Arc::new(cause));
    move || Error::Shard {
        path: path.clone(),
        offset: 0,
        reason: reason.into(),
        source: Some(Box::new(cause.clone())),
    }
}

/// A source's own sequential reader of one shard (a compressed TFRecord
/// shard, whose decompressor's state a failed read may have lost), made
/// to retry: after a transient error it waits as a retried read does,
/// opens the shard's stream again and reads past the records already
/// given (decompressing them again: the cost of a retry is the shard up to
/// the failed record), then tries the record again; up to `retry.retries`
/// more tries a record.
struct Reopening {
    source: Arc<dyn Source>,
    shard: usize,
    parts: Arc<Parts>,
    retry: Retry,
    /// The shard's file, for errors.
    path: std::path::PathBuf,
    stream: RecordStream,
    /// Records given so far.
    done: usize,
}

impl Reopening {
    /// The shard's stream opened again and read past the records given:
    /// an error when it cannot be, or fails transiently on the way.
    fn reopen(&mut self) -> Result<()> {
        let Some(mut stream) = self.source.stream_shard(self.shard, &self.parts)? else {
            return Ok(());
        };
        for _ in 0..self.done {
            match stream.next() {
                // Records given before (a bad one as before) are dropped.
                Some(Err(e)) if e.is_transient() => return Err(e),
                Some(_) => {}
                None => break,
            }
        }
        self.stream = stream;
        Ok(())
    }

    /// Whether the epoch is dropped.
    fn cancelled(&self) -> bool {
        self.retry.cancel.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Iterator for Reopening {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        let mut attempts = 1;
        loop {
            let result = self.stream.next()?;
            let retry = matches!(&result, Err(e) if e.is_transient())
                && attempts <= self.retry.retries
                && !self.cancelled();
            let mut last = match result {
                Err(e) if retry => e,
                result => {
                    self.done += 1;
                    return Some(result.map_err(|e| tried(e, attempts)));
                }
            };
            // Reopened until a try gets as far as the record, within the
            // same count of tries.
            loop {
                retry_wait(attempts, &self.retry.cancel);
                if self.cancelled() {
                    // The epoch is dropped: no more tries (a reopen
                    // decompresses the shard up to here again), and the
                    // stream, which lost its place, is read no further.
                    self.done += 1;
                    let reason = "the epoch was dropped while a read was retried";
                    let lost = shard_lost(&self.path, reason, tried(last, attempts));
                    let first = lost();
                    self.stream = Box::new(std::iter::repeat_with(move || Err(lost())));
                    return Some(Err(first));
                }
                (self.retry.on_retry)();
                attempts += 1;
                match self.reopen() {
                    Ok(()) => break,
                    Err(e) if e.is_transient() && attempts <= self.retry.retries => last = e,
                    Err(e) => {
                        // The shard's stream is lost: this record and every
                        // later one fail with the cause, at once.
                        self.done += 1;
                        let reason = "cannot reopen the shard's stream after a read error";
                        let lost = shard_lost(&self.path, reason, tried(e, attempts));
                        let first = lost();
                        self.stream = Box::new(std::iter::repeat_with(move || Err(lost())));
                        return Some(Err(first));
                    }
                }
            }
        }
    }
}
