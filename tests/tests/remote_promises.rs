//! What the storage chapter promises of remote data, where users run it:
//! a big object over a slow link arrives whole and a stalled one fails
//! naming it; ranks that are each PID 1 (one container each) share a cache
//! directory without corrupting it; an object rewritten while open is an
//! error, never its new bytes at the old offsets; credentials in a URL are
//! refused and never printed; a prefix lists one level as a folder does;
//! a file list read from a URL stays in its store; `wick convert` into an
//! earlier conversion's folder is refused; read-ahead stops retrying when
//! its loader is dropped; a WebDataset with a manifest opens reading no
//! shard, and a shard rewritten since is refused. The servers are [`tests::ObjectServer`]s on
//! 127.0.0.1, started here.

use candle_wick::source::{FileList, Source, TokenFile, TokenLayout, TokenType, WebDataset};
use candle_wick::storage::{configure, set_cache, RemoteCache};
use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use candle_wick::{error_chain, open_path, Error};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tests::{image_folder, within, ObjectServer};

/// The remote-object cache is process-wide: the tests that set one take
/// turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn url(path: &Path) -> PathBuf {
    format!("file://{}", path.canonicalize().unwrap().display()).into()
}

fn raw_u8(path: &str) -> candle_wick::Result<TokenFile> {
    TokenFile::open_as(path, TokenLayout::Raw(TokenType::U8))
}

/// A token file of 2.6 MB served at 64 KiB/s takes 40 s: longer than a
/// ranged request may take (30 s), so it must be fetched as a transfer
/// bounded by progress. It arrives whole, byte for byte.
#[test]
fn a_big_object_on_a_slow_link_arrives_whole() {
    let server = ObjectServer::start();
    let data: Vec<u8> = (0..2_600_000u32).map(|i| (i % 251) as u8).collect();
    server.put("/corpus/tokens.bin", data.clone());
    server.throttle(64 << 10);
    let t = Instant::now();
    let u = server.url("/corpus/tokens.bin");
    let tokens = within(300, move || raw_u8(&u)).unwrap();
    let took = t.elapsed();
    assert!(
        took > Duration::from_secs(30),
        "took {took:?}: not throttled"
    );
    assert_eq!(tokens.len(), data.len());
    let differ = (0..data.len())
        .filter(|&i| tokens.get(i) != Some(u32::from(data[i])))
        .count();
    assert_eq!(differ, 0, "{differ} tokens differ");
}

/// A download that stops sending fails after the idle limit (set to 1 s
/// here, 30 s by default), naming the URL; it does not hang.
#[test]
fn a_stalled_download_fails_naming_the_url() {
    let server = ObjectServer::start();
    server.put("/stall/tokens.bin", vec![7; 1 << 20]);
    server.stall_after(200 << 10);
    configure(
        &format!("http://127.0.0.1:{}", server.port),
        [("read_timeout", "1s")],
    );
    let u = server.url("/stall/tokens.bin");
    let e = within(120, move || raw_u8(&u).map(drop)).unwrap_err();
    let chain = error_chain(&e);
    assert!(chain.contains("/stall/tokens.bin"), "{chain}");
}

/// Two ranks, each PID 1 in a PID namespace of its own (`unshare -rpf`:
/// one container per rank), download one object into one cache directory,
/// the second starting while the first is two thirds through. Each maps
/// the object whole and unharmed, and the file left in the directory is
/// the object. (With temporary names made of the PID and a counter, both
/// wrote one file: the second truncated the first's, which then renamed
/// a file with a hole of zeros into place.)
#[test]
fn ranks_in_containers_share_a_cache_directory() {
    if let Ok(u) = std::env::var("WICK_CACHE_RANK_URL") {
        // A rank: PID 1 of its namespace.
        let dir = std::env::var("WICK_CACHE_RANK_DIR").unwrap();
        set_cache(&RemoteCache::memory(0).disk(dir, 1 << 30)).unwrap();
        let tokens = raw_u8(&u).unwrap();
        let bad = (0..tokens.len())
            .filter(|&i| tokens.get(i) != Some(9))
            .count();
        println!(
            "rank pid {}: {} tokens, {bad} not 9",
            std::process::id(),
            tokens.len()
        );
        assert_eq!((tokens.len(), bad), (1 << 20, 0));
        return;
    }
    let server = ObjectServer::start();
    server.put("/shared/tokens.bin", vec![9; 1 << 20]);
    server.throttle(256 << 10);
    let dir = tempfile::tempdir().unwrap();
    let rank = || {
        std::process::Command::new("unshare")
            .arg("-rpf")
            .arg(std::env::current_exe().unwrap())
            .args(["ranks_in_containers_share_a_cache_directory", "--exact"])
            .args(["--nocapture", "--test-threads", "1"])
            .env("WICK_CACHE_RANK_URL", server.url("/shared/tokens.bin"))
            .env("WICK_CACHE_RANK_DIR", dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
    };
    let Ok(a) = rank() else {
        eprintln!("skipped: unshare does not run");
        return;
    };
    std::thread::sleep(Duration::from_millis(2700));
    let b = rank().unwrap();
    for (name, child) in [("first", a), ("second", b)] {
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if text.contains("unshare failed") {
            eprintln!("skipped: unshare -rpf is not permitted here");
            return;
        }
        assert!(out.status.success(), "{name} rank failed:\n{text}");
        assert!(text.contains("rank pid 1:"), "not PID 1:\n{text}");
    }
    let files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let objects: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "obj"))
        .collect();
    assert_eq!(objects.len(), 1, "{files:?}");
    let kept = std::fs::read(objects[0]).unwrap();
    assert!(kept.len() == 1 << 20 && kept.iter().all(|&b| b == 9));
}

