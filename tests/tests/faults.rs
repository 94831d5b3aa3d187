//! Faults while a loader runs: files deleted or made unreadable after the
//! dataset was indexed, shards truncated while open, and the consumer
//! dropping the epoch at every kind of point (before any batch, mid-way,
//! while the workers wait for a buffer, while it still holds batches).
//! Each gives the documented result, and dropping the epoch and the loader
//! joins every loader thread within 100 ms (the median of five drops, so
//! one scheduling stall on a busy machine cannot fail the test). One test
//! binary: its thread counts see no other test's loaders.

use candle_wick::source::ImageFolder;
use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use candle_wick::{error_chain, BadSamples, Loader, Output, Source};
use std::path::Path;
use std::time::{Duration, Instant};
use tests::{encode, pattern, wick_threads, Slow};

/// 12 images in two classes.
fn folder(dir: &Path) {
    tests::image_folder(dir, 2, 6);
}

fn loader(src: impl Source, policy: BadSamples) -> Loader {
    Loader::builder(src)
        .batch_size(4)
        .image_size(16)
        .output(Output::U8Nhwc)
        .workers(2)
        .bad_samples(policy)
        .build()
        .unwrap()
}

/// `(samples delivered, error or skip reasons)` of epoch 0.
fn run(l: &mut Loader) -> (usize, Vec<String>) {
    let mut good = 0;
    let mut bad = Vec::new();
    for b in l.epoch(0) {
        match b {
            Ok(b) => {
                good += b.len();
                bad.extend(b.skipped.iter().map(|s| error_chain(&s.error)));
            }
            Err(e) => bad.push(error_chain(&e)),
        }
    }
    (good, bad)
}

#[test]
fn faults_give_the_documented_result_and_drops_join_promptly() {
    files_deleted_or_locked_after_indexing_are_bad_samples_naming_them();
    a_shard_truncated_while_open_is_an_error_naming_it_not_a_crash();
    #[cfg(target_os = "linux")]
    a_token_file_truncated_while_mapped_is_an_error_naming_it_not_sigbus();
    #[cfg(target_os = "linux")]
    a_token_file_cut_inside_a_page_gives_no_zeros();
    dropping_at_every_point_joins_every_thread_within_100_ms();
}

fn files_deleted_or_locked_after_indexing_are_bad_samples_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    folder(dir.path());
    let src = || ImageFolder::new(dir.path()).unwrap();
    let (mut fail, mut skip) = (
        loader(src(), BadSamples::Fail),
        loader(src(), BadSamples::Skip),
    );
    // Indexed; now one file goes away and one loses its permissions.
    let gone = dir.path().join("class0/0002.jpg");
    std::fs::remove_file(&gone).unwrap();
    let locked = dir.path().join("class1/0003.png");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads a file without permissions: then only the deletion counts.
    let root = std::fs::read(&locked).is_ok();
    let bad_files = if root { 1 } else { 2 };

    let (good, errors) = run(&mut fail);
    assert_eq!(errors.len(), bad_files, "{errors:?}");
    assert!(
        errors[0].contains("0002.jpg") && errors[0].contains("No such file"),
        "{errors:?}"
    );
    if !root {
        assert!(
            errors[1].contains("0003.png") && errors[1].contains("ermission denied"),
            "{errors:?}"
        );
    }
    assert!(
        good < 12 - bad_files,
        "the failed batches' other samples are not delivered"
    );

    let (good, skipped) = run(&mut skip);
    assert_eq!(
        (good, skipped.len()),
        (12 - bad_files, bad_files),
        "{skipped:?}"
    );
    assert!(skipped[0].contains("0002.jpg"), "{skipped:?}");
}

fn a_shard_truncated_while_open_is_an_error_naming_it_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    folder(&dir.path().join("folder"));
    let src = ImageFolder::new(dir.path().join("folder")).unwrap();
    // Every shard format; safetensors in both layouts (read, not mapped:
    // a mapped file cut short would be SIGBUS).
    let formats: [(ShardFormat, &str); 4] = [
        (ShardFormat::TfRecord, ".tfrecord"),
        (ShardFormat::WebDataset, ".tar"),
        (ShardFormat::SafetensorsEncoded, ".safetensors"),
        (ShardFormat::SafetensorsPixels { size: 16 }, ".safetensors"),
    ];
    for (i, (format, ext)) in formats.into_iter().enumerate() {
        let opts = ConvertOptions {
            format,
            shard_size: 12,
            threads: 1,
            ..Default::default()
        };
        let out = dir.path().join(format!("shards-{i}"));
        let shards = convert(&src, &out, &opts, &|_| {}).unwrap();
        assert_eq!(shards.len(), 1);
        let opened = candle_wick::open_path(&shards[0]).unwrap();
        assert_eq!(opened.len(), 12);
        // Open and read: a WebDataset shard its manifest lists is opened
        // on its first read (cut before it, it is refused whole).
        opened.read(0).unwrap();
        let mut l = loader(opened, BadSamples::Skip);
        // Indexed whole; now cut to half its length.
        let len = std::fs::metadata(&shards[0]).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&shards[0])
            .unwrap();
        f.set_len(len / 2).unwrap();
        drop(f);
        let (good, skipped) = run(&mut l);
        assert!(good > 0 && good < 12, "{ext}: {good} delivered");
        assert_eq!(
            good + skipped.len(),
            12,
            "{ext}: every record either delivered or named"
        );
        for s in &skipped {
            assert!(s.contains(ext), "{s}");
        }
    }
}

