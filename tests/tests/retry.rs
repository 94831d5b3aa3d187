//! `retry(n)`: a read that fails with a transient error (EIO, EAGAIN,
//! interrupted, timed out) is tried again up to `n` more times before the
//! sample is bad, and the error then says how many tries there were; an
//! error about the data (a missing file) is never retried. In the
//! random-access mode and the streaming mode alike: records read one by
//! one from shards, or from a source's own sequential reader of a shard
//! (a compressed TFRecord shard's), which is opened again and read up to
//! the record that failed.

use candle_wick::source::{MemorySource, Parts, Record, RecordStream};
use candle_wick::{BadSamples, Error, Loader, Result, Source};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tests::{encode, pattern};

/// 12 small PNGs; reads of samples 3 and 7 fail with `error` the first
/// `fails` times each; sample 10's read always fails with "not found".
#[derive(Debug, Clone)]
struct Flaky {
    inner: MemorySource,
    /// Shards for the streaming mode.
    shards: Vec<candle_wick::source::ShardInfo>,
    fails: usize,
    error: fn() -> std::io::Error,
    reads: Arc<Mutex<HashMap<usize, usize>>>,
    /// Shards are read by the source's own stream, as a compressed
    /// TFRecord shard is: after a transient error it has lost its place,
    /// and every later read of it fails too.
    own_stream: bool,
    /// The shard's stream cannot be opened again (the file is gone).
    reopen_fails: bool,
    opens: Arc<Mutex<HashMap<usize, usize>>>,
}

impl Source for Flaky {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn read(&self, index: usize) -> Result<Record> {
        let n = {
            let mut reads = self.reads.lock().unwrap();
            let n = reads.entry(index).or_default();
            *n += 1;
            *n
        };
        let io = |source| Error::Io {
            path: format!("flaky/{index}.png").into(),
            source,
        };
        if index == 10 {
            return Err(io(std::io::Error::from(std::io::ErrorKind::NotFound)));
        }
        if (index == 3 || index == 7) && n <= self.fails {
            return Err(io((self.error)()));
        }
        self.inner.read(index)
    }

    fn read_parts(&self, index: usize, _parts: &Parts, _bytes: Vec<u8>) -> Result<Record> {
        self.read(index)
    }

    fn key(&self, index: usize) -> String {
        format!("flaky/{index}.png")
    }

    fn shards(&self) -> &[candle_wick::source::ShardInfo] {
        &self.shards
    }