/// A WebDataset shard of 10 images in `dir`, and the shard's path.
fn one_shard(dir: &Path) -> PathBuf {
    let folder = dir.join("folder");
    image_folder(&folder, 2, 5);
    let out = dir.join("wds");
    let opts = ConvertOptions {
        format: ShardFormat::WebDataset,
        ..ConvertOptions::default()
    };
    convert(&*open_path(&folder).unwrap(), &out, &opts, &|_| {})
        .unwrap()
        .remove(0)
}

/// Flips one byte in the middle of `path`, keeping its size.
fn rewrite_same_size(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

/// A shard rewritten (same size) while open: its next read is an error
/// saying the object changed, never the new bytes at the old index's
/// offsets; over `file://` and HTTP alike. Without a cache and with one
/// (a read may then be the bytes cached from the version opened, never
/// the new ones).
#[test]
fn an_object_rewritten_while_open_is_not_read_with_the_old_index() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let shard = one_shard(dir.path());
    let server = ObjectServer::start();
    for cached in [false, true] {
        let cache = if cached {
            RemoteCache::memory(64 << 20)
        } else {
            RemoteCache::default()
        };
        set_cache(&cache).unwrap();
        std::fs::write(&shard, std::fs::read(&shard).unwrap()).unwrap();
        server.put("/wds/shard.tar", std::fs::read(&shard).unwrap());
        let over_file = WebDataset::open([url(&shard)]).unwrap();
        let over_http = WebDataset::open([server.url("/wds/shard.tar")]).unwrap();
        let before: Vec<Vec<u8>> = (0..10).map(|i| over_file.read(i).unwrap().bytes).collect();
        assert_eq!(over_http.read(0).unwrap().bytes, before[0]);
        rewrite_same_size(&shard);
        server.put("/wds/shard.tar", std::fs::read(&shard).unwrap());
        for (how, wds) in [("file", &over_file), ("http", &over_http)] {
            for (i, old) in before.iter().enumerate() {
                match wds.read(i) {
                    Ok(r) => assert!(
                        cached && r.bytes == *old,
                        "{how}, cached {cached}: sample {i} read Ok with other bytes"
                    ),
                    Err(e) => {
                        let chain = error_chain(&e);
                        assert!(chain.contains("changed"), "{how}: {chain}");
                        assert!(!e.is_transient(), "{how}: {chain}");
                    }
                }
            }
        }
    }
    set_cache(&RemoteCache::default()).unwrap();
}

/// A user and password in a URL are refused (object_store would not send
/// them) and appear in no message; the server sees no request.
#[test]
fn credentials_in_a_url_are_refused_and_never_printed() {
    let server = ObjectServer::start();
    server.put("/ok.tar", vec![0; 1024]);
    let secret = format!("http://alice:S3CR3T-PASS@127.0.0.1:{}/ok.tar", server.port);
    let signed = format!("{}?X-Amz-Signature=S3CR3T-SIG", server.url("/ok.tar"));
    for u in [&secret, &signed] {
        let errors: Vec<Error> = vec![
            WebDataset::open([u]).unwrap_err(),
            open_path(u).map(drop).unwrap_err(),
            raw_u8(u).map(drop).unwrap_err(),
        ];
        for e in errors {
            let chain = error_chain(&e);
            let shown = format!("{e} {e:?}");
            assert!(!chain.contains("S3CR3T"), "{chain}");
            assert!(!e.to_string().contains("S3CR3T"), "{shown}");
            assert!(chain.contains("127.0.0.1"), "{chain}");
        }
    }
    assert!(server.log().is_empty(), "{:?}", server.log());
    // A file list of such entries is refused at its line.
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.csv");
    std::fs::write(&list, format!("path,label\n{secret},0\n")).unwrap();
    let e = FileList::new(&list).unwrap_err();
    assert!(
        !error_chain(&e).contains("S3CR3T") && e.to_string().contains("line 2"),
        "{e}"
    );
}

