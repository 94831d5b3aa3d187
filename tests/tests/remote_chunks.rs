//! A large token file in object storage is read by range, chunk by chunk,
//! into one local file that a node's processes share through the cache
//! directory: a rank's first window costs one chunk, not the corpus, and a
//! second reader of the node fetches nothing the first fetched. A
//! dataset's manifest likewise crosses the network once a node, each open
//! asking the store whether it changed. (Its own test binary: the chunk
//! size and the cache it sets are process-wide.)

use candle_wick::source::TokenFile;
use candle_wick::storage::{__set_chunk_bytes, set_cache, RemoteCache};
use tests::ObjectServer;

/// 64 KiB chunks; a 2 MB file of 10^6 u16 tokens holds 31.
const CHUNK: u64 = 64 << 10;

/// The remote cache is process-wide: the tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tokens() -> Vec<u16> {
    (0..1_000_000u32).map(|i| (i * 7 % 65_521) as u16).collect()
}

/// The GETs of `path` the server saw since entry `from` of its log.
fn gets(server: &ObjectServer, from: usize, path: &str) -> usize {
    let want = format!("GET {path} ");
    server.log()[from..]
        .iter()
        .filter(|l| l.starts_with(&want))
        .count()
}

fn window(f: &TokenFile, first: usize) -> Vec<u32> {
    let mut out = vec![0u32; 2048];
    f.read_into(first, &mut out).unwrap();
    out
}

fn want(tokens: &[u16], first: usize) -> Vec<u32> {
    tokens[first..first + 2048]
        .iter()
        .map(|&t| u32::from(t))
        .collect()
}

#[test]
fn a_large_token_file_is_read_by_chunk_and_shared_through_the_cache_directory() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    __set_chunk_bytes(CHUNK);
    let server = ObjectServer::start();
    let tokens = tokens();
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    server.put("/corpus/big.bin", bytes.clone());
    let url = server.url("/corpus/big.bin");
    let dir = tempfile::tempdir().unwrap();
    set_cache(&RemoteCache::memory(0).disk(dir.path(), 1 << 30)).unwrap();

    // Opening checks the header: the first chunk only.
    let (log, sent) = (server.log().len(), server.bytes_sent());
    let a = TokenFile::open(&url).unwrap();
    assert_eq!(a.len(), tokens.len());
    assert_eq!(gets(&server, log, "/corpus/big.bin"), 1);
    assert_eq!(server.bytes_sent() - sent, CHUNK);

    // A window deep in the file: one more chunk (tokens 600,000.. are
    // bytes 1,200,000.., inside chunk 18).
    let log = server.log().len();
    assert_eq!(window(&a, 600_000), want(&tokens, 600_000));
    assert_eq!(gets(&server, log, "/corpus/big.bin"), 1);
    // A window across two chunks (bytes 131,000..135,096 span 1 and 2):
    // two more.
    let log = server.log().len();
    assert_eq!(window(&a, 65_500), want(&tokens, 65_500));
    assert_eq!(gets(&server, log, "/corpus/big.bin"), 2);

    // Another reader of the node (another open, as another rank would)
    // finds those chunks in the directory's file: no GET for them.
    let log = server.log().len();
    let b = TokenFile::open(&url).unwrap();
    for first in [0, 600_000, 65_500] {
        assert_eq!(window(&b, first), want(&tokens, first));
    }
    assert_eq!(gets(&server, log, "/corpus/big.bin"), 0);

    // Every token, read by both: each chunk fetched once in all, so the
    // bytes sent are the file's once.
    let sent = server.bytes_sent();
    for first in (0..tokens.len() - 2048).step_by(2048) {
        assert_eq!(window(&a, first), want(&tokens, first), "at {first}");
        assert_eq!(window(&b, first), want(&tokens, first), "at {first}");
    }
    let total = server.bytes_sent() - sent;
    assert_eq!(total, bytes.len() as u64 - 4 * CHUNK);
}

/// Without a cache directory, each process fills a temporary copy of its
/// own, by chunk all the same.
#[test]
fn without_a_directory_a_process_reads_by_chunk_alone() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    __set_chunk_bytes(CHUNK);
    let server = ObjectServer::start();
    let tokens = tokens();
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    server.put("/alone/big.bin", bytes);
    set_cache(&RemoteCache::default()).unwrap();
    let url = server.url("/alone/big.bin");
    let log = server.log().len();
    let f = TokenFile::open(&url).unwrap();
    assert_eq!(window(&f, 900_000), want(&tokens, 900_000));
    assert_eq!(window(&f, 900_100), want(&tokens, 900_100));
    assert_eq!(gets(&server, log, "/alone/big.bin"), 2);
}