/// `tokens` written to `path` as raw `u16`, and a loader of its
/// non-overlapping windows of `seq_len` under the skip policy (shuffled
/// when `shuffle` is given), with the number of windows.
#[cfg(target_os = "linux")]
fn token_loader(
    path: &std::path::Path,
    tokens: impl Iterator<Item = u16>,
    seq_len: usize,
    shuffle: Option<u64>,
) -> (usize, Loader) {
    use candle_wick::map::TokenWindowsMap;
    use candle_wick::source::{TokenFile, TokenSource, WindowOrder};
    let bytes: Vec<u8> = tokens.flat_map(u16::to_le_bytes).collect();
    std::fs::write(path, bytes).unwrap();
    let file = TokenFile::open(path).unwrap();
    let src = TokenSource::new(vec![file], seq_len, WindowOrder::NonOverlapping).unwrap();
    let mut b = Loader::builder(src.clone())
        .map(TokenWindowsMap::new(&src))
        .batch_size(4)
        .workers(2)
        .batches_in_flight(2)
        .prefetch(1)
        .bad_samples(BadSamples::Skip);
    if let Some(seed) = shuffle {
        b = b.shuffle(seed);
    }
    (src.len(), b.build().unwrap())
}

/// Token files stay memory-mapped; on Linux their mapping is guarded, so
/// a file cut short while a loader reads it gives bad samples naming it
/// (every window read after the first that met a lost page), not SIGBUS.
#[cfg(target_os = "linux")]
fn a_token_file_truncated_while_mapped_is_an_error_naming_it_not_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    let (windows, mut l) = token_loader(&path, (0..65_536u32).map(|i| i as u16), 64, None);
    // Cut to a quarter (the first 16,384 tokens: windows 0-254 whole).
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(32_768).unwrap();
    drop(f);
    let (good, skipped) = run(&mut l);
    // Windows read before the cut was seen are the file's; once a read
    // has seen it (a lost page, or a read ending in a zero byte while
    // the file is short), every read fails.
    assert!(good <= 255, "{good} delivered");
    assert_eq!(
        good + skipped.len(),
        windows,
        "every window delivered or named"
    );
    for s in &skipped {
        assert!(s.contains("train.bin") && s.contains("truncated"), "{s}");
    }
}

/// A cut inside a page: the kernel keeps that page mapped, zeros past the
/// new end, and a read there does not fault. No window of zeros is
/// delivered: each window is the file's or a bad sample naming it.
#[cfg(target_os = "linux")]
fn a_token_file_cut_inside_a_page_gives_no_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    // Three pages of tokens, none of them zero.
    let tokens = (0..6_144u32).map(|i| i as u16 + 1);
    let (windows, mut l) = token_loader(&path, tokens, 32, Some(3));
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(4_608).unwrap();
    drop(f);
    let (mut good, mut zeros, mut skipped) = (0, 0, 0);
    for b in l.epoch(0) {
        let b = b.unwrap();
        good += b.len();
        skipped += b.skipped.len();
        for s in &b.skipped {
            let text = error_chain(&s.error);
            assert!(text.contains("train.bin"), "{text}");
        }
        let tokens = b.get("tokens").unwrap().flatten_all().unwrap();
        zeros += tokens
            .to_vec1::<u32>()
            .unwrap()
            .iter()
            .filter(|&&t| t == 0)
            .count();
    }
    assert_eq!(zeros, 0, "tokens read as zeros ({good} windows delivered)");
    assert_eq!(good + skipped, windows, "every window delivered or named");
    assert!(skipped > 0, "{good} delivered, {skipped} skipped");
}

fn dropping_at_every_point_joins_every_thread_within_100_ms() {
    let png = encode(&pattern(16, 16, 1), image::ImageFormat::Png);
    let build = || {
        Loader::builder(Slow(png.clone()))
            .batch_size(4)
            .image_size(8)
            .workers(2)
            .batches_in_flight(2)
            .prefetch(1)
            .build()
            .unwrap()
    };
    let baseline = wick_threads().len();
    // Each point: how far the consumer gets before it drops everything.
    type Point = fn(&mut candle_wick::Epoch<'_>) -> Vec<candle_wick::Batch>;
    let points: [(&str, Point); 4] = [
        ("before any batch", |_| Vec::new()),
        ("after one batch", |e| vec![e.next().unwrap().unwrap()]),
        ("while the workers wait for a buffer", |e| {
            let b = e.next().unwrap().unwrap();
            // Nothing taken for a while: in flight and prefetch fill up.
            std::thread::sleep(Duration::from_millis(300));
            drop(b);
            Vec::new()
        }),
        ("holding batches", |e| {
            (0..3).map(|_| e.next().unwrap().unwrap()).collect()
        }),
    ];
    for (what, point) in points {
        let mut took = Vec::new();
        for _ in 0..5 {
            let mut loader = build();
            let mut epoch = loader.epoch(0);
            let held = point(&mut epoch);
            let t = Instant::now();
            drop(epoch);
            drop(loader);
            took.push(t.elapsed());
            // Batches held past the loader's drop stay valid.
            for b in &held {
                assert_eq!(b.images().unwrap().dims()[0], 4);
            }
            let left = tests::wick_threads_settled(baseline).len();
            assert_eq!(left, baseline, "{what}: threads left behind");
        }
        took.sort();
        eprintln!("{what}: drop + join took {took:?}");
        assert!(
            took[2] < Duration::from_millis(100),
            "{what}: drops took {took:?}"
        );
    }
}
