//! `retry(n)`: a read that fails with a transient error (EIO, EAGAIN,
//! interrupted, timed out) is tried again up to `n` more times before the
//! sample is bad, and the error then says how many tries there were; an
//! error about the data (a missing file) is never retried. In the
//! random-access mode and the streaming mode alike (records read one by
//! one from shards).

use candle_wick::source::{MemorySource, Parts, Record};
use candle_wick::{BadSamples, Error, Loader, Result, Source};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tests::{encode, pattern};

/// 12 small PNGs; reads of samples 3 and 7 fail with `error` the first
/// `fails` times each; sample 10's read always fails with "not found".
#[derive(Debug)]
struct Flaky {
    inner: MemorySource,
    /// Three shards of four records, for the streaming mode.
    shards: Vec<candle_wick::source::ShardInfo>,
    fails: usize,
    error: fn() -> std::io::Error,
    reads: Arc<Mutex<HashMap<usize, usize>>>,
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
}

fn loader(
    retries: u32,
    fails: usize,
    error: fn() -> std::io::Error,
    stream: bool,
) -> (Loader, Flaky) {
    let png = encode(&pattern(8, 8, 1), image::ImageFormat::Png);
    let records: Vec<Record> = (0..12)
        .map(|i| Record::encoded(format!("flaky/{i}.png"), png.clone(), 0))
        .collect();
    let reads = Arc::new(Mutex::new(HashMap::new()));
    let src = || Flaky {
        inner: MemorySource::new(records.clone()),
        shards: tests::fake_shards(3, 4),
        fails,
        error,
        reads: reads.clone(),
    };
    let flaky = src();
    let mut b = Loader::builder(src())
        .batch_size(4)
        .image_size(8)
        .workers(2)
        .bad_samples(BadSamples::Skip)
        .retry(retries);
    if stream {
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
    let cases = [(eio as fn() -> _, false), (eagain, false), (eio, true)];
    for (error, stream) in cases {
        // Two failures, three tries allowed: only the missing file is bad,
        // and it was read once.
        let (mut l, flaky) = loader(3, 2, error, stream);
        let (good, bad) = run(&mut l);
        assert_eq!(good, 11);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].0, "flaky/10.png");
        assert!(!bad[0].1.contains("tries"), "{}", bad[0].1);
        let reads = flaky.reads.lock().unwrap().clone();
        assert_eq!((reads[&3], reads[&7], reads[&10]), (3, 3, 1));
        assert_eq!(l.stats().read_retries, 4);

        // Two failures, one retry: both flaky samples are bad, with the
        // transient error and the tries in their reason.
        let (mut l, _) = loader(1, 2, error, stream);
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
    let (mut l, flaky) = loader(0, 1, eio, false);
    let (good, _) = run(&mut l);
    assert_eq!(good, 9);
    assert_eq!(flaky.reads.lock().unwrap()[&3], 1);
}
