//! Shards across ranks are disjoint, cover the epoch and have equal batch counts.

use candle_wick::source::{MemorySource, Record};
use candle_wick::Loader;
use std::collections::HashSet;
use tests::{encode, pattern};

fn source(n: usize) -> MemorySource {
    let png = encode(&pattern(8, 8, 0), image::ImageFormat::Png);
    (0..n)
        .map(|i| Record::encoded(format!("s{i}"), png.clone(), (i % 3) as u32))
        .collect()
}

#[test]
fn shards_are_disjoint_cover_the_epoch_and_have_equal_batch_counts() {
    for n in [37, 40, 41, 9] {
        for world_size in 1..=4 {
            for drop_last in [false, true] {
                if drop_last && n < 4 * world_size {
                    // No full batch on every rank: an error, not 0 batches.
                    let built = Loader::builder(source(n))
                        .batch_size(4)
                        .drop_last(true)
                        .shard(0, world_size)
                        .build();
                    assert!(
                        built.is_err(),
                        "n {n} ws {world_size}: built with 0 batches"
                    );
                    continue;
                }
                let mut seen = HashSet::new();
                let mut counts = Vec::new();
                for rank in 0..world_size {
                    let mut loader = Loader::builder(source(n))
                        .batch_size(4)
                        .image_size(8)
                        .shuffle(5)
                        .drop_last(drop_last)
                        .shard(rank, world_size)
                        .workers(1)
                        .build()
                        .unwrap();
                    let mut batches = 0;
                    for b in loader.epoch(1) {
                        let b = b.unwrap();
                        assert!(!b.is_empty() && b.len() <= 4);
                        for i in b.indices {
                            assert!(seen.insert(i), "n {n} ws {world_size}: {i} twice");
                        }
                        batches += 1;
                    }
                    counts.push(batches);
                }
                assert!(
                    counts.windows(2).all(|w| w[0] == w[1]),
                    "n {n} ws {world_size}: {counts:?}"
                );
                let expect = if drop_last {
                    n / (4 * world_size) * 4 * world_size
                } else {
                    n
                };
                assert_eq!(
                    seen.len(),
                    expect,
                    "n {n} ws {world_size} drop_last {drop_last}"
                );
            }
        }
    }
}

#[test]
fn ranks_agree_on_the_fingerprint_and_a_different_source_does_not() {
    let build = |n: usize, rank: usize| {
        Loader::builder(source(n))
            .batch_size(4)
            .image_size(8)
            .shuffle(5)
            .shard(rank, 2)
            .build()
            .unwrap()
            .fingerprint()
    };
    assert_eq!(build(40, 0), build(40, 1), "every rank of one job agrees");
    assert_ne!(
        build(40, 0),
        build(48, 1),
        "a rank that sees other data differs"
    );
    let other_seed = Loader::builder(source(40))
        .batch_size(4)
        .image_size(8)
        .shuffle(6)
        .shard(1, 2)
        .build()
        .unwrap()
        .fingerprint();
    assert_ne!(build(40, 0), other_seed, "a rank with another seed differs");
}

/// Under the skip policy every rank still gets the planned batch count, and
/// each batch's kept and skipped samples are exactly its planned ones
/// (review PT11).
#[test]
fn skipping_keeps_ranks_in_lockstep_with_their_plans() {
    let png = encode(&pattern(8, 8, 0), image::ImageFormat::Png);
    for world_size in 1..=4 {
        let mut counts = Vec::new();
        for rank in 0..world_size {
            let records: MemorySource = (0..41)
                .map(|i| {
                    let bytes = if i % 5 == 0 { Vec::new() } else { png.clone() };
                    Record::encoded(format!("s{i}"), bytes, 0)
                })
                .collect();
            let mut loader = Loader::builder(records)
                .batch_size(4)
                .image_size(8)
                .shuffle(2)
                .shard(rank, world_size)
                .bad_samples(candle_wick::BadSamples::Skip)
                .build()
                .unwrap();
            let planned = loader.batches(0);
            let mut n = 0;
            for (i, b) in loader.epoch(0).enumerate() {
                let b = b.unwrap();
                let mut all = b.indices.clone();
                all.extend(
                    b.skipped
                        .iter()
                        .map(|s| s.key[1..].parse::<usize>().unwrap()),
                );
                all.sort();
                let mut plan = planned[i].clone();
                plan.sort();
                assert_eq!(all, plan, "ws {world_size} rank {rank} batch {i}");
                n += 1;
            }
            assert_eq!(n, planned.len());
            counts.push(n);
        }
        assert!(
            counts.windows(2).all(|w| w[0] == w[1]),
            "ws {world_size}: {counts:?}"
        );
    }
}