/// A prefix lists its shards one level deep, as a local folder is read:
/// `train/` and `val/` under one prefix do not mix.
#[test]
fn a_prefix_reads_what_the_same_folder_reads() {
    let dir = tempfile::tempdir().unwrap();
    let shard = one_shard(dir.path());
    let root = dir.path().join("splits");
    for split in ["train", "val"] {
        std::fs::create_dir_all(root.join(split)).unwrap();
        std::fs::copy(&shard, root.join(split).join("shard-000.tar")).unwrap();
    }
    let local = open_path(&root).map(|s| s.len());
    let remote = open_path(url(&root)).map(|s| {
        let keys: Vec<String> = (0..s.len()).map(|i| s.key(i)).collect();
        keys
    });
    if let Ok(keys) = &remote {
        assert!(keys.iter().all(|k| !k.contains("/val/")), "{keys:?}");
    }
    assert!(
        local.is_err() && remote.is_err(),
        "{local:?} against {remote:?}"
    );
    // Each split alone reads its own shard.
    let train = open_path(url(&root.join("train"))).unwrap();
    assert_eq!(train.len(), 10);
    assert!((0..10).all(|i| train.key(i).contains("/train/")));
}

/// A file list read from a URL names objects beside it: an absolute
/// local path in it is refused at its line unless the list is trusted.
#[test]
fn a_list_from_a_url_stays_in_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    let images = image_folder(&folder, 1, 2);
    let outside = images[0].canonicalize().unwrap();
    let lists = dir.path().join("lists");
    std::fs::create_dir_all(&lists).unwrap();
    let list = lists.join("train.csv");
    std::fs::write(&list, format!("path,label\n{},0\n", outside.display())).unwrap();
    let e = FileList::new(url(&list)).unwrap_err();
    assert!(
        e.to_string().contains("line 2") && e.to_string().contains("outside"),
        "{e}"
    );
    let trusted = FileList::trusting(url(&list)).unwrap();
    assert_eq!(
        trusted.read(0).unwrap().bytes,
        std::fs::read(&outside).unwrap()
    );
    // Read locally, the same list keeps its documented meaning.
    assert_eq!(FileList::new(&list).unwrap().len(), 1);
    // Relative entries and URLs of the same store are read.
    let rel = format!("path,label\n../folder/class0/{}\n", "x.png,0");
    std::fs::write(lists.join("rel.csv"), rel).unwrap();
    assert!(FileList::new(url(&lists.join("rel.csv"))).is_ok());
}

/// `wick convert` into a folder holding an earlier, larger conversion:
/// refused, since its shards would join the new dataset; with
/// `overwrite`, the old shards are deleted first.
#[test]
fn convert_into_an_earlier_conversion_is_refused_or_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    image_folder(&folder, 3, 10);
    let out = dir.path().join("out");
    let opts = ConvertOptions {
        shard_size: 10,
        ..ConvertOptions::default()
    };
    let all = open_path(&folder).unwrap();
    assert_eq!(convert(&*all, &out, &opts, &|_| {}).unwrap().len(), 3);
    let small_dir = dir.path().join("small");
    image_folder(&small_dir, 1, 10);
    let small = open_path(&small_dir).unwrap();
    let e = convert(&*small, &out, &opts, &|_| {}).unwrap_err();
    assert!(e.to_string().contains("overwrite"), "{e}");
    assert_eq!(
        open_path(&out).unwrap().len(),
        30,
        "the earlier dataset is whole"
    );
    let over = ConvertOptions {
        overwrite: true,
        ..opts.clone()
    };
    convert(&*small, &out, &over, &|_| {}).unwrap();
    assert_eq!(open_path(&out).unwrap().len(), 10);
    // The same through a URL destination.
    let e = convert(&*all, &url(&out), &opts, &|_| {}).unwrap_err();
    assert!(e.to_string().contains("overwrite"), "{e}");
    // A conversion that fails part way (a file gone after the folder was
    // listed: its 26th record) leaves none of its shards, locally or
    // uploaded, rather than a smaller dataset that looks whole.
    let broken = candle_wick::source::ImageFolder::new(&folder).unwrap();
    std::fs::remove_file(broken.key(25)).unwrap();
    // A WebDataset's index files and manifest go too.
    let wds = ConvertOptions {
        format: ShardFormat::WebDataset,
        ..opts.clone()
    };
    for (dst, opts) in [
        (dir.path().join("failed"), &opts),
        (url(dir.path()).join("failed-url"), &opts),
        (dir.path().join("failed-wds"), &wds),
        (url(dir.path()).join("failed-wds-url"), &wds),
    ] {
        assert!(convert(&broken, &dst, opts, &|_| {}).is_err());
        let local = dst
            .to_str()
            .unwrap()
            .trim_start_matches("file://")
            .to_string();
        let left: Vec<_> = std::fs::read_dir(&local)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{left:?}");
    }
}