    fn stream_shard(&self, shard: usize, _parts: &Parts) -> Result<Option<RecordStream>> {
        if !self.own_stream {
            return Ok(None);
        }
        let opens = {
            let mut opens = self.opens.lock().unwrap();
            let n = opens.entry(shard).or_default();
            *n += 1;
            *n
        };
        if self.reopen_fails && opens > 1 {
            return Err(Error::Io {
                path: format!("flaky/shard{shard}").into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        let info = &self.shards[shard];
        let (me, mut lost) = (self.clone(), false);
        let records = info.first..info.first + info.records;
        Ok(Some(Box::new(records.map(move |i| {
            if lost {
                return Err(Error::Io {
                    path: "flaky/stream".into(),
                    source: std::io::Error::from_raw_os_error(5),
                });
            }
            let r = me.read(i);
            lost = matches!(&r, Err(e) if e.is_transient());
            r
        }))))
    }
}

/// How the loader reads the shards.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Random,
    /// Three shards of four records, each record read by `read_parts`.
    Stream,
    /// Two shards of six records (the failing ones inside a shard), read
    /// by the source's own stream.
    OwnStream,
}

fn loader(
    retries: u32,
    fails: usize,
    error: fn() -> std::io::Error,
    mode: Mode,
) -> (Loader, Flaky) {
    let png = encode(&pattern(8, 8, 1), image::ImageFormat::Png);
    let records: Vec<Record> = (0..12)
        .map(|i| Record::encoded(format!("flaky/{i}.png"), png.clone(), 0))
        .collect();
    let reads = Arc::new(Mutex::new(HashMap::new()));
    let src = || Flaky {
        inner: MemorySource::new(records.clone()),
        shards: match mode {
            Mode::OwnStream => tests::fake_shards(2, 6),
            _ => tests::fake_shards(3, 4),
        },
        fails,
        error,
        reads: reads.clone(),
        own_stream: mode == Mode::OwnStream,
        reopen_fails: false,
        opens: Default::default(),
    };
    let flaky = src();
    let mut b = Loader::builder(src())
        .batch_size(4)
        .image_size(8)
        .workers(2)
        .bad_samples(BadSamples::Skip)
        .retry(retries);
    if mode != Mode::Random {
        b = b.interleave(2, 1).shuffle_buffer(3);
    }
    let l = b.build().unwrap();
    // `flaky` shares the read counts.
    (l, flaky)
}

fn run(l: &mut Loader) -> (usize, Vec<(String, String)>) {
    let mut good = 0;
    let mut bad = Vec::new();
    for b in l.epoch(0) {
        let b = b.unwrap();
        good += b.len();
        for s in b.skipped {
            bad.push((s.key, candle_wick::error_chain(&s.error)));
        }
    }
    (good, bad)
}

#[test]
fn transient_read_errors_are_retried_and_then_named_with_the_tries() {
    let eio = || std::io::Error::from_raw_os_error(5);
    let eagain = || std::io::Error::from(std::io::ErrorKind::WouldBlock);
    let cases = [
        (eio as fn() -> _, Mode::Random),
        (eagain, Mode::Random),
        (eio, Mode::Stream),
        (eio, Mode::OwnStream),
    ];
    for (error, mode) in cases {
        // Two failures, three tries allowed: only the missing file is bad,
        // and it was read once.
        let (mut l, flaky) = loader(3, 2, error, mode);
        let (good, bad) = run(&mut l);
        assert_eq!(good, 11);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].0, "flaky/10.png");
        assert!(!bad[0].1.contains("tries"), "{}", bad[0].1);
        let reads = flaky.reads.lock().unwrap().clone();
        assert_eq!((reads[&3], reads[&7], reads[&10]), (3, 3, 1));
        assert_eq!(l.stats().read_retries, 4);
        if mode == Mode::OwnStream {
            // Opened again twice, and read up to the record each time.
            assert_eq!((reads[&0], reads[&6], reads[&11]), (3, 3, 1));
        }

        // Two failures, one retry: both flaky samples are bad, with the
        // transient error and the tries in their reason.
        let (mut l, _) = loader(1, 2, error, mode);
        let (good, bad) = run(&mut l);
        assert_eq!(good, 9);
        let mut keys: Vec<_> = bad.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["flaky/10.png", "flaky/3.png", "flaky/7.png"]);
        for (key, reason) in &bad {
            if key != "flaky/10.png" {
                assert!(reason.starts_with("after 2 tries: cannot read"), "{reason}");
            }
        }
    }
    // Without retry, the first failure is final.
    let (mut l, flaky) = loader(0, 1, eio, Mode::Random);
    let (good, _) = run(&mut l);
    assert_eq!(good, 9);
    assert_eq!(flaky.reads.lock().unwrap()[&3], 1);
}

/// A shard's stream that cannot be opened again after a transient error
/// (its file is gone): the failed record and every later one of the shard
/// are bad at once with that cause, after one wait, not one a record.
#[test]
fn a_stream_that_cannot_be_reopened_fails_the_rest_of_its_shard_at_once() {
    let (_, flaky) = loader(
        3,
        2,
        || std::io::Error::from_raw_os_error(5),
        Mode::OwnStream,
    );
    let flaky = Flaky {
        reopen_fails: true,
        ..flaky
    };
    let mut l = Loader::builder(flaky)
        .batch_size(4)
        .image_size(8)
        .workers(2)
        .bad_samples(BadSamples::Skip)
        .retry(3)
        .interleave(2, 1)
        .shuffle_buffer(3)
        .build()
        .unwrap();
    let (good, bad) = run(&mut l);
    // Shard 0: 0-2 good, 3-5 lost; shard 1: 6 good, 7-11 lost.
    assert_eq!(good, 4, "{bad:?}");
    assert_eq!(bad.len(), 8);
    for (_, reason) in &bad {
        assert!(
            reason.contains("cannot reopen the shard's stream after a read error")
                && reason.contains("flaky/shard"),
            "{reason}"
        );
    }
    // One retry (and wait) a shard, not one a record.
    assert_eq!(l.stats().read_retries, 2);
}

/// 64 records in two shards whose every read fails with `EAGAIN` after
/// 40 ms, as a read from network storage that times out does (shortened);
/// streamed by its own reader, a shard's stream opens once and then every
/// reopen fails the same way.
#[derive(Debug, Clone)]
struct Stuck {
    shards: Vec<candle_wick::source::ShardInfo>,
    own_stream: bool,
    opened: Arc<Mutex<std::collections::HashSet<usize>>>,
}

