//! Soak: many short epochs with early drops, resumes from saved states and
//! loaders built and dropped, checking that the process's resident
//! memory, open files and threads do not grow. `.ci/run` runs it:
//!
//! ```text
//! cargo run --release -p tests --bin soak [EPOCHS]   (default 1000)
//! ```
//!
//! Each epoch takes a few milliseconds (64 small PNGs in batches of 8,
//! two workers, one bad sample skipped every epoch). In turn, an epoch
//! is run whole, dropped after a few batches, resumed in a new loader from
//! the state saved there (through JSON), or started from a batch in the
//! middle. After a warm-up of 20 epochs the counts are taken; at the end
//! the thread and file counts must be equal to them (given five seconds
//! for the threads of a dropped loader to leave the kernel's list) and the
//! resident set within 16 MiB of it (the allocator keeps some slack).
//! Exits 1 on growth.

use candle_wick::source::{MemorySource, Record};
use candle_wick::{BadSamples, Loader, LoaderState, Output};
use std::process::ExitCode;

/// Resident set size in bytes (Linux `/proc/self/statm`), else 0.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Entries of a `/proc/self` folder (open files, threads), else 0.
fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Usage {
    rss: u64,
    files: usize,
    threads: usize,
}

fn usage() -> Usage {
    Usage {
        rss: rss(),
        files: count("/proc/self/fd"),
        threads: count("/proc/self/task"),
    }
}

/// The usage once no more than `limit`'s threads and files are left, or
/// after five seconds whatever it is then ([`tests::settle`]: a dropped
/// loader's joined threads can be listed for a moment longer).
fn settled(limit: Usage) -> Usage {
    tests::settle(5, usage, |u| {
        u.threads <= limit.threads && u.files <= limit.files
    })
}

fn records() -> Vec<Record> {
    (0..64u32)
        .map(|i| {
            let bytes = if i == 13 {
                // Bad every epoch: the skip path runs too.
                b"not an image".to_vec()
            } else {
                tests::encode(&tests::pattern(24, 20, i), image::ImageFormat::Png)
            };
            Record::encoded(format!("s{i}"), bytes, i % 4)
        })
        .collect()
}

fn build(records: &[Record], resume: Option<LoaderState>) -> candle_wick::Result<Loader> {
    let mut b = Loader::builder(MemorySource::new(records.to_vec()))
        .batch_size(8)
        .image_size(16)
        .output(Output::U8Nhwc)
        .train_transforms()
        .shuffle(5)
        .workers(2)
        .bad_samples(BadSamples::Skip);
    if let Some(state) = resume {
        b = b.resume(state);
    }
    b.build()
}

fn main() -> ExitCode {
    let epochs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let records = records();
    let mut loader = build(&records, None).expect("a loader");
    let mut warm = None;
    let t = std::time::Instant::now();
    let (mut batches, mut drops, mut resumes) = (0u64, 0u64, 0u64);
    for e in 0..epochs {
        match e % 4 {
            // Whole.
            0 => {
                batches += loader
                    .epoch(e)
                    .map(|b| b.map(|_| 1))
                    .sum::<candle_wick::Result<u64>>()
                    .expect("batches")
            }
            // Dropped after a few batches.
            1 => {
                let mut epoch = loader.epoch(e);
                for _ in 0..(e % 5) {
                    epoch.next().expect("a batch").expect("batch");
                    batches += 1;
                }
                drops += 1;
            }
            // Resumed in a new loader from the state saved mid-epoch.
            2 => {
                let state = {
                    let mut epoch = loader.epoch(e);
                    epoch.next().expect("a batch").expect("batch").state()
                };
                let json = serde_json::to_string(&state).expect("json");
                drop(loader);
                let state: LoaderState = serde_json::from_str(&json).expect("state");
                loader = build(&records, Some(state)).expect("a resumed loader");
                batches += loader
                    .next_epoch()
                    .map(|b| b.map(|_| 1))
                    .sum::<candle_wick::Result<u64>>()
                    .expect("batches");
                resumes += 1;
            }
            // From a batch in the middle.
            _ => {
                batches += loader
                    .epoch_from(e, 3)
                    .map(|b| b.map(|_| 1))
                    .sum::<candle_wick::Result<u64>>()
                    .expect("batches")
            }
        }
        if e + 1 == 20.min(epochs) {
            warm = Some(usage());
        }
    }
    drop(loader);
    let Some(warm) = warm else {
        return ExitCode::SUCCESS;
    };
    // The last loader is dropped: its threads and files are gone, only the
    // main thread is left.
    let end = settled(Usage { threads: 1, ..warm });
    let built = build(&records, None).expect("a loader");
    let end_live = settled(warm);
    drop(built);
    println!(
        "soak: {epochs} epochs ({batches} batches, {drops} early drops, {resumes} resumes in new \
         loaders) in {:.1} s; after warm-up: {} MiB resident, {} open files, {} threads; at the \
         end with a loader again: {} MiB, {} files, {} threads (no loader: {} files, {} threads)",
        t.elapsed().as_secs_f64(),
        warm.rss >> 20,
        warm.files,
        warm.threads,
        end_live.rss >> 20,
        end_live.files,
        end_live.threads,
        end.files,
        end.threads
    );
    let mut grew = Vec::new();
    if end_live.threads > warm.threads {
        grew.push("threads");
    }
    if end_live.files > warm.files {
        grew.push("open files");
    }
    if end_live.rss > warm.rss + (16 << 20) {
        grew.push("resident memory");
    }
    if grew.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("soak: {} grew", grew.join(", "));
        ExitCode::FAILURE
    }
}