/// A source whose every read fails transiently after 20 ms.
#[derive(Debug)]
struct Flaky;

impl Source for Flaky {
    fn len(&self) -> usize {
        64
    }
    fn read(&self, index: usize) -> candle_wick::Result<candle_wick::source::Record> {
        std::thread::sleep(Duration::from_millis(20));
        Err(Error::Io {
            path: format!("flaky/{index}").into(),
            source: std::io::Error::from(std::io::ErrorKind::TimedOut),
        })
    }
    fn wants_read_ahead(&self) -> bool {
        true
    }
}

/// Reads ahead that keep failing stop retrying once their loader is
/// dropped: no `wick-read` thread outlives it by more than a moment
/// (each read had 40 retries, seconds of waits, left).
#[test]
fn read_ahead_stops_retrying_when_its_loader_is_dropped() {
    let mut loader = candle_wick::Loader::builder(Flaky)
        .batch_size(4)
        .image_size(8)
        .workers(1)
        .retry(40)
        .build()
        .unwrap();
    let epoch = loader.epoch(0);
    std::thread::sleep(Duration::from_millis(400));
    let reading = tests::wick_threads()
        .iter()
        .filter(|n| n.starts_with("wick-read"))
        .count();
    assert!(reading > 0, "no read-ahead: {:?}", tests::wick_threads());
    drop(epoch);
    drop(loader);
    let left = tests::settle(3, tests::wick_threads, |t| {
        !t.iter().any(|n| n.starts_with("wick-read"))
    });
    assert!(
        !left.iter().any(|n| n.starts_with("wick-read")),
        "{left:?} 3 s after the drop"
    );
}

/// A WebDataset shard of samples `first..first + samples` (a ~60 KB
/// `.jpg`, a `.cls` and a `.txt` each) as tar bytes.
fn wds_bytes(first: usize, samples: usize) -> Vec<u8> {
    tests::wds_bytes(first, samples, 60_000)
}

/// Opening a remote WebDataset shard reads its headers through 1 to
/// 8 MiB windows, each read ahead while the one before is used. The index
/// pass seeks over every member's data, so its next read almost never
/// starts exactly at a window's end: it must be served from the window
/// read ahead, not by dropping that window and fetching the same bytes
/// again (measured before: 1.96x the shard's bytes).
#[test]
fn an_index_pass_reads_each_byte_of_a_shard_once() {
    let server = ObjectServer::start();
    let shard = wds_bytes(0, 400);
    let size = shard.len() as u64;
    assert!(size > 20 << 20, "several windows: {size}");
    server.put("/wds/shard-0.tar", shard);
    let u = server.url("/wds/shard-0.tar");
    let src = within(120, move || WebDataset::open([u])).unwrap();
    assert_eq!(src.len(), 400);
    let sent = server.bytes_sent();
    assert!(
        sent <= size + size / 20,
        "opening sent {sent} bytes for a shard of {size} ({:.2}x): each byte should be read once",
        sent as f64 / size as f64
    );
}

