//! A corrupt, an empty and a missing file: an error naming the file under
//! `fail`; counted and skipped under `skip` with every other sample delivered.

use candle_wick::source::FileList;
use candle_wick::{BadSamples, Loader};
use std::collections::HashSet;
use std::path::Path;
use tests::{encode, pattern};

/// A file list of 12 good images plus a corrupt, an empty and a missing one.
fn dataset(dir: &Path) -> std::path::PathBuf {
    let mut lines = String::from("path,label\n");
    for i in 0..12 {
        let name = format!("good{i}.png");
        let img = encode(&pattern(20, 20, i), image::ImageFormat::Png);
        std::fs::write(dir.join(&name), img).unwrap();
        lines += &format!("{name},{}\n", i % 2);
        if i == 3 {
            let mut jpeg = encode(&pattern(20, 20, 99), image::ImageFormat::Jpeg);
            jpeg.truncate(jpeg.len() / 3);
            jpeg[40..60].fill(0xAB);
            std::fs::write(dir.join("corrupt.jpg"), jpeg).unwrap();
            lines += "corrupt.jpg,0\n";
        }
        if i == 6 {
            std::fs::write(dir.join("empty.jpg"), b"").unwrap();
            lines += "empty.jpg,1\n";
        }
        if i == 9 {
            lines += "missing.jpg,1\n";
        }
    }
    let list = dir.join("list.csv");
    std::fs::write(&list, lines).unwrap();
    list
}

#[test]
fn fail_policy_names_each_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let list = dataset(dir.path());
    let mut loader = Loader::builder(FileList::new(&list).unwrap())
        .batch_size(1)
        .image_size(16)
        .build()
        .unwrap();
    let mut errors = Vec::new();
    let mut good = 0;
    let epoch = loader.epoch(0);
    assert_eq!(epoch.len(), 15);
    for b in epoch {
        match b {
            Ok(b) => good += b.len(),
            Err(e) => errors.push(candle_wick::error_chain(&e)),
        }
    }
    assert_eq!(good, 12);
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].contains("corrupt.jpg"), "{}", errors[0]);
    assert!(errors[1].contains("empty.jpg"), "{}", errors[1]);
    assert!(errors[2].contains("missing.jpg"), "{}", errors[2]);
}

#[test]
fn skip_policy_counts_and_lists_bad_files_and_delivers_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let list = dataset(dir.path());
    let mut loader = Loader::builder(FileList::new(&list).unwrap())
        .batch_size(4)
        .image_size(16)
        .workers(2)
        .bad_samples(BadSamples::Skip)
        .build()
        .unwrap();
    let mut keys = HashSet::new();
    let mut skipped = Vec::new();
    let epoch = loader.epoch(0);
    assert_eq!(epoch.len(), 4);
    for b in epoch {
        let b = b.unwrap();
        assert_eq!(b.images().unwrap().dims()[0], b.len());
        assert_eq!(b.labels().unwrap().dims(), [b.len()]);
        keys.extend(b.keys);
        skipped.extend(b.skipped.into_iter().map(|s| s.key));
    }
    assert_eq!(keys.len(), 12);
    assert!(keys.iter().all(|k| k.contains("good")));
    let names: Vec<_> = skipped
        .iter()
        .map(|k| {
            Path::new(k)
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(names, ["corrupt.jpg", "empty.jpg", "missing.jpg"]);
    let stats = loader.stats();
    assert_eq!(stats.skipped.len(), 3);
    assert_eq!(stats.samples, 12);
}

/// 8 small PNGs in batches of 4 under the skip policy; `bad(i)` makes
/// sample `i` an empty file.
fn skipping_loader(bad: impl Fn(usize) -> bool) -> Loader {
    let png = encode(&pattern(8, 8, 4), image::ImageFormat::Png);
    let records: Vec<candle_wick::source::Record> = (0..8)
        .map(|i| {
            let bytes = if bad(i) { Vec::new() } else { png.clone() };
            candle_wick::source::Record::encoded(format!("s{i}"), bytes, 0)
        })
        .collect();
    Loader::builder(candle_wick::source::MemorySource::new(records))
        .batch_size(4)
        .image_size(8)
        .bad_samples(BadSamples::Skip)
        .build()
        .unwrap()
}

#[test]
fn skipped_keys_are_listed_once_however_many_epochs_skip_them() {
    let mut loader = skipping_loader(|i| i == 5);
    for epoch in 0..50 {
        for b in loader.epoch(epoch) {
            b.unwrap();
        }
    }
    let stats = loader.stats();
    assert_eq!(stats.skipped, ["s5"], "one key, not one per epoch");
    assert_eq!(stats.skipped_samples, 50);
}

#[test]
fn a_batch_of_only_bad_samples_is_yielded_empty_in_step() {
    let mut loader = skipping_loader(|i| (4..8).contains(&i));
    let batches: Vec<_> = loader.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 2, "the batch count stays the same");
    assert_eq!(batches[0].len(), 4);
    assert!(batches[1].is_empty());
    assert_eq!(batches[1].skipped.len(), 4);
    assert_eq!(batches[1].images().unwrap().dims()[0], 0);
}

