//! Every format read through the object-store layer (`file://` URLs, the
//! same code path as `s3://`, `gs://`, `az://` and `https://` after the
//! store) gives the batches the local path gives, and a missing object is
//! an error naming its URL.

use candle_wick::source::Source;
use candle_wick::storage::{cached_bytes, set_cache, RemoteCache};
use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use candle_wick::{open_path, Loader};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tests::{image_folder, pixels};

/// `(indices, labels, pixels)` of every batch of epoch 1, random access or
/// streaming.
fn batches(path: &Path, stream: bool) -> Vec<(Vec<usize>, Vec<u32>, Vec<u8>)> {
    batches_of(open_path(path).unwrap().into(), stream)
}

/// [`batches`] of an open source.
fn batches_of(source: Arc<dyn Source>, stream: bool) -> Vec<(Vec<usize>, Vec<u32>, Vec<u8>)> {
    let mut b = Loader::builder(source)
        .batch_size(5)
        .image_size(16)
        .output(candle_wick::Output::U8Nhwc)
        .shuffle(4)
        .workers(2);
    if stream {
        b = b.interleave(2, 1);
    }
    let mut loader = b.build().unwrap();
    loader
        .epoch(1)
        .map(|b| {
            let b = b.unwrap();
            (b.indices.clone(), tests::labels(&b), pixels(&b))
        })
        .collect()
}

fn url(path: &Path) -> std::path::PathBuf {
    format!("file://{}", path.canonicalize().unwrap().display()).into()
}

/// The remote-object cache is process-wide: the tests here take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn every_format_reads_the_same_from_a_url() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    image_folder(&folder, 3, 7);
    let list = dir.path().join("list.csv");
    let rows: String = std::fs::read_dir(folder.join("class1"))
        .unwrap()
        .map(|e| {
            format!(
                "folder/class1/{},1\n",
                e.unwrap().file_name().to_string_lossy()
            )
        })
        .collect();
    std::fs::write(&list, rows).unwrap();
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    let mut cases = vec![(folder.clone(), false), (list.clone(), false)];
    for (name, format) in [
        ("tfrecord", ShardFormat::TfRecord),
        ("wds", ShardFormat::WebDataset),
        ("st", ShardFormat::SafetensorsEncoded),
    ] {
        let out = dir.path().join(name);
        let opts = ConvertOptions {
            format,
            shard_size: 6,
            ..Default::default()
        };
        convert(&source, &out, &opts, &|_| {}).unwrap();
        cases.push((out.clone(), false));
        cases.push((out, true));
    }
    for (path, stream) in cases {
        let local = batches(&path, stream);
        assert!(!local.is_empty());
        let remote = batches(&url(&path), stream);
        assert_eq!(local, remote, "{path:?} stream {stream}");
    }
}

#[test]
fn a_missing_object_is_an_error_naming_its_url() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let missing = url(dir.path()).join("nope.tar");
    let err = candle_wick::source::WebDataset::open([&missing]).unwrap_err();
    let chain = candle_wick::error_chain(&err);
    assert!(
        chain.contains("nope.tar") && chain.contains("not found"),
        "{chain}"
    );
    assert!(!err.is_transient(), "a missing object is not retried");
}