/// A remote TFRecord shard with its `.idx` opens from the index: the
/// index's bytes and the first and last record headers, not the shard
/// (every byte of it was read before, to check each header). The records
/// read through it are the shard's.
#[test]
fn a_tfrecord_shard_with_an_index_opens_without_reading_the_shard() {
    use candle_wick::source::{ImageFolder, TfRecord};
    let dir = tempfile::tempdir().unwrap();
    image_folder(&dir.path().join("folder"), 4, 60);
    let folder = ImageFolder::new(dir.path().join("folder")).unwrap();
    let opts = ConvertOptions {
        format: ShardFormat::TfRecord,
        shard_size: 1000,
        ..Default::default()
    };
    let shards = convert(&folder, &dir.path().join("tf"), &opts, &|_| {}).unwrap();
    assert_eq!(shards.len(), 1);
    let shard = std::fs::read(&shards[0]).unwrap();
    // DALI's index: `offset size` (with the 16 bytes of framing) a record.
    let (mut index, mut at) = (String::new(), 0usize);
    while at < shard.len() {
        let len = u64::from_le_bytes(shard[at..at + 8].try_into().unwrap()) as usize;
        index.push_str(&format!("{at} {}\n", len + 16));
        at += len + 16;
    }
    let index = index.into_bytes();
    let server = ObjectServer::start();
    server.put("/tf/s.tfrecord", shard.clone());
    server.put("/tf/s.tfrecord.idx", index.clone());
    let u = server.url("/tf/s.tfrecord");
    let tf = within(60, move || TfRecord::open([u])).unwrap();
    let sent = server.bytes_sent();
    assert_eq!(tf.len(), 240);
    assert!(
        sent <= index.len() as u64 + 1024,
        "opening sent {sent} bytes: the index is {} and the shard {}",
        index.len(),
        shard.len()
    );
    let local = TfRecord::open([&shards[0]]).unwrap();
    for i in [0, 117, 239] {
        assert_eq!(tf.read(i).unwrap().bytes, local.read(i).unwrap().bytes);
    }
}

/// A WebDataset indexed once (`wick index`, here over HTTP: it reads the
/// shards and PUTs their index files and the manifest) opens over HTTP
/// reading its manifest alone, not one shard byte (by its prefix too,
/// which an HTTP server cannot list); a read of a sample
/// loads its shard's index (one small object) and reads the sample (the
/// shard's size and version come from the manifest: no HEAD), and
/// nothing of the other shards. Samples, labels and keys are those the
/// tar headers give. A shard rewritten since is an error naming it and
/// saying to index again, never a read at the old offsets.
#[test]
fn a_webdataset_with_a_manifest_opens_without_reading_a_shard() {
    use candle_wick::source::WebDatasetOptions;
    const SHARDS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let server = ObjectServer::start();
    let names: Vec<String> = (0..SHARDS).map(|k| format!("s-{k:04}.tar")).collect();
    let mut shard_bytes = 0;
    for (k, name) in names.iter().enumerate() {
        let bytes = wds_bytes(k * 30, 30);
        shard_bytes += bytes.len() as u64;
        std::fs::write(dir.path().join(name), &bytes).unwrap();
        server.put(&format!("/ds/{name}"), bytes);
    }
    let pattern = server.url("/ds/s-{0000..0007}.tar");
    let done = within(60, move || {
        candle_wick::write::index(Path::new(&pattern), &WebDatasetOptions::default())
    })
    .unwrap();
    assert_eq!((done.shards, done.records), (SHARDS, 240));
    let manifest = server.get("/ds/wick-manifest.json").unwrap().len() as u64;
    let indexed = server.log().len();
    let sent = server.bytes_sent();
    let urls: Vec<String> = names
        .iter()
        .map(|n| server.url(&format!("/ds/{n}")))
        .collect();
    let wds = within(60, move || WebDataset::open(urls)).unwrap();
    assert_eq!(wds.len(), 240);
    let opened = server.bytes_sent() - sent;
    let log = server.log()[indexed..].to_vec();
    assert!(
        opened <= manifest && opened * 100 < shard_bytes,
        "opening sent {opened} bytes: the manifest is {manifest}, the shards {shard_bytes}"
    );
    assert_eq!(log, ["GET /ds/wick-manifest.json auth=None"]);

    // Opened by its prefix (an HTTP server cannot list): the manifest
    // names the shards, fetched once for the detection and the open.
    let seen = server.log().len();
    let prefix = server.url("/ds/");
    let by_prefix = within(60, move || open_path(prefix)).unwrap();
    assert_eq!(by_prefix.len(), 240);
    let log = server.log()[seen..].to_vec();
    assert_eq!(log, ["GET /ds/wick-manifest.json auth=None"]);

    // Sample 5 of shard 5: its shard's index and its image, nothing else.
    let index5 = server.get("/ds/s-0005.tar.wickidx").unwrap().len() as u64;
    let (sent, seen) = (server.bytes_sent(), server.log().len());
    let r = wds.read(155).unwrap();
    let read = server.bytes_sent() - sent;
    assert!(
        read <= index5 + r.bytes.len() as u64,
        "a sample of {} bytes sent {read} (its shard's index is {index5})",
        r.bytes.len()
    );
    let log = server.log()[seen..].to_vec();
    assert_eq!(
        log,
        [
            "GET /ds/s-0005.tar.wickidx auth=None",
            "GET /ds/s-0005.tar auth=None"
        ]
    );

    // The same samples as the tar headers give, read locally without a
    // manifest.
    let local: Vec<PathBuf> = names.iter().map(|n| dir.path().join(n)).collect();
    let scanned = WebDataset::open(&local).unwrap();
    for i in [0, 29, 30, 155, 239] {
        let (a, b) = (wds.read(i).unwrap(), scanned.read(i).unwrap());
        assert_eq!((a.bytes, a.label), (b.bytes, b.label), "sample {i}");
        let tail = |k: &str| k.rsplit(':').next().unwrap().to_string();
        assert_eq!(tail(&a.key), tail(&b.key), "sample {i}");
        assert_eq!(tail(&a.key), format!("{i:09}"));
    }

    // Shard 6, not read yet, rewritten (one sample fewer) after the
    // manifest: refused when it is first read.
    server.put("/ds/s-0006.tar", wds_bytes(180, 29));
    let e = wds.read(185).unwrap_err();
    let chain = error_chain(&e);
    assert!(
        chain.contains("s-0006.tar") && chain.contains("wick index"),
        "{chain}"
    );
}