#[test]
fn skipping_keeps_each_image_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let list = dataset(dir.path());
    let mut loader = Loader::builder(FileList::new(&list).unwrap())
        .batch_size(4)
        .image_size(16)
        .train_transforms()
        .shuffle(4)
        .output(candle_wick::Output::U8Nhwc)
        .workers(2)
        .bad_samples(BadSamples::Skip)
        .build()
        .unwrap();
    let slot = 16 * 16 * 3;
    let mut checked = 0;
    for b in loader.epoch(1).collect::<Vec<_>>() {
        let b = b.unwrap();
        let pixels = tests::pixels(&b);
        for (j, (key, &index)) in b.keys.iter().zip(&b.indices).enumerate() {
            // The same sample transformed alone, on this thread.
            let bytes = std::fs::read(key).unwrap();
            let mut want = vec![0u8; slot];
            loader
                .transform()
                .expect("the built-in image map")
                .apply(
                    key,
                    &bytes,
                    1,
                    index,
                    candle_wick::__bench::Slot::U8(&mut want),
                )
                .unwrap();
            assert_eq!(
                &pixels[j * slot..(j + 1) * slot],
                &want[..],
                "{key} moved away from its image"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 12);
}

#[test]
fn the_bad_samples_log_lists_each_bad_file_once_with_its_whole_reason() {
    let dir = tempfile::tempdir().unwrap();
    let list = dataset(dir.path());
    // Under `Fail`, one batch of all 15 samples: the batch's error names
    // the first bad file, and the log lists all three. Each policy has a
    // log of its own (a second loader on the same file would not list the
    // keys again: tests/quarantine.rs).
    let mut lines = Vec::new();
    for (policy, batch) in [(BadSamples::Skip, 4), (BadSamples::Fail, 15)] {
        let log = dir.path().join(format!("quarantine-{batch}.jsonl"));
        let mut loader = Loader::builder(FileList::new(&list).unwrap())
            .batch_size(batch)
            .image_size(16)
            .workers(2)
            .bad_samples(policy)
            .bad_samples_log(&log)
            .build()
            .unwrap();
        for epoch in 0..3 {
            for b in loader.epoch(epoch) {
                let _ = b;
            }
        }
        lines.extend(
            std::fs::read_to_string(&log)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()),
        );
    }
    // Each key once per log.
    assert_eq!(lines.len(), 6, "{lines:?}");
    let names = |ls: &[serde_json::Value]| -> HashSet<String> {
        ls.iter()
            .map(|l| {
                let key = l["key"].as_str().unwrap();
                Path::new(key).file_name().unwrap().to_string_lossy().into()
            })
            .collect()
    };
    assert_eq!(names(&lines[3..]).len(), 3, "the failed batch's three");
    let want: HashSet<String> = ["corrupt.jpg", "empty.jpg", "missing.jpg"]
        .map(String::from)
        .into();
    assert_eq!(names(&lines), want);
    for l in &lines {
        let (key, reason) = (l["key"].as_str().unwrap(), l["reason"].as_str().unwrap());
        assert!(reason.contains(key), "{reason}");
        assert!(
            l["epoch"].is_u64() && l["index"].is_u64() && l["pid"].is_u64(),
            "{l}"
        );
        if key.ends_with("missing.jpg") {
            // The whole chain: the OS's own words too.
            assert!(reason.contains("No such file or directory"), "{reason}");
        }
    }
    // A log that cannot be opened is an error from build.
    let err = Loader::builder(FileList::new(&list).unwrap())
        .bad_samples_log(dir.path().join("no/such/dir/log.jsonl"))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("bad-samples log"), "{err}");
}
