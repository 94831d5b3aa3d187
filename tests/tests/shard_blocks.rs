//! The shard-block shuffle through a loader: each rank of as many ranks as
//! parts reads its own shards, remote shards in a few large ranged
//! requests (each byte about once) instead of a request per sample, and a
//! state saved on one world size resumes on another with the parts it was
//! saved with, every sample of the epoch once. With a cache directory the
//! chunks go to the node's copies there: ranks sharing a part fetch them
//! once.

use candle_wick::source::{Source, WebDataset};
use candle_wick::{Loader, LoaderBuilder, LoaderState, ShardBlocks};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The chunk size and the remote cache are the process's: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn builder(source: Arc<dyn Source>, rank: usize, world: usize) -> LoaderBuilder {
    Loader::builder(source)
        .map(tests::label_map())
        .batch_size(8)
        .shuffle(5)
        .workers(2)
        .shard(rank, world)
}

/// Every batch of epoch `epoch`, as source indices, from `state` on when given.
fn indices(b: LoaderBuilder, epoch: u64, state: Option<LoaderState>) -> Vec<Vec<usize>> {
    let resumed = state.is_some();
    let mut l = match state {
        Some(s) => b.resume(s).build().unwrap(),
        None => b.build().unwrap(),
    };
    let e = if resumed {
        l.next_epoch()
    } else {
        l.epoch(epoch)
    };
    e.map(|b| b.unwrap().indices.clone()).collect()
}

/// `shards` WebDataset shards of `per` samples served on 127.0.0.1: the
/// server, their URLs and their bytes.
fn served(shards: usize, per: usize) -> (tests::ObjectServer, Vec<String>, u64) {
    let server = tests::ObjectServer::start();
    let mut total = 0u64;
    for s in 0..shards {
        let bytes = tests::wds_bytes(s * per, per, 3_000);
        total += bytes.len() as u64;
        server.put(&format!("/wds/s-{s}.tar"), bytes);
    }
    let urls = (0..shards)
        .map(|s| server.url(&format!("/wds/s-{s}.tar")))
        .collect();
    (server, urls, total)
}

#[test]
fn remote_shards_are_read_in_large_requests_each_byte_about_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (shards, per) = (8, 40);
    let (server, urls, total) = served(shards, per);
    // Chunks of 64 KiB: two or three to a ~150 KB shard.
    candle_wick::storage::__set_chunk_bytes(64 << 10);
    let source: Arc<dyn Source> = Arc::new(WebDataset::open(&urls).unwrap());
    let gets = || server.log().iter().filter(|l| l.starts_with("GET")).count();
    let (sent, got) = (server.bytes_sent(), gets());
    let mut seen = Vec::new();
    for rank in 0..2 {
        let blocks = builder(source.clone(), rank, 2).shard_blocks(ShardBlocks::new().window(64));
        seen.extend(indices(blocks, 1, None).concat());
    }
    let (read, requests) = (server.bytes_sent() - sent, gets() - got);
    assert_eq!(seen.len(), shards * per);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), shards * per);
    // 8 shards of 2-3 chunks; a chunk at the parts' cut is read by both
    // ranks. Per sample it would be 320 requests or more.
    let chunks = total.div_ceil(64 << 10) as usize + shards;
    assert!(
        requests <= chunks + 2,
        "{requests} requests for {chunks} chunks at most"
    );
    assert!(
        read <= total + 2 * (64 << 10),
        "an epoch read {read} bytes of shards of {total}"
    );
    candle_wick::storage::__set_chunk_bytes(32 << 20);
}

#[test]
fn a_state_resumes_on_another_world_size_with_the_parts_it_was_saved_with() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<_> = (0..6)
        .map(|s| {
            let p = dir.path().join(format!("s-{s}.tar"));
            std::fs::write(&p, tests::wds_bytes(s * 30, 30 + s, 100)).unwrap();
            p
        })
        .collect();
    let source: Arc<dyn Source> = Arc::new(WebDataset::open(&paths).unwrap());
    let n = source.len();
    let blocks =
        |rank, world| builder(source.clone(), rank, world).shard_blocks(ShardBlocks::new());
    // Two ranks take 3 batches each, then the job stops.
    let mut first = Vec::new();
    let mut state = None;
    for rank in 0..2 {
        let mut l = blocks(rank, 2).build().unwrap();
        let mut e = l.epoch(0);
        for _ in 0..3 {
            let b = e.next().unwrap().unwrap();
            first.extend(b.indices.clone());
            state = Some(b.state());
        }
    }
    let state = state.unwrap();
    assert!(
        state.identity.mode.contains("partitions 2"),
        "{}",
        state.identity.mode
    );
    // Three ranks go on from there: the parts stay two, the rest of the
    // epoch is read once.
    let mut rest = Vec::new();
    for rank in 0..3 {
        rest.extend(indices(blocks(rank, 3), 0, Some(state.clone())).concat());
    }
    let all: Vec<usize> = first.iter().chain(&rest).copied().collect();
    assert_eq!(all.len(), n);
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), n);
    // Partitions given anew that differ from the state's are refused.
    let other = blocks(0, 3)
        .shard_blocks(ShardBlocks::new().partitions(3))
        .resume(state)
        .build();
    assert!(other.is_err(), "a state of 2 parts resumed on 3");
}