/// Indexed through a `file://` URL, the manifest records each shard's
/// object version, and opening asks for that version (no request until a
/// shard is read); a shard rewritten with the same size but other bytes
/// after it is refused when it is first read (its version differs),
/// never read at the index's offsets.
#[test]
fn a_shard_rewritten_after_indexing_is_refused_by_its_version() {
    use candle_wick::source::WebDatasetOptions;
    let dir = tempfile::tempdir().unwrap();
    for k in 0..2 {
        std::fs::write(dir.path().join(format!("s-{k}.tar")), wds_bytes(k * 5, 5)).unwrap();
    }
    let root = url(dir.path());
    let done = candle_wick::write::index(&root, &WebDatasetOptions::default()).unwrap();
    assert_eq!(done.records, 10);
    let text = std::fs::read_to_string(dir.path().join("wick-manifest.json")).unwrap();
    assert!(text.contains("\"version\": \""), "{text}");
    let shards: Vec<PathBuf> = (0..2)
        .map(|k| PathBuf::from(format!("{}/s-{k}.tar", root.display())))
        .collect();
    let wds = WebDataset::open(&shards).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    rewrite_same_size(&dir.path().join("s-1.tar"));
    assert_eq!(
        wds.read(0).unwrap().key.rsplit(':').next(),
        Some("000000000")
    );
    let e = wds.read(7).unwrap_err();
    let chain = error_chain(&e);
    assert!(
        chain.contains("s-1.tar") && chain.contains("changed") && chain.contains("wick index"),
        "{chain}"
    );
}

/// An image folder of 4 classes of 30 images converted to `format` in
/// shards of 30 under `tmp/local` (the manifest `wick convert` writes
/// beside them), the 4 shards put on a fresh server as `/{name}-{k}.{ext}`
/// (`name` a folder and a stem: `tf/s`) and indexed there over HTTP as
/// `wick index URL` does (each shard read, a manifest PUT). Gives the
/// local shards and the server.
fn served_shards(
    format: ShardFormat,
    tmp: &Path,
    name: &str,
    ext: &str,
) -> (Vec<PathBuf>, ObjectServer) {
    use candle_wick::source::ImageFolder;
    image_folder(&tmp.join("folder"), 4, 30);
    let folder = ImageFolder::new(tmp.join("folder")).unwrap();
    let opts = ConvertOptions {
        format,
        shard_size: 30,
        ..Default::default()
    };
    let local = convert(&folder, &tmp.join("local"), &opts, &|_| {}).unwrap();
    assert_eq!(local.len(), 4);
    let dir = local[0].parent().unwrap();
    assert!(dir.join("wick-manifest.json").exists());
    let server = ObjectServer::start();
    for (k, p) in local.iter().enumerate() {
        server.put(&format!("/{name}-{k}.{ext}"), std::fs::read(p).unwrap());
    }
    let pattern = server.url(&format!("/{name}-{{0..3}}.{ext}"));
    let done = within(60, move || {
        candle_wick::write::index(Path::new(&pattern), &Default::default())
    })
    .unwrap();
    assert_eq!((done.shards, done.records), (4, 120));
    (local, server)
}

