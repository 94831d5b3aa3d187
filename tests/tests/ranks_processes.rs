//! Ranks as separate OS processes, started with the environment each
//! launcher sets (torchrun, SLURM, Open MPI, PMI): their shares of an epoch
//! are disjoint, complete and of equal length, every rank finishes (also
//! in the streaming mode with uneven shard counts), every rank saves the
//! same state, and a state saved by 2 ranks resumes on 3 and on 1 with each
//! sample of the epoch seen exactly once.

use candle_wick::write::{ShardSample, ShardWriter, WebDatasetWriter};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use tests::{encode, image_folder, pattern};

/// Every variable a launcher may set, removed before each run so the
/// test's own environment (a CI runner under SLURM, say) cannot leak in.
const LAUNCHER_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
];

/// The variables `launcher` sets for `rank` of `world` (two ranks a node).
fn launcher_env(launcher: &str, rank: usize, world: usize) -> Vec<(&'static str, String)> {
    let (r, w, l) = (rank.to_string(), world.to_string(), (rank % 2).to_string());
    match launcher {
        "torchrun" => vec![
            ("RANK", r),
            ("WORLD_SIZE", w),
            ("LOCAL_RANK", l),
            ("LOCAL_WORLD_SIZE", "2".into()),
        ],
        "SLURM" => vec![
            ("SLURM_PROCID", r),
            ("SLURM_NTASKS", w),
            ("SLURM_LOCALID", l),
        ],
        "Open MPI" => vec![
            ("OMPI_COMM_WORLD_RANK", r),
            ("OMPI_COMM_WORLD_SIZE", w),
            ("OMPI_COMM_WORLD_LOCAL_RANK", l),
        ],
        "PMI" => vec![("PMI_RANK", r), ("PMI_SIZE", w), ("MPI_LOCALRANKID", l)],
        other => panic!("no launcher {other}"),
    }
}

/// Runs `world` rank processes at once, as `launcher` would, and returns
/// each one's JSON line, in rank order.
fn job(launcher: &str, world: usize, data: &Path, args: &[String]) -> Vec<Value> {
    let children: Vec<_> = (0..world)
        .map(|rank| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_rank"));
            cmd.arg(data).args(args);
            for v in LAUNCHER_VARS {
                cmd.env_remove(v);
            }
            cmd.envs(launcher_env(launcher, rank, world));
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().expect("start a rank process")
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(rank, child)| {
            let out = child.wait_with_output().expect("wait for a rank");
            assert!(
                out.status.success(),
                "{launcher} rank {rank} of {world} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
            assert_eq!(line["rank"], rank, "{launcher}");
            assert_eq!(line["world_size"], world, "{launcher}");
            assert_eq!(line["launcher"], launcher);
            assert_eq!(line["local_rank"], rank % 2, "{launcher}");
            line
        })
        .collect()
}

fn batches(line: &Value) -> Vec<Vec<u64>> {
    serde_json::from_value(line["batches"].clone()).unwrap()
}

/// How many times each sample was seen across `lines`; asserts every rank
/// had `per_rank` batches.
fn tally(lines: &[Value], per_rank: Option<usize>, into: &mut BTreeMap<u64, usize>) {
    let counts: Vec<usize> = lines.iter().map(|l| batches(l).len()).collect();
    assert!(
        counts.windows(2).all(|w| w[0] == w[1]),
        "unequal batch counts: {counts:?}"
    );
    if let Some(n) = per_rank {
        assert_eq!(counts[0], n);
    }
    for l in lines {
        for i in batches(l).into_iter().flatten() {
            *into.entry(i).or_default() += 1;
        }
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// 4 ranks, each launcher's variables: disjoint, complete and equal shares.
#[test]
fn four_rank_processes_split_an_epoch_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let n = image_folder(dir.path(), 3, 15).len(); // 45: not a multiple of 4 x 4
    for launcher in ["torchrun", "SLURM", "Open MPI", "PMI"] {
        let lines = job(launcher, 4, dir.path(), &args(&["shuffle=3", "epoch=1"]));
        let mut seen = BTreeMap::new();
        tally(&lines, None, &mut seen);
        assert_eq!(seen.len(), n, "{launcher}: every sample");
        assert!(seen.values().all(|&c| c == 1), "{launcher}: {seen:?}");
        // One global state, the same on every rank.
        assert!(lines.iter().all(|l| l["state"] == lines[0]["state"]));
    }
}

/// Streaming mode, 7 WebDataset shards of uneven sizes on 4 ranks: every
/// rank finishes with the same batch count and no record twice.
#[test]
fn streaming_ranks_with_uneven_shards_all_finish() {
    let dir = tempfile::tempdir().unwrap();
    let png = encode(&pattern(8, 8, 1), image::ImageFormat::Png);
    let mut first = 0;
    for (s, records) in [5, 9, 3, 12, 7, 4, 10].into_iter().enumerate() {
        let path = dir.path().join(format!("train-{s:04}.tar"));
        let mut w = WebDatasetWriter::create(&path).unwrap();
        for i in 0..records {
            let key = format!("s{}", first + i);
            w.write(ShardSample {
                key: &key,
                ext: "png",
                bytes: &png,
                label: 0,
            })
            .unwrap();
        }
        first += records;
        w.finish().unwrap();
    }
    for (shuffle, epoch) in [("shuffle=9", "epoch=0"), ("shuffle=9", "epoch=3")] {
        let lines = job(
            "torchrun",
            4,
            dir.path(),
            &args(&["interleave=2", shuffle, epoch]),
        );
        let mut seen = BTreeMap::new();
        tally(&lines, None, &mut seen);
        assert!(!seen.is_empty());
        assert!(seen.values().all(|&c| c == 1), "{seen:?}");
        assert!(lines.iter().all(|l| l["state"] == lines[0]["state"]));
    }
}

/// 2 ranks take 3 batches each and save; the rest of the epoch, resumed on
/// 3 ranks and (separately) on 1, completes it with each sample once.
#[test]
fn a_state_saved_by_two_ranks_resumes_on_three_and_on_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let n = image_folder(&data, 2, 25).len(); // 50
    let save = dir.path().join("state-{rank}.json");
    let first = job(
        "torchrun",
        2,
        &data,
        &args(&["shuffle=11", "take=3", &format!("save={}", save.display())]),
    );
    let mut before = BTreeMap::new();
    tally(&first, Some(3), &mut before);
    assert_eq!(before.len(), 2 * 3 * 4);
    let read = |r: usize| std::fs::read(dir.path().join(format!("state-{r}.json"))).unwrap();
    assert_eq!(read(0), read(1), "every rank saves the same state");
    assert_eq!(first[0]["state"]["samples"], 24);
    let resume = format!("resume={}", dir.path().join("state-1.json").display());
    for (launcher, world) in [("SLURM", 3), ("PMI", 1)] {
        let rest = job(launcher, world, &data, &args(&["shuffle=11", &resume]));
        let mut seen = before.clone();
        tally(&rest, None, &mut seen);
        assert_eq!(seen.len(), n, "resumed on {world}: every sample");
        assert!(
            seen.values().all(|&c| c == 1),
            "resumed on {world}: {:?}",
            seen.iter().filter(|(_, &c)| c != 1).collect::<Vec<_>>()
        );
        // Done with epoch 0 on every rank: the same state, epoch 1's start.
        assert!(rest.iter().all(|l| l["state"] == rest[0]["state"]));
        assert_eq!(rest[0]["state"]["epoch"], 1);
    }
}
