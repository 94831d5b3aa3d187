use super::*;

fn cache(memory: u64, dir: Option<(&Path, u64)>) -> ObjectCache {
    let mut c = RemoteCache::memory(memory);
    if let Some((dir, limit)) = dir {
        c = c.disk(dir, limit);
    }
    ObjectCache::new(c).unwrap()
}

fn memory_of(c: &ObjectCache) -> u64 {
    let m = crate::sync::lock(&c.mem);
    m.bytes + m.pending
}

#[test]
fn memory_keeps_the_most_recently_used_within_its_limit() {
    let c = cache(400, None);
    let obj = |b: u8| Bytes::from(vec![b; 100]);
    c.store("a", &obj(1));
    c.store("b", &obj(2));
    c.store("c", &obj(3));
    assert_eq!(c.read("a", 100, 10..12).as_deref(), Some(&[1, 1][..]));
    c.store("d", &obj(4));
    c.store("e", &obj(5)); // evicts b, the least recently used
    assert!(c.whole("b", None).is_none());
    assert_eq!(c.whole("a", None).unwrap()[0], 1);
    assert_eq!(crate::sync::lock(&c.mem).bytes, 400);
    c.store("big", &Bytes::from(vec![0; 101])); // over a quarter
    assert!(c.whole("big", None).is_none());
    assert!(
        c.want("big", 101).is_none(),
        "too big to download into memory"
    );
    let f = c.want("f", 100).unwrap();
    assert!(c.want("f", 100).is_none(), "already downloading");
    assert_eq!(memory_of(&c), 500, "the download counts");
    c.downloaded(f, Some(obj(6)));
    assert_eq!(c.read("f", 100, 0..1).as_deref(), Some(&[6][..]));
    assert_eq!(crate::sync::lock(&c.mem).pending, 0);
}

#[test]
fn the_directory_outlives_the_process_and_keeps_its_limit() {
    let dir = std::env::temp_dir().join(format!("wick-objcache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let c = cache(0, Some((&dir, 250)));
        c.store("s3://b/x", &Bytes::from(vec![7; 100]));
        c.store("s3://b/y", &Bytes::from(vec![8; 100]));
        assert_eq!(
            c.read("s3://b/x", 100, 98..100).as_deref(),
            Some(&[7, 7][..])
        );
    }
    // A new cache (a restart) reads the files; a third object evicts
    // the least recently used.
    let c = cache(0, Some((&dir, 250)));
    assert_eq!(c.whole("s3://b/y", None).unwrap().len(), 100);
    let z = c.want("s3://b/z", 100).unwrap();
    std::fs::write(z.file.as_ref().unwrap(), [9; 100]).unwrap();
    c.downloaded(z, Some(Bytes::from(vec![9; 100])));
    let failed = c.want("s3://b/w", 100).unwrap();
    std::fs::write(failed.file.as_ref().unwrap(), [1; 10]).unwrap();
    c.downloaded(failed, None);
    assert!(c.whole("s3://b/w", None).is_none());
    assert!(c.whole("s3://b/z", None).is_some());
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(on_disk <= 250, "{on_disk} bytes on disk");
    assert_eq!(crate::sync::lock(c.disk.as_ref().unwrap()).map.len(), 2);
    assert!(c.whole("s3://b/y", None).is_some(), "y was used last");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file cut short while no process held it (a crash on a disk that
/// lost what was not yet written) is a miss once the object's size is
/// known, not short bytes served as the object.
#[test]
fn a_file_cut_before_a_restart_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(0, Some((dir.path(), 1000)));
    c.store("s3://b/x", &Bytes::from(vec![7; 100]));
    drop(c);
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let f = File::options().write(true).open(e.unwrap().path()).unwrap();
        f.set_len(60).unwrap();
    }
    let c = cache(0, Some((dir.path(), 1000)));
    assert!(c.whole("s3://b/x", Some(100)).is_none());
    assert!(c.read("s3://b/x", 100, 0..10).is_none());
    let fetch = |to: &Path| {
        std::fs::write(to, [8; 100]).map_err(|source| crate::error::Error::Io {
            path: to.into(),
            source,
        })
    };
    let mut got = Vec::new();
    let file = c.file("s3://b/x", 100, fetch).unwrap().unwrap();
    std::io::Read::read_to_end(&mut &file, &mut got).unwrap();
    assert_eq!(got, vec![8; 100], "fetched again, whole");
}

fn disk_of(c: &ObjectCache) -> std::sync::MutexGuard<'_, Disk> {
    crate::sync::lock(c.disk.as_ref().unwrap())
}