/// Waits (at most 30 s) until `done` holds.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Remote shards and sample files are kept whole, in memory and in a
/// directory: once cached, the batches stay the same with the objects gone
/// from the store (moved away), and a new cache over the same directory
/// (a restarted run) reads them from it.
#[test]
fn remote_objects_are_cached_in_memory_and_on_disk() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    image_folder(&folder, 3, 7);
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    let shards = dir.path().join("wds");
    let opts = ConvertOptions {
        format: ShardFormat::WebDataset,
        shard_size: 6,
        ..Default::default()
    };
    convert(&source, &shards, &opts, &|_| {}).unwrap();
    // The files the cache keeps: the shards and sample files (not the
    // WebDataset's manifest, read past the cache, nor its index files,
    // mapped from the cache's directory when it has one).
    let size = |d: &Path| -> u64 {
        walk(d)
            .iter()
            .filter(|p| {
                !p.ends_with("wick-manifest.json") && !p.to_string_lossy().ends_with(".wickidx")
            })
            .map(|p| p.metadata().unwrap().len())
            .sum()
    };
    let (shard_bytes, folder_bytes) = (size(&shards), size(&folder));
    let moved = |p: &Path, away: bool| {
        let other = p.with_extension("away");
        let (from, to) = if away { (p, &*other) } else { (&*other, p) };
        std::fs::rename(from, to).unwrap();
    };
    let cache_dir = dir.path().join("cache");
    for (name, cache) in [
        ("disk", RemoteCache::memory(0).disk(&cache_dir, 1 << 30)),
        ("memory", RemoteCache::memory(64 << 20)),
    ] {
        set_cache(&cache).unwrap();
        for (path, bytes) in [(&shards, shard_bytes), (&folder, folder_bytes)] {
            let local = batches(path, false);
            let remote: Arc<dyn Source> = open_path(url(path)).unwrap().into();
            assert_eq!(batches_of(remote.clone(), false), local, "{name} {path:?}");
            let held = || {
                if name == "disk" {
                    cached_bytes().1
                } else {
                    cached_bytes().0
                }
            };
            wait_for(&format!("{name} cache of {path:?}"), || held() >= bytes);
            moved(path, true);
            assert_eq!(
                batches_of(remote.clone(), false),
                local,
                "{name} {path:?} cached"
            );
            if name == "disk" {
                // A restart: a new cache over the same directory.
                set_cache(&RemoteCache::default()).unwrap();
                assert_eq!(cached_bytes(), (0, 0));
                set_cache(&cache).unwrap();
                // A shard is read as a stream too (its reader's windows).
                let stream = path == &shards;
                let away = batches(&path.with_extension("away"), stream);
                assert_eq!(batches_of(remote, stream), away, "{path:?} after a restart");
            }
            moved(path, false);
        }
        let _ = std::fs::remove_dir_all(&cache_dir);
        set_cache(&RemoteCache::default()).unwrap();
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A token file at a URL is fetched whole and mapped: the same tokens and
/// windows as the local file; with a remote cache directory its copy is
/// kept there; a missing one is an error naming its URL.
#[test]
fn token_files_read_from_a_url_like_the_local_file() {
    use candle_wick::source::{TokenFile, TokenSource, WindowOrder};
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    let tokens: Vec<u8> = (0..5000u16).flat_map(|t| (t * 7).to_le_bytes()).collect();
    std::fs::write(&path, &tokens).unwrap();
    let windows = |f: TokenFile| {
        let src = TokenSource::new(vec![f], 31, WindowOrder::NonOverlapping).unwrap();
        (0..src.len())
            .map(|i| src.read(i).unwrap().bytes)
            .collect::<Vec<_>>()
    };
    let local = windows(TokenFile::open(&path).unwrap());
    assert!(!local.is_empty());
    // No cache: a temporary copy, deleted once mapped.
    let remote = TokenFile::open(url(&path)).unwrap();
    assert_eq!(remote.len(), 5000);
    assert_eq!(windows(remote), local);
    let temporary = format!("wick-object-{}-", std::process::id());
    let left = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&temporary)
        })
        .count();
    assert_eq!(left, 0, "the temporary copy is deleted once mapped");
    // A cache directory keeps the copy; the file can then go from the store.
    let cache_dir = dir.path().join("cache");
    set_cache(&RemoteCache::memory(0).disk(&cache_dir, 1 << 30)).unwrap();
    assert_eq!(windows(TokenFile::open(url(&path)).unwrap()), local);
    assert_eq!(cached_bytes().1, tokens.len() as u64);
    set_cache(&RemoteCache::default()).unwrap();
    let missing = format!(
        "file://{}/nope.bin",
        dir.path().canonicalize().unwrap().display()
    );
    let err = candle_wick::error_chain(&TokenFile::open(&missing).unwrap_err());
    assert!(err.contains(&missing) && err.contains("not found"), "{err}");
}