/// A dataset's manifest crosses the network once a node: the first open
/// keeps it in the cache directory with its entity tag; a later open (of
/// this process or another of the node) asks the store whether it
/// changed, and gets no body when it did not; a manifest rewritten since
/// is read again whole, never stale.
#[test]
fn a_manifest_is_fetched_once_a_node_and_asked_after_since() {
    use candle_wick::source::TfRecord;
    use candle_wick::Source;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = ObjectServer::start();
    let dir = tempfile::tempdir().unwrap();
    for k in 0..3 {
        let path = dir.path().join(format!("s-{k}.tfrecord"));
        let mut w = candle_wick::write::TfRecordWriter::create(&path).unwrap();
        (0..5u8).for_each(|i| w.write_record(&[i; 40]).unwrap());
        w.into_inner().unwrap();
        server.put(&format!("/m/s-{k}.tfrecord"), std::fs::read(&path).unwrap());
    }
    let pattern = server.url("/m/s-{0..2}.tfrecord");
    candle_wick::write::index(pattern.as_ref(), &Default::default()).unwrap();
    let manifest = server.get("/m/wick-manifest.json").unwrap();
    let urls: Vec<String> = (0..3)
        .map(|k| server.url(&format!("/m/s-{k}.tfrecord")))
        .collect();
    let cache = tempfile::tempdir().unwrap();
    set_cache(&RemoteCache::memory(0).disk(cache.path(), 1 << 30)).unwrap();
    let open = || {
        let (log, sent) = (server.log().len(), server.bytes_sent());
        let t = TfRecord::open(urls.clone()).unwrap();
        assert_eq!(t.len(), 15);
        let asked = server.log()[log..].to_vec();
        assert_eq!(asked, ["GET /m/wick-manifest.json auth=None"]);
        server.bytes_sent() - sent
    };
    assert_eq!(open(), manifest.len() as u64);
    assert_eq!(open(), 0, "an unchanged manifest is not sent again");
    // Rewritten (the same listing, other bytes): read whole again, then
    // not again.
    let mut changed = manifest.clone();
    changed.push(b'\n');
    server.put("/m/wick-manifest.json", changed.clone());
    assert_eq!(open(), changed.len() as u64);
    assert_eq!(open(), 0);
    // Without a directory every open reads it whole.
    set_cache(&RemoteCache::default()).unwrap();
    assert_eq!(open(), changed.len() as u64);
    assert_eq!(open(), changed.len() as u64);
}

/// A TFRecord shard's offsets are made once a node: the first process to
/// read the shard turns its `.idx` into 8 bytes a record in the cache
/// directory, and the others map that copy without reading the `.idx`
/// (here: the `.idx` gone from the node and spoiled in the store, a
/// second open still reads every record).
#[test]
fn tfrecord_offsets_are_made_once_a_node_and_mapped() {
    use candle_wick::source::TfRecord;
    use candle_wick::Source;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = ObjectServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s-0.tfrecord");
    let mut w = candle_wick::write::TfRecordWriter::create(&path).unwrap();
    (0..6u8).for_each(|i| w.write_record(&[i; 25]).unwrap());
    w.into_inner().unwrap();
    let shard = std::fs::read(&path).unwrap();
    server.put("/o/s-0.tfrecord", shard.clone());
    let url = server.url("/o/s-0.tfrecord");
    candle_wick::write::index(url.as_ref(), &Default::default()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    set_cache(&RemoteCache::memory(0).disk(cache.path(), 1 << 30)).unwrap();
    let first = TfRecord::open([&url]).unwrap();
    // Records are not Examples: each read fails parsing, after its bytes
    // were found through the offsets.
    let read_all = |t: &TfRecord| {
        (0..6).for_each(|i| {
            let e = candle_wick::error_chain(&t.read(i).unwrap_err());
            assert!(!e.contains(".idx"), "record {i}: {e}");
        })
    };
    read_all(&first);
    let want: Vec<u8> = [0u64, 41, 82, 123, 164, 205, 246]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    assert_eq!(shard.len(), 246);
    let mut copies = 0;
    for e in std::fs::read_dir(cache.path()).unwrap().flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        if bytes == want {
            copies += 1;
        } else if e.path().extension().is_some_and(|x| x == "obj") {
            // The `.idx`'s own copy: gone, as after an eviction.
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    assert_eq!(copies, 1, "one copy of the offsets, 8 bytes a record");
    server.put("/o/s-0.tfrecord.idx", b"0 1\n".to_vec());
    let second = TfRecord::open([&url]).unwrap();
    read_all(&second);
    set_cache(&RemoteCache::default()).unwrap();
}

/// The ranks of one launch on a node (here: this process, its parent
/// the launcher, with `LOCAL_WORLD_SIZE=2`) share one listing of a
/// prefix through the cache directory: a later open of the launch takes
/// it (and so agrees with the first, even on a shard added since); a
/// process outside a launch of several ranks lists again.
#[test]
fn the_ranks_of_a_launch_on_a_node_share_a_listing() {
    struct Unset;
    impl Drop for Unset {
        fn drop(&mut self) {
            std::env::remove_var("LOCAL_WORLD_SIZE");
        }
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let shard = |k: usize| {
        let path = dir.path().join(format!("s-{k}.tfrecord"));
        let mut w = candle_wick::write::TfRecordWriter::create(&path).unwrap();
        (0..5u8).for_each(|i| w.write_record(&[i; 20]).unwrap());
        w.into_inner().unwrap();
    };
    (0..3).for_each(shard);
    let prefix = format!("file://{}/", dir.path().display());
    let cache = tempfile::tempdir().unwrap();
    set_cache(&RemoteCache::memory(0).disk(cache.path(), 1 << 30)).unwrap();
    let _unset = Unset;
    std::env::set_var("LOCAL_WORLD_SIZE", "2");
    let len = || candle_wick::open_path(&prefix).unwrap().len();
    assert_eq!(len(), 15);
    shard(3);
    assert_eq!(len(), 15, "the launch's listing, made by its first open");
    std::env::remove_var("LOCAL_WORLD_SIZE");
    assert_eq!(len(), 20, "one rank a node: its own listing");
    set_cache(&RemoteCache::default()).unwrap();
}