/// A full directory is listed once per tenth of its limit written,
/// not once per file kept (it was before every file once full).
#[test]
fn a_full_directory_is_not_listed_for_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(0, Some((dir.path(), 1000 * 100)));
    for i in 0..3000 {
        c.store(&format!("s3://b/{i}"), &Bytes::from(vec![1; 100]));
    }
    let d = disk_of(&c);
    assert!(d.scans <= 30, "{} listings for 3,000 files", d.scans);
    assert!(d.bytes <= 1000 * 100, "{} bytes kept", d.bytes);
    drop(d);
    let on_disk = std::fs::read_dir(dir.path()).unwrap().count();
    assert!((900..=1000).contains(&on_disk), "{on_disk} files");
    assert!(c.whole("s3://b/2999", None).is_some(), "the newest is kept");
    assert!(c.whole("s3://b/0", None).is_none(), "the oldest went");
}

/// Two processes (two caches) on one directory: each one's files in
/// use survive the other's eviction, since uses are stamped on the
/// files and both rank by that one clock.
#[test]
fn processes_sharing_a_directory_keep_each_others_hot_files() {
    let dir = tempfile::tempdir().unwrap();
    let limit = 10 * 100;
    let (a, b) = (
        cache(0, Some((dir.path(), limit))),
        cache(0, Some((dir.path(), limit))),
    );
    let obj = Bytes::from(vec![5; 100]);
    a.store("a/hot", &obj);
    b.store("b/hot", &obj);
    for i in 0..40 {
        // Each keeps using its hot file while both write cold ones.
        assert!(a.whole("a/hot", None).is_some(), "a's hot file, round {i}");
        assert!(b.whole("b/hot", None).is_some(), "b's hot file, round {i}");
        a.store(&format!("a/cold{i}"), &obj);
        b.store(&format!("b/cold{i}"), &obj);
    }
    let on_disk = std::fs::read_dir(dir.path()).unwrap().count();
    assert!(on_disk <= 12, "{on_disk} files for a limit of 10");
}

/// A file another process deleted is a miss (fetched again), not a
/// path that fails every later open in this one.
#[test]
fn a_file_deleted_by_another_process_is_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(0, Some((dir.path(), 1 << 20)));
    let fetches = std::cell::Cell::new(0);
    let fetch = |to: &Path| {
        fetches.set(fetches.get() + 1);
        std::fs::write(to, [3; 50]).map_err(|source| crate::error::Error::Io {
            path: to.into(),
            source,
        })
    };
    let read = |f: File| std::io::Read::bytes(f).count();
    assert_eq!(read(c.file("k", 50, fetch).unwrap().unwrap()), 50);
    assert_eq!(read(c.file("k", 50, fetch).unwrap().unwrap()), 50);
    assert_eq!(fetches.get(), 1, "the second open is the file's");
    for e in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    assert_eq!(read(c.file("k", 50, fetch).unwrap().unwrap()), 50);
    assert_eq!(fetches.get(), 2, "fetched again");
    // A temporary file of the wrong size is not renamed into place.
    let short = |to: &Path| {
        std::fs::write(to, [3; 10]).map_err(|source| crate::error::Error::Io {
            path: to.into(),
            source,
        })
    };
    drop(c.file("short", 50, short).unwrap());
    assert!(c.whole("short", None).is_none());
}

