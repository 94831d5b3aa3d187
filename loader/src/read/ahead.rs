//! Read-ahead for sources whose reads wait on the network
//! ([`Source::wants_read_ahead`]): the records of the next samples of the epoch's
//! plan are read concurrently, on I/O threads of their own
//! (`wick-read-{i}`), so a decode worker finds its record read instead of
//! waiting a round trip for it.
//!
//! How far ahead is tuned from what is measured, not a constant: by
//! Little's law the reads in flight must cover the time one read takes at
//! the rate the workers take records, so the depth is twice the measured
//! read latency over the measured interval between takes, plus one batch,
//! within `[batch, MAX_DEPTH]`. While reads are the bottleneck the takes
//! come one read time over the depth apart, so the factor of two doubles
//! the depth until the workers (decode) are the bottleneck; then it holds.
//! A worker that finds its record still being read waits for it; one that
//! finds none (past the depth) reads it itself.
//!
//! The read-ahead drives itself: [`ReadAhead::begin`] is given the order
//! the records will be taken in (the rank's samples of the epoch in the
//! random-access mode; one shard's records in a stream), and every take
//! starts the next reads.
//! Records read and not yet taken are its memory ([`ReadAhead::memory`],
//! counted in the RAM budget).

use super::retry::read_retrying;
use crate::contract::{Parts, Record, Source, Value};
use crate::error::Result;
use crate::storage::spans::Spans;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// Most records read or being read ahead for a loader (and most I/O
/// threads).
pub(crate) const MAX_DEPTH: usize = 256;

enum Slot {
    Reading,
    /// The read, and how many times it was retried.
    Done(Result<Record>, u32),
}

/// The sample indices an epoch takes, in order.
pub(crate) type Upcoming = Box<dyn Iterator<Item = usize> + Send>;

#[derive(Default)]
struct Inner {
    /// The epoch generation the slots belong to.
    gen: u64,
    /// The rank's sample indices of the epoch still to read, in the order
    /// taken, computed as the reads reach them (a plan's batches: nothing
    /// of the epoch's size); `None` before the first epoch.
    order: Option<std::iter::Peekable<Upcoming>>,
    slots: HashMap<usize, Slot>,
    /// Samples a worker read itself before the cursor came to them: the
    /// cursor passes them (one each) instead of reading them again.
    passed: HashMap<usize, u32>,
    /// Bytes of the records read and not yet taken.
    bytes: u64,
    /// Measured (moving averages, seconds): one read's time, and the
    /// interval between takes.
    latency: f64,
    interval: f64,
    last_take: Option<Instant>,
    threads: usize,
}

/// The read-ahead of one loader.
pub(crate) struct ReadAhead {
    source: Arc<dyn Source>,
    parts: Arc<Parts>,
    retries: u32,
    /// The loader's chunks of remote shards, under the shard-block shuffle.
    spans: Option<Arc<Spans>>,
    batch: usize,
    /// The most records read ahead (at most [`MAX_DEPTH`]).
    most: usize,
    inner: Mutex<Inner>,
    ready: Condvar,
    jobs: Sender<(u64, usize)>,
    queue: Receiver<(u64, usize)>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = crate::sync::lock(&self.inner);
        f.debug_struct("ReadAhead")
            .field("depth", &depth_of(&i, self.batch, self.most))
            .field("threads", &i.threads)
            .finish_non_exhaustive()
    }
}

/// Records to keep read or being read ahead of the workers.
fn depth_of(i: &Inner, batch: usize, most: usize) -> usize {
    let floor = batch.clamp(1, most);
    if i.latency <= 0.0 || i.interval <= 0.0 {
        // Nothing measured yet: two batches.
        return (2 * batch).clamp(floor, most);
    }
    let need = (2.0 * i.latency / i.interval).ceil().min(most as f64) as usize + batch;
    need.clamp(floor, most)
}

/// A moving average: the first value, then 1/10 of each new one.
fn average(old: f64, new: f64) -> f64 {
    if old == 0.0 {
        new
    } else {
        0.9 * old + 0.1 * new
    }
}