/// TFRecord shards indexed once (`wick index` over HTTP: it reads each
/// shard's record headers and PUTs its `.idx` and the manifest) open over
/// HTTP reading the manifest alone, by their URLs or their prefix; a
/// record's read loads its shard's `.idx` and reads the record (no HEAD:
/// size and version come from the manifest), nothing of the other
/// shards. The records are the shards' own, the `.idx` the one `wick
/// convert` wrote beside them; a shard rewritten since is refused, naming
/// it.
#[test]
fn a_tfrecord_dataset_with_a_manifest_opens_without_reading_a_shard() {
    use candle_wick::source::TfRecord;
    let dir = tempfile::tempdir().unwrap();
    let (local, server) = served_shards(ShardFormat::TfRecord, dir.path(), "tf/s", "tfrecord");
    let shard_bytes: u64 = local
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let idx = |p: &Path| PathBuf::from(format!("{}.idx", p.display()));
    assert_eq!(
        server.get("/tf/s-2.tfrecord.idx").unwrap(),
        std::fs::read(idx(&local[2])).unwrap()
    );
    let manifest = server.get("/tf/wick-manifest.json").unwrap().len() as u64;
    let (seen, sent) = (server.log().len(), server.bytes_sent());
    let urls: Vec<String> = (0..4)
        .map(|k| server.url(&format!("/tf/s-{k}.tfrecord")))
        .collect();
    let tf = within(60, move || TfRecord::open(urls)).unwrap();
    assert_eq!(tf.len(), 120);
    let opened = server.bytes_sent() - sent;
    assert!(
        opened <= manifest && opened * 100 < shard_bytes,
        "opening sent {opened} bytes: the manifest is {manifest}, the shards {shard_bytes}"
    );
    assert_eq!(
        server.log()[seen..],
        ["GET /tf/wick-manifest.json auth=None"]
    );

    let seen = server.log().len();
    let prefix = server.url("/tf/");
    let by_prefix = within(60, move || open_path(prefix)).unwrap();
    assert_eq!(by_prefix.len(), 120);
    assert_eq!(
        server.log()[seen..],
        ["GET /tf/wick-manifest.json auth=None"]
    );

    // Record 75, of shard 2: its `.idx` and the record.
    let seen = server.log().len();
    let r = tf.read(75).unwrap();
    assert_eq!(
        server.log()[seen..],
        [
            "GET /tf/s-2.tfrecord.idx auth=None",
            "GET /tf/s-2.tfrecord auth=None"
        ]
    );
    // The records the local shards hold (opened through the manifest
    // `wick convert` wrote beside them).
    let plain = TfRecord::open(&local).unwrap();
    assert_eq!(r.bytes, plain.read(75).unwrap().bytes);
    same_samples_then_rewritten_refused(&tf, &plain, &server, &local, "tf/s-3.tfrecord");
}

/// `remote` (served shards) gives the samples `plain` (the same shards,
/// local) gives; then shard 3 (`name`), not read yet, rewritten on the
/// server after the manifest (with shard 2's bytes), is refused when it
/// is first read, naming it and `wick index`.
fn same_samples_then_rewritten_refused(
    remote: &dyn Source,
    plain: &dyn Source,
    server: &ObjectServer,
    local: &[PathBuf],
    name: &str,
) {
    assert_eq!(plain.len(), 120);
    for i in [0, 29, 30, 119] {
        let (a, b) = (remote.read(i).unwrap(), plain.read(i).unwrap());
        assert_eq!((a.bytes, a.label), (b.bytes, b.label), "sample {i}");
    }
    server.put(&format!("/{name}"), std::fs::read(&local[2]).unwrap());
    let chain = error_chain(&remote.read(100).unwrap_err());
    let file = name.rsplit('/').next().unwrap();
    assert!(
        chain.contains(file) && chain.contains("wick index"),
        "{chain}"
    );
}