/// The ranks of a node share a cache directory: each made its cache when
/// the directory was empty, then all ask for one object at once. One
/// downloads it (under the object's lock file); the others wait and take
/// its file, whole, instead of each downloading its own copy. A rank that
/// starts after the download finds the file in the directory (it was not
/// there when it listed it).
#[test]
fn the_ranks_of_a_node_download_an_object_once() {
    let dir = tempfile::tempdir().unwrap();
    let fetched = std::sync::atomic::AtomicUsize::new(0);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let ranks: Vec<ObjectCache> = (0..4)
        .map(|_| cache(0, Some((dir.path(), 1 << 30))))
        .collect();
    let late = cache(0, Some((dir.path(), 1 << 30)));
    let fetch = |tmp: &Path| {
        fetched.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // Slow enough that the other ranks ask while it runs.
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(tmp, &data).map_err(|source| crate::error::Error::Io {
            path: tmp.to_path_buf(),
            source,
        })
    };
    std::thread::scope(|s| {
        for c in &ranks {
            let (fetch, data) = (&fetch, &data);
            s.spawn(move || {
                let mut f = c.file("tokens.bin", 100_000, fetch).unwrap().unwrap();
                let mut got = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut got).unwrap();
                assert!(got == *data, "the file is whole");
            });
        }
    });
    assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 1);
    late.file("tokens.bin", 100_000, fetch).unwrap().unwrap();
    assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A file the node makes once ([`ObjectCache::claim`]): the first
/// process takes its lock; another asking meanwhile is told it is busy,
/// or, waiting, gets the lock once the first lets it go without
/// publishing (as when it dies: the kernel drops its `flock`), and makes
/// the file itself; once published, every process (one made later
/// included) finds it, whatever its length.
#[test]
fn a_file_the_node_makes_once_is_claimed_by_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        cache(0, Some((dir.path(), 1 << 30))),
        cache(0, Some((dir.path(), 1 << 30))),
    );
    let Some(Claim::Mine(lock)) = a.claim("index", false) else {
        panic!("the first claim takes the lock");
    };
    assert!(matches!(b.claim("index", false), Some(Claim::Busy)));
    // A waiting claim waits for the holder, which ends without the file.
    let waited = std::thread::scope(|s| {
        let w = s.spawn(|| b.claim("index", true));
        std::thread::sleep(Duration::from_millis(100));
        drop(lock);
        w.join().unwrap()
    });
    let Some(Claim::Mine(lock)) = waited else {
        panic!("the waiting claim takes the lock its holder let go");
    };
    b.publish("index", b"made once").unwrap();
    drop(lock);
    for c in [&a, &b, &cache(0, Some((dir.path(), 1 << 30)))] {
        let Some(Claim::Ready(mut f)) = c.claim("index", false) else {
            panic!("a published file is found");
        };
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        assert_eq!(got, b"made once");
    }
    assert!(cache(0, None).claim("index", true).is_none());
}

#[test]
fn a_file_made_in_place_counts_in_the_limit_and_is_evicted_like_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(0, Some((dir.path(), 250)));
    // Each made at its path (a chunked copy), then counted.
    for (k, key) in ["s3://b/x#chunks", "s3://b/y#chunks", "s3://b/z#chunks"]
        .iter()
        .enumerate()
    {
        let path = c.path_of(key).unwrap();
        std::fs::write(&path, vec![k as u8; 100]).unwrap();
        c.added(key, 100);
    }
    let exists = |key: &str| c.path_of(key).unwrap().exists();
    assert!(
        !exists("s3://b/x#chunks"),
        "the oldest is evicted past 250 bytes"
    );
    assert!(exists("s3://b/y#chunks") && exists("s3://b/z#chunks"));
    assert_eq!(crate::sync::lock(c.disk.as_ref().unwrap()).bytes, 200);
}