impl ReadAhead {
    /// A read-ahead of `source`'s records, read as the loader reads them
    /// (`parts`, `retries`), taken in batches of `batch` records, at most
    /// `most` ahead (capped at [`MAX_DEPTH`]).
    pub(crate) fn new(
        source: Arc<dyn Source>,
        parts: Arc<Parts>,
        retries: u32,
        spans: Option<Arc<Spans>>,
        (batch, most): (usize, usize),
    ) -> Arc<Self> {
        let (jobs, queue) = unbounded();
        Arc::new(Self {
            source,
            parts,
            retries,
            spans,
            batch,
            most: most.clamp(1, MAX_DEPTH),
            inner: Mutex::new(Inner::default()),
            ready: Condvar::new(),
            jobs,
            queue,
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Records kept read or being read ahead now (0 before the first
    /// [`begin`](Self::begin)).
    pub(crate) fn depth(&self) -> usize {
        let i = crate::sync::lock(&self.inner);
        if i.order.is_none() {
            return 0;
        }
        depth_of(&i, self.batch, self.most)
    }

    /// Bytes of records read ahead and not yet taken.
    pub(crate) fn memory(&self) -> u64 {
        crate::sync::lock(&self.inner).bytes
    }

    /// Starts epoch generation `gen`, whose samples are taken in `order`:
    /// what was read for an earlier one is dropped.
    pub(crate) fn begin(self: &Arc<Self>, gen: u64, order: Upcoming) {
        let mut i = crate::sync::lock(&self.inner);
        i.gen = gen;
        i.order = Some(order.peekable());
        i.slots.clear();
        i.passed.clear();
        i.bytes = 0;
        i.last_take = None;
        self.top_up(&mut i);
        self.ready.notify_all();
    }

    /// Starts reads at the cursor until the depth is reached.
    fn top_up(self: &Arc<Self>, i: &mut Inner) {
        let depth = depth_of(i, self.batch, self.most);
        while i.slots.len() < depth {
            let Some(index) = i.order.as_mut().and_then(Iterator::next) else {
                return;
            };
            if let Some(n) = i.passed.get_mut(&index) {
                *n -= 1;
                if *n == 0 {
                    i.passed.remove(&index);
                }
                continue;
            }
            if i.slots.contains_key(&index) {
                // Padding repeats a sample: its second use reads it again.
                continue;
            }
            if self.jobs.send((i.gen, index)).is_err() {
                return;
            }
            i.slots.insert(index, Slot::Reading);
            // A thread a read in flight: reads block on the network (the
            // requests themselves run on the storage's I/O runtime).
            let reading = i
                .slots
                .values()
                .filter(|s| matches!(s, Slot::Reading))
                .count();
            if i.threads < reading {
                let me = Arc::downgrade(self);
                let (queue, stop) = (self.queue.clone(), self.stop.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("wick-read-{}", i.threads))
                    .stack_size(1 << 20)
                    .spawn(move || reader(me, queue, stop));
                if spawned.is_ok() {
                    i.threads += 1;
                }
            }
        }
    }

    /// The record of sample `index` (and how many times its read was
    /// retried) when it was read ahead, waiting for a read in flight; `None` when it was not (nor will be: the caller
    /// reads it) or `cancel` is set while waiting.
    pub(crate) fn take(
        self: &Arc<Self>,
        index: usize,
        cancel: &AtomicBool,
    ) -> Option<(Result<Record>, u32)> {
        let mut i = crate::sync::lock(&self.inner);
        let now = Instant::now();
        if let Some(last) = i.last_take.replace(now) {
            i.interval = average(i.interval, (now - last).as_secs_f64());
        }
        loop {
            match i.slots.get(&index) {
                None => {
                    if i.order.as_mut().is_some_and(|o| o.peek().is_some()) {
                        *i.passed.entry(index).or_default() += 1;
                    }
                    return None;
                }
                Some(Slot::Done(..)) => {
                    let Some(Slot::Done(record, retried)) = i.slots.remove(&index) else {
                        unreachable!("the slot was just seen read")
                    };
                    if let Ok(r) = &record {
                        i.bytes = i.bytes.saturating_sub(record_bytes(r));
                    }
                    self.top_up(&mut i);
                    return Some((record, retried));
                }
                Some(Slot::Reading) if cancel.load(Ordering::Relaxed) => return None,
                Some(Slot::Reading) => {
                    i = self
                        .ready
                        .wait_timeout(i, Duration::from_millis(50))
                        .map_or_else(|e| e.into_inner().0, |(g, _)| g);
                }
            }
        }
    }

    /// Drops what was read (or is being read) for `index`: a worker got
    /// the sample elsewhere (the loader's cache).
    pub(crate) fn discard(self: &Arc<Self>, index: usize) {
        let mut i = crate::sync::lock(&self.inner);
        if let Some(Slot::Done(Ok(r), _)) = i.slots.remove(&index) {
            i.bytes = i.bytes.saturating_sub(record_bytes(&r));
        }
        self.top_up(&mut i);
    }

    /// Stores a finished read (dropped when its epoch is gone).
    fn finish(
        &self,
        gen: u64,
        index: usize,
        record: Option<(Result<Record>, u32)>,
        took: Duration,
    ) {
        let mut i = crate::sync::lock(&self.inner);
        i.latency = average(i.latency, took.as_secs_f64());
        if i.gen == gen && matches!(i.slots.get(&index), Some(Slot::Reading)) {
            match record {
                Some((record, retried)) => {
                    if let Ok(r) = &record {
                        i.bytes += record_bytes(r);
                    }
                    i.slots.insert(index, Slot::Done(record, retried));
                }
                // The read panicked: the worker reads it again itself and
                // reports the panic naming the sample, as for any read.
                None => {
                    i.slots.remove(&index);
                }
            }
            self.ready.notify_all();
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The bytes a record holds.
fn record_bytes(r: &Record) -> u64 {
    let part = |v: &Value| match v {
        Value::Bytes(b) => b.len() as u64,
        Value::Text(t) => t.len() as u64,
        Value::BytesList(l) => l.iter().map(|b| b.len() as u64).sum(),
        _ => 0,
    };
    r.bytes.len() as u64 + r.parts.iter().map(|(_, v)| part(v)).sum::<u64>()
}

/// An I/O thread: reads the records asked for until the read-ahead is gone.
fn reader(me: Weak<ReadAhead>, queue: Receiver<(u64, usize)>, stop: Arc<AtomicBool>) {
    // A new epoch drops the results of the reads of the last; a loader
    // dropped stops their retries (`stop`, set when the read-ahead is
    // dropped: no reader holds it while it reads).
    while !stop.load(Ordering::Relaxed) {
        let Ok((gen, index)) = queue.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let Some(ra) = me.upgrade() else { return };
        if crate::sync::lock(&ra.inner).gen != gen {
            continue;
        }
        let (source, parts, retries) = (ra.source.clone(), ra.parts.clone(), ra.retries);
        let spans = ra.spans.clone();
        drop(ra);
        let t = Instant::now();
        let retried = std::sync::atomic::AtomicU32::new(0);
        let record = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let read = (index, &*parts, Vec::new());
            let on_retry = || {
                retried.fetch_add(1, Ordering::Relaxed);
            };
            Spans::run(spans.as_ref(), || {
                read_retrying(&*source, read, retries, &stop, &on_retry)
            })
        }));
        let record = record.ok().map(|r| (r, retried.into_inner()));
        let Some(ra) = me.upgrade() else { return };
        ra.finish(gen, index, record, t.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use crate::contract::{Record, Source};
    use crate::error::Error;
    use crate::fields::{Field, FieldType};
    use crate::map::{map_fn, Sample};
    use crate::order::ranks::Ranks;
    use crate::order::sampler::Remainder;
    use crate::pipeline::{BadSamples, Loader, LoaderBuilder};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    use std::time::Duration;

    /// 30 samples read in `delay` each, counting the reads at once; sample
    /// 7 fails for good, sample 11's first read fails for a moment.
    struct Slow {
        remote: bool,
        delay: Duration,
        reading: AtomicUsize,
        most: AtomicUsize,
        tries_11: AtomicUsize,
    }

    impl Slow {
        fn new(remote: bool) -> Arc<Self> {
            Arc::new(Self {
                remote,
                delay: Duration::from_millis(8),
                reading: AtomicUsize::new(0),
                most: AtomicUsize::new(0),
                tries_11: AtomicUsize::new(0),
            })
        }
    }

    impl Source for Slow {
        fn len(&self) -> usize {
            30
        }
        fn wants_read_ahead(&self) -> bool {
            self.remote
        }
        fn read(&self, i: usize) -> crate::error::Result<Record> {
            let now = self.reading.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            std::thread::sleep(self.delay);
            self.reading.fetch_sub(1, SeqCst);
            if i == 7 {
                return Err(Error::sample(format!("s{i}"), "bad bytes"));
            }
            if i == 11 && self.tries_11.fetch_add(1, SeqCst) == 0 {
                let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "slow server");
                return Err(Error::Io {
                    path: "s11".into(),
                    source: io,
                });
            }
            Ok(Record::encoded(format!("s{i}"), vec![i as u8], i as u32))
        }
    }

    fn builder(source: &Arc<Slow>) -> LoaderBuilder {
        let map = map_fn(
            vec![Field::new("v", FieldType::U32, &[])],
            |s: &mut Sample<'_>| {
                s.take::<u32>(0)?[0] = s.record().label;
                Ok(())
            },
        );
        Loader::builder(source.clone())
            .map(map)
            .batch_size(4)
            .workers(1)
            .shuffle(3)
            .retry(2)
            .bad_samples(BadSamples::Skip)
    }

    /// Every batch's labels, over `epoch` from batch `start`.
    fn labels(l: &mut Loader, epoch: u64, start: usize) -> Vec<Vec<u32>> {
        l.epoch_from(epoch, start)
            .map(|b| {
                let b = b.unwrap();
                b.get("v").unwrap().to_vec1::<u32>().unwrap()
            })
            .collect()
    }

    /// A remote source's reads overlap (one worker reads one at a time),
    /// and it gives the same batches as the same source read locally: in
    /// order, skipping the bad sample, retrying the failed read, from a
    /// resume point, and with padding repeating samples.
    #[test]
    fn reads_ahead_overlap_and_give_the_batches_of_local_reads() {
        let (remote, local) = (Slow::new(true), Slow::new(false));
        let (mut r, mut l) = (
            builder(&remote).build().unwrap(),
            builder(&local).build().unwrap(),
        );
        for epoch in 0..2 {
            assert_eq!(
                labels(&mut r, epoch, 0),
                labels(&mut l, epoch, 0),
                "epoch {epoch}"
            );
        }
        assert_eq!(labels(&mut r, 2, 3), labels(&mut l, 2, 3), "resumed");
        assert_eq!(local.most.load(SeqCst), 1, "one worker reads one at a time");
        assert!(
            remote.most.load(SeqCst) >= 2,
            "remote reads did not overlap"
        );
        let stats = r.stats();
        assert!(stats.read_ahead >= 4, "depth {}", stats.read_ahead);
        assert_eq!(stats.read_retries, 1);
        assert_eq!(stats.skipped_samples, l.stats().skipped_samples);
        assert!(
            stats.skipped_samples >= 2,
            "sample 7 was skipped every epoch"
        );
        assert_eq!(l.stats().read_ahead, 0);

        let pad = |s: &Arc<Slow>| {
            let ranks = Ranks::new(1, 4).unwrap();
            let b = builder(s).ranks(ranks).remainder(Remainder::Pad);
            b.batch_size(3).build().unwrap()
        };
        let (mut r, mut l) = (pad(&remote), pad(&local));
        assert_eq!(labels(&mut r, 5, 0), labels(&mut l, 5, 0), "padded");
    }

    /// A loader dropped mid-epoch, with reads ahead in flight, ends; so
    /// does an epoch dropped for another.
    #[test]
    fn dropping_an_epoch_or_the_loader_with_reads_in_flight_ends() {
        let remote = Slow::new(true);
        let mut r = builder(&remote).build().unwrap();
        let mut e = r.epoch(0);
        e.next().unwrap().unwrap();
        drop(e);
        assert_eq!(labels(&mut r, 1, 0).len(), labels(&mut r, 1, 0).len());
        let mut e = r.epoch(2);
        e.next().unwrap().unwrap();
        drop(e);
        drop(r);
    }
}
