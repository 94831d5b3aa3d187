//! The bad-samples log survives kills, restarts and sharing: each line is
//! written whole in one append, so a line cut short by an earlier kill
//! stays a line of its own and two loaders on one path never mix inside a
//! line; a resumed run does not list the keys the file lists already; and
//! one loader writes at most 10,000 lines and then one summary line. A
//! log that is a pipe is written to, never read.

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Sample};
use candle_wick::source::{MemorySource, Record};
use candle_wick::{BadSamples, Error, Loader};
use std::collections::HashSet;
use std::path::Path;

/// A loader over `n` records keyed `prefix/i`, all refused by its map,
/// skipped and listed in `log`.
fn refusing(prefix: &str, n: usize, log: &Path) -> Loader {
    let records = (0..n)
        .map(|i| Record::encoded(format!("{prefix}/{i}"), vec![0; 4], 0))
        .collect();
    let map = map_fn(
        vec![Field::new("x", FieldType::U8, &[1])],
        |s: &mut Sample<'_>| Err(Error::sample(s.key(), "refused by the map")),
    );
    Loader::builder(MemorySource::new(records))
        .map(map)
        .batch_size(64)
        .workers(2)
        .bad_samples(BadSamples::Skip)
        .bad_samples_log(log)
        .build()
        .unwrap()
}

/// Runs epoch `epoch` of `loader` to its end: every batch is empty.
fn drain(loader: &mut Loader, epoch: u64) {
    for batch in loader.epoch(epoch) {
        assert!(batch.unwrap().is_empty());
    }
}

/// The log's lines.
fn lines(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.ends_with('\n'), "the last line is whole");
    text.lines().map(str::to_owned).collect()
}

/// The keys of `lines`, each a JSON entry.
fn keys(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let entry: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
            let key = entry["key"].as_str().unwrap_or_else(|| panic!("{l}"));
            assert!(entry["reason"].as_str().unwrap().contains("refused"));
            key.to_owned()
        })
        .collect()
}

/// All of `keys` are distinct, and there are `n` starting with `prefix/`.
fn distinct(keys: &[String], prefix: &str, n: usize) {
    let set: HashSet<&String> = keys.iter().collect();
    assert_eq!(set.len(), keys.len(), "a key listed twice");
    let ours = keys.iter().filter(|k| k.starts_with(&format!("{prefix}/")));
    assert_eq!(ours.count(), n);
}

#[test]
fn a_line_cut_short_by_an_earlier_kill_stays_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bad.jsonl");
    std::fs::write(&log, "{\"key\":\"x").unwrap();
    drain(&mut refusing("a", 5, &log), 0);
    let lines = lines(&log);
    assert_eq!(lines[0], "{\"key\":\"x");
    distinct(&keys(&lines[1..]), "a", 5);
}

#[test]
fn two_loaders_on_one_log_never_mix_inside_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bad.jsonl");
    std::thread::scope(|s| {
        for prefix in ["a", "b"] {
            let log = &log;
            s.spawn(move || drain(&mut refusing(prefix, 2_000, log), 0));
        }
    });
    let keys = keys(&lines(&log));
    assert_eq!(keys.len(), 4_000);
    distinct(&keys, "a", 2_000);
    distinct(&keys, "b", 2_000);
}

#[test]
fn a_restarted_run_does_not_list_the_listed_keys_again() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bad.jsonl");
    drain(&mut refusing("a", 20, &log), 0);
    assert_eq!(lines(&log).len(), 20);
    // The run again, over 10 more records: only those are new.
    let mut again = refusing("a", 30, &log);
    drain(&mut again, 0);
    drain(&mut again, 1);
    let keys = keys(&lines(&log));
    assert_eq!(keys.len(), 30);
    distinct(&keys, "a", 30);
}

#[test]
fn a_loader_writes_at_most_10000_lines_then_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bad.jsonl");
    let mut loader = refusing("a", 10_050, &log);
    drain(&mut loader, 0);
    drain(&mut loader, 1);
    let lines = lines(&log);
    assert_eq!(lines.len(), 10_001);
    distinct(&keys(&lines[..10_000]), "a", 10_000);
    let last: serde_json::Value = serde_json::from_str(&lines[10_000]).unwrap();
    assert_eq!(last["truncated"], true, "{last}");
    assert_eq!(last["limit"], 10_000, "{last}");
}

/// A log that is a pipe (`/dev/stderr` read by a collector, a FIFO) is
/// written to, never read: reading it would wait for input.
#[test]
fn a_pipe_as_the_log_is_written_to_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("bad.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("no mkfifo: skipped");
        return;
    }
    let collector = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drain(&mut refusing("a", 5, &fifo), 0);
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the loader is stuck on its log");
    let text = collector.join().unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    distinct(&keys(&lines), "a", 5);
}