/// Parquet files indexed once (`wick index` over HTTP: it reads each
/// file's footer and PUTs a manifest of their row groups' rows) open over
/// HTTP reading the manifest and the first file's footer (its schema,
/// columns and classes), no HEAD and nothing of the other files; reading
/// a row of the last file reads its footer and its row group, nothing of
/// the others. The rows are the files' own; a file rewritten since is
/// refused when first read, naming it.
#[test]
fn parquet_files_with_a_manifest_open_reading_one_footer() {
    use candle_wick::source::{Parquet, ParquetOptions};
    // A window of one row group: a read reads ahead the next group only.
    let one = || ParquetOptions {
        shuffle_window: 1,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let parquet = ShardFormat::Parquet { row_group: 10 };
    let (local, server) = served_shards(parquet, dir.path(), "pq/f", "parquet");
    let seen = server.log().len();
    let urls: Vec<String> = (0..4)
        .map(|k| server.url(&format!("/pq/f-{k}.parquet")))
        .collect();
    let pq = within(60, move || Parquet::open_with(urls, one())).unwrap();
    assert_eq!((pq.len(), pq.row_groups()), (120, 12));
    let log = server.log()[seen..].to_vec();
    assert_eq!(log[0], "GET /pq/wick-manifest.json auth=None");
    assert!(
        log[1..]
            .iter()
            .all(|l| l == "GET /pq/f-0.parquet auth=None"),
        "{log:?}"
    );
    assert!(log.len() <= 4, "{log:?}");

    // By the prefix: the manifest names the files.
    let seen = server.log().len();
    let prefix = server.url("/pq/");
    let by_prefix = within(60, move || open_path(prefix)).unwrap();
    assert_eq!(by_prefix.len(), 120);
    assert_eq!(
        server.log()[seen..][0],
        "GET /pq/wick-manifest.json auth=None"
    );

    // Row 95, of file 3: its footer and its row groups (the next read
    // ahead), nothing of the other files.
    let seen = server.log().len();
    let r = pq.read(95).unwrap();
    let log = server.log()[seen..].to_vec();
    assert!(
        !log.is_empty() && log.iter().all(|l| l == "GET /pq/f-3.parquet auth=None"),
        "{log:?}"
    );
    let plain = Parquet::open(&local).unwrap();
    assert_eq!(r.bytes, plain.read(95).unwrap().bytes);
    for i in [0, 29, 30, 61, 119] {
        let (a, b) = (pq.read(i).unwrap(), plain.read(i).unwrap());
        assert_eq!((a.bytes, a.label), (b.bytes, b.label), "row {i}");
    }

    // A fresh open, then file 2 rewritten (file 1's bytes) before it is
    // read: refused, naming it.
    let urls: Vec<String> = (0..4)
        .map(|k| server.url(&format!("/pq/f-{k}.parquet")))
        .collect();
    let pq = within(60, move || Parquet::open_with(urls, one())).unwrap();
    server.put("/pq/f-2.parquet", std::fs::read(&local[1]).unwrap());
    let chain = error_chain(&pq.read(65).unwrap_err());
    assert!(
        chain.contains("f-2.parquet") && chain.contains("wick index"),
        "{chain}"
    );
}

/// safetensors shards indexed once (`wick index` over HTTP: each shard's
/// header read, a manifest of their counts PUT) open over HTTP reading the
/// manifest alone; reading a sample of shard 2 reads its header, labels
/// and the sample, nothing of the others. The samples are the shards'
/// own; a shard rewritten since is refused when first read, naming it.
/// `wick convert` writes the manifest beside the shards it writes.
#[test]
fn safetensors_shards_with_a_manifest_open_reading_no_shard() {
    use candle_wick::source::SafetensorsShards;
    let dir = tempfile::tempdir().unwrap();
    let st = ShardFormat::SafetensorsEncoded;
    let (local, server) = served_shards(st, dir.path(), "st/s", "safetensors");
    let seen = server.log().len();
    let urls: Vec<String> = (0..4)
        .map(|k| server.url(&format!("/st/s-{k}.safetensors")))
        .collect();
    let st = within(60, move || SafetensorsShards::open(urls)).unwrap();
    assert_eq!(st.len(), 120);
    assert_eq!(
        server.log()[seen..],
        ["GET /st/wick-manifest.json auth=None"]
    );
    let seen = server.log().len();
    let r = st.read(75).unwrap();
    assert!(
        server.log()[seen..]
            .iter()
            .all(|l| l == "GET /st/s-2.safetensors auth=None"),
        "{:?}",
        &server.log()[seen..]
    );
    let plain = SafetensorsShards::open(&local).unwrap();
    assert_eq!(r.bytes, plain.read(75).unwrap().bytes);
    same_samples_then_rewritten_refused(&st, &plain, &server, &local, "st/s-3.safetensors");
}