/// What a [`Stuck`] read of `what` fails with, after 40 ms.
fn stuck(what: String) -> Error {
    std::thread::sleep(std::time::Duration::from_millis(40));
    Error::Io {
        path: what.into(),
        source: std::io::Error::from_raw_os_error(11),
    }
}

impl Source for Stuck {
    fn len(&self) -> usize {
        64
    }

    fn read(&self, index: usize) -> Result<Record> {
        Err(stuck(format!("stuck/{index}.png")))
    }

    fn shards(&self) -> &[candle_wick::source::ShardInfo] {
        &self.shards
    }

    fn stream_shard(&self, shard: usize, _parts: &Parts) -> Result<Option<RecordStream>> {
        if !self.own_stream {
            return Ok(None);
        }
        if !self.opened.lock().unwrap().insert(shard) {
            return Err(stuck(format!("stuck/shard{shard}")));
        }
        let (me, info) = (self.clone(), &self.shards[shard]);
        let records = info.first..info.first + info.records;
        Ok(Some(Box::new(records.map(move |i| me.read(i)))))
    }
}

/// A dropped epoch makes no more tries: the drop does not wait for every
/// sample being read to make its remaining ones (here 50 tries of 40 ms,
/// two seconds; a stream's record, reopens of 40 ms), in any mode.
#[test]
fn dropping_the_epoch_stops_the_retries_at_once() {
    let mut took = Vec::new();
    for mode in [Mode::Random, Mode::Stream, Mode::OwnStream] {
        let src = Stuck {
            shards: tests::fake_shards(2, 32),
            own_stream: mode == Mode::OwnStream,
            opened: Default::default(),
        };
        let mut b = Loader::builder(src)
            .batch_size(4)
            .image_size(8)
            .workers(2)
            .bad_samples(BadSamples::Skip)
            .retry(50);
        if mode != Mode::Random {
            b = b.interleave(2, 1);
        }
        let mut l = b.build().unwrap();
        let epoch = l.epoch(0);
        // Some tries in.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let t = std::time::Instant::now();
        drop(epoch);
        took.push((mode, t.elapsed()));
    }
    let second = std::time::Duration::from_secs(1);
    assert!(took.iter().all(|(_, t)| *t < second), "{took:?}");
}

/// A map that reads a file itself (as the token map reads its memory map)
/// meets transient errors too: `retry(n)` runs it again over the same
/// record, and the error after the last try says how many there were.
#[test]
fn a_transient_error_from_the_map_is_retried() {
    use candle_wick::fields::{Field, FieldType};
    use candle_wick::map::{map_fn, Sample};
    let build = |retries: u32, fails: u32| {
        // Each sample's map fails `fails` times with EIO, then works.
        let tries: Arc<Mutex<HashMap<usize, u32>>> = Arc::default();
        let map = map_fn(
            vec![Field::new("v", FieldType::U32, &[])],
            move |s: &mut Sample<'_>| {
                let n = {
                    let mut t = tries.lock().unwrap();
                    let n = t.entry(s.index()).or_default();
                    *n += 1;
                    *n
                };
                if n <= fails {
                    let eio = std::io::Error::from_raw_os_error(5);
                    return Err(Error::Io {
                        path: s.key().into(),
                        source: eio,
                    });
                }
                s.take::<u32>(0)?[0] = s.record().label;
                Ok(())
            },
        );
        let records = (0..8u32)
            .map(|i| Record::encoded(format!("r{i}"), vec![1], i))
            .collect();
        Loader::builder(MemorySource::new(records))
            .map(map)
            .batch_size(4)
            .workers(2)
            .retry(retries)
            .bad_samples(BadSamples::Skip)
            .shard(0, 1)
            .build()
            .unwrap()
    };
    let mut l = build(2, 2);
    let (good, bad) = run(&mut l);
    assert_eq!((good, bad.len()), (8, 0), "{bad:?}");
    assert_eq!(l.stats().read_retries, 16);
    let (good, bad) = run(&mut build(1, 2));
    assert_eq!((good, bad.len()), (0, 8));
    assert!(bad[0].1.contains("after 2 tries"), "{}", bad[0].1);
    // Without retry(n) a transient error is a bad sample at once.
    let (good, bad) = run(&mut build(0, 1));
    assert_eq!((good, bad.len()), (0, 8));
}