#[test]
fn ranks_of_a_node_sharing_a_part_fetch_its_chunks_once_through_the_cache_directory() {
    use candle_wick::storage::{set_cache, RemoteCache};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (shards, per) = (4, 40);
    let (server, urls, total) = served(shards, per);
    // Chunks of 16 KiB: about ten to a shard.
    candle_wick::storage::__set_chunk_bytes(16 << 10);
    set_cache(&RemoteCache::memory(0).disk(dir.path().join("cache"), 1 << 30)).unwrap();
    let source: Arc<dyn Source> = Arc::new(WebDataset::open(&urls).unwrap());
    // One part read by two ranks: each reads half of every batch index.
    let blocks = ShardBlocks::new().partitions(1).window(40);
    // Both ranks' epochs: the samples they saw, the bytes each fetched.
    let epoch = || {
        let mut seen = Vec::new();
        let mut read = Vec::new();
        for rank in 0..2 {
            let sent = server.bytes_sent();
            let b = builder(source.clone(), rank, 2).shard_blocks(blocks);
            seen.extend(indices(b, 1, None).concat());
            read.push(server.bytes_sent() - sent);
        }
        assert_eq!(seen.len(), shards * per);
        assert_eq!(seen.iter().collect::<HashSet<_>>().len(), shards * per);
        read
    };
    let shared = epoch();
    // In memory, each rank fetches the chunks its samples touch.
    set_cache(&RemoteCache::default()).unwrap();
    let apart = epoch();
    candle_wick::storage::__set_chunk_bytes(32 << 20);
    assert!(
        shared.iter().sum::<u64>() <= total,
        "the node fetched {shared:?} bytes of shards of {total}: a chunk more than once"
    );
    assert!(
        shared[1] < shared[0] / 2,
        "the second rank fetched {shared:?}: not what the first left"
    );
    assert!(
        apart.iter().sum::<u64>() > total * 5 / 4,
        "in memory the ranks fetched {apart:?} of {total}"
    );
}

#[test]
fn a_shard_rewritten_under_its_chunks_is_an_error_naming_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (server, urls, _) = served(4, 40);
    candle_wick::storage::__set_chunk_bytes(16 << 10);
    let source: Arc<dyn Source> = Arc::new(WebDataset::open(&urls).unwrap());
    // Rewritten after the open: its chunks are asked for the version the
    // open saw, which the server no longer has.
    server.put("/wds/s-2.tar", tests::wds_bytes(500, 40, 3_100));
    let mut loader = builder(source, 0, 1)
        .shard_blocks(ShardBlocks::new().window(40))
        .build()
        .unwrap();
    let errors: Vec<String> = loader
        .epoch(0)
        .filter_map(|b| b.err())
        .map(|e| candle_wick::error_chain(&e))
        .collect();
    candle_wick::storage::__set_chunk_bytes(32 << 20);
    assert!(!errors.is_empty(), "a rewritten shard was read");
    assert!(
        errors[0].contains("s-2.tar"),
        "the error does not name the shard: {}",
        errors[0]
    );
}

#[test]
fn settings_that_cannot_apply_are_errors_at_build() {
    use candle_wick::source::{MemorySource, Record};
    let err = |b: LoaderBuilder| match b.build() {
        Err(e) => e.to_string(),
        Ok(_) => panic!("built"),
    };
    let memory = MemorySource::new(vec![Record::encoded("a", vec![0], 0); 4]);
    let msg = err(builder(Arc::new(memory), 0, 1).shard_blocks(ShardBlocks::new()));
    assert!(msg.contains("needs a sharded source"), "{msg}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.tar");
    std::fs::write(&path, tests::wds_bytes(0, 16, 100)).unwrap();
    let wds: Arc<dyn Source> = Arc::new(WebDataset::open([&path]).unwrap());
    let msg = err(builder(wds.clone(), 0, 1)
        .interleave(1, 1)
        .shard_blocks(ShardBlocks::new()));
    assert!(msg.contains("applies to random access"), "{msg}");
    let msg = err(builder(wds, 0, 1).shard_blocks(ShardBlocks::new().window(0)));
    assert!(msg.contains("at least 1"), "{msg}");
}