/// Remote shards are opened at once (on threads of their own): the
/// damage found while indexing, the member extensions and the records are
/// the same, in the same order, as opening the local files one by one.
#[test]
fn shards_opened_at_once_keep_their_order_and_damage() {
    use candle_wick::source::{
        ShardOptions, TfRecord, TfRecordOptions, WebDataset, WebDatasetOptions,
    };
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    image_folder(&folder, 3, 8);
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    let skip = ShardOptions { skip_damaged: true };
    for (name, format) in [
        ("wds", ShardFormat::WebDataset),
        ("tf", ShardFormat::TfRecord),
    ] {
        let out = dir.path().join(name);
        let opts = ConvertOptions {
            format,
            shard_size: 4,
            ..Default::default()
        };
        let mut shards = convert(&source, &out, &opts, &|_| {}).unwrap();
        // Indexed at open: without the manifest `wick convert` wrote (a
        // shard it lists is refused whole once cut, not indexed anew).
        let _ = std::fs::remove_file(out.join("wick-manifest.json"));
        // Shards 1 and 4 cut inside a record: damage in two of six.
        for i in [1, 4] {
            let len = std::fs::metadata(&shards[i]).unwrap().len();
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&shards[i])
                .unwrap();
            f.set_len(len - 700).unwrap();
        }
        shards.sort();
        let urls: Vec<_> = shards.iter().map(|p| url(p)).collect();
        let open = |paths: &[std::path::PathBuf]| -> Arc<dyn Source> {
            match name {
                "wds" => Arc::new(
                    WebDataset::open_with(
                        paths,
                        WebDatasetOptions {
                            shard: skip.clone(),
                            ..Default::default()
                        },
                    )
                    .unwrap(),
                ),
                _ => Arc::new(
                    TfRecord::open_with(
                        paths,
                        TfRecordOptions {
                            shard: skip.clone(),
                            read_index_files: false,
                            write_index_files: false,
                            ..Default::default()
                        },
                    )
                    .unwrap(),
                ),
            }
        };
        let (local, remote) = (open(&shards), open(&urls));
        let damaged = |s: &Arc<dyn Source>| -> Vec<(String, u64)> {
            s.damage()
                .iter()
                .map(|d| {
                    (
                        d.path.file_name().unwrap().to_string_lossy().into_owned(),
                        d.offset,
                    )
                })
                .collect()
        };
        assert_eq!(damaged(&local).len(), 2, "{name}");
        assert_eq!(damaged(&local), damaged(&remote), "{name}");
        assert_eq!(local.len(), remote.len());
        for i in 0..local.len() {
            let (a, b) = (local.read(i).unwrap(), remote.read(i).unwrap());
            assert_eq!((a.bytes, a.label), (b.bytes, b.label), "{name} record {i}");
        }
    }
}

/// A WebDataset no manifest lists, in object storage, with a cache
/// directory, is indexed once a node: four opens at once (threads
/// standing for a node's ranks; each holds its lock files open on its
/// own, as a process does) read each shard about once between them, not
/// once each, and see the same samples; an open started later reads no
/// shard byte, and its samples read as a local copy's.
#[test]
fn a_node_indexes_an_unlisted_webdataset_once() {
    use candle_wick::source::WebDataset;
    let _serial = serial();
    let server = tests::ObjectServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut total = 0u64;
    let mut locals = Vec::new();
    for s in 0..8 {
        let bytes = tests::wds_bytes(s * 40, 40, 3_000);
        total += bytes.len() as u64;
        let local = dir.path().join(format!("s-{s}.tar"));
        std::fs::write(&local, &bytes).unwrap();
        locals.push(local);
        server.put(&format!("/wds/s-{s}.tar"), bytes);
    }
    let urls: Vec<String> = (0..8)
        .map(|s| server.url(&format!("/wds/s-{s}.tar")))
        .collect();
    set_cache(&RemoteCache::memory(0).disk(dir.path().join("cache"), 1 << 30)).unwrap();
    let keys = |w: &WebDataset| (0..w.len()).map(|i| w.key(i)).collect::<Vec<_>>();
    let sent = server.bytes_sent();
    let opened: Vec<Vec<String>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..4)
            .map(|_| s.spawn(|| keys(&WebDataset::open(&urls).unwrap())))
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let read = server.bytes_sent() - sent;
    assert_eq!(opened[0].len(), 320);
    assert!(opened.iter().all(|k| *k == opened[0]), "the same samples");
    assert!(
        read < total * 3 / 2,
        "four opens read {read} bytes of shards of {total}: more than once each"
    );
    let sent = server.bytes_sent();
    let late = WebDataset::open(&urls).unwrap();
    assert_eq!(server.bytes_sent() - sent, 0, "a later open reads no shard");
    let local = WebDataset::open(&locals).unwrap();
    for i in [0, 39, 40, 200, 319] {
        let (a, b) = (late.read(i).unwrap(), local.read(i).unwrap());
        assert_eq!((a.bytes, a.label), (b.bytes, b.label), "sample {i}");
    }
    set_cache(&RemoteCache::default()).unwrap();
}
