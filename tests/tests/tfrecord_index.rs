//! A TFRecord `.idx` file is checked against its shard before it is used:
//! entries must tile the shard without wrapping, stay under the record-size
//! limit, and its first and last agree with the record headers there. A
//! lying index is an error naming it, never a huge allocation, a panic or
//! an abort; one that passes those checks but is wrong elsewhere fails
//! the reads through its wrong entries, naming the shard, never giving
//! other bytes.

use candle_wick::source::TfRecord;
use candle_wick::Source;
use std::path::{Path, PathBuf};

const TF: &str = "tf-00000-of-00002.tfrecord";

/// A copy of the fixture shard in `dir`, and its length.
fn shard(dir: &Path) -> (PathBuf, u64) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/shards")
        .join(TF);
    let path = dir.join(TF);
    std::fs::copy(&src, &path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    (path, len)
}

fn with_index(path: &Path, lines: &str) -> Result<TfRecord, String> {
    std::fs::write(format!("{}.idx", path.display()), lines).unwrap();
    let opened = std::panic::catch_unwind(|| TfRecord::open([path]));
    match opened {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => panic!("opening with index {lines:?} panicked"),
    }
}

/// `(offset, size with framing)` of the shard's real records.
fn real_records(path: &Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let (mut out, mut at) = (Vec::new(), 0usize);
    while at < bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        out.push((at as u64, len + 16));
        at += 16 + len as usize;
    }
    out
}

#[test]
fn an_index_claiming_one_record_for_the_whole_shard_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, len) = shard(dir.path());
    let err = with_index(&path, &format!("0 {len}\n")).unwrap_err();
    assert!(err.contains(".idx"), "{err}");
}

#[test]
fn an_index_whose_offsets_wrap_around_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, len) = shard(dir.path());
    let q = 1u64 << 62;
    let lines = format!(
        "0 {q}\n{q} {q}\n{} {q}\n{} {}\n",
        2 * q,
        3 * q,
        q.wrapping_add(len)
    );
    let err = with_index(&path, &lines).unwrap_err();
    assert!(err.contains(".idx"), "{err}");
}

#[test]
fn an_index_entry_over_the_record_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = shard(dir.path());
    // A sparse 600 MiB shard: the index claims one record of all of it.
    let big = 600u64 << 20;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(big)
        .unwrap();
    let err = with_index(&path, &format!("0 {big}\n")).unwrap_err();
    assert!(err.contains(".idx") && err.contains("limit"), "{err}");
}

#[test]
fn random_indexes_are_refused_or_match_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let (path, len) = shard(dir.path());
    let real = real_records(&path);
    let scanned = TfRecord::open([&path]).unwrap();
    let mut x = 0x2545_f491_u64;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..500 {
        // Split the shard into pieces of at least 16 bytes.
        let mut lines = String::new();
        let mut at = 0;
        while len - at >= 32 {
            let size = 16 + rnd(len - at - 16);
            lines.push_str(&format!("{at} {size}\n"));
            at += size;
        }
        lines.push_str(&format!("{at} {}\n", len - at));
        if let Ok(tf) = with_index(&path, &lines) {
            // Accepted: its shape fits the shard, its first and last
            // entries are records. Every read through it is then the
            // record at that offset, or an error naming the shard: never
            // other bytes.
            let claimed: Vec<(u64, u64)> = lines
                .lines()
                .map(|l| {
                    let mut it = l.split(' ').map(|v| v.parse::<u64>().unwrap());
                    (it.next().unwrap(), it.next().unwrap())
                })
                .collect();
            assert_eq!(claimed.first(), real.first());
            assert_eq!(claimed.last(), real.last());
            for (i, entry) in claimed.iter().enumerate() {
                match tf.read(i) {
                    Ok(record) => {
                        let at = real.iter().position(|r| r == entry);
                        let at = at.expect("a read through a wrong entry gave a record");
                        assert_eq!(record, scanned.read(at).unwrap());
                    }
                    Err(e) => assert!(e.to_string().contains(TF), "{e}"),
                }
            }
        }
    }
    // The true index is accepted and reads the same records.
    let lines: String = real.iter().map(|(o, s)| format!("{o} {s}\n")).collect();
    let tf = with_index(&path, &lines).unwrap();
    for i in 0..tf.len() {
        assert_eq!(tf.read(i).unwrap(), scanned.read(i).unwrap());
    }
}
