//! Every format read through the object-store layer (`file://` URLs, the
//! same code path as `s3://`, `gs://`, `az://` and `https://` after the
//! store) gives the batches the local path gives, and a missing object is
//! an error naming its URL.

use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use candle_wick::{open_path, Loader};
use std::path::Path;
use tests::{image_folder, pixels};

/// `(indices, labels, pixels)` of every batch of epoch 1, random access or
/// streaming.
fn batches(path: &Path, stream: bool) -> Vec<(Vec<usize>, Vec<u32>, Vec<u8>)> {
    let mut b = Loader::builder(open_path(path).unwrap())
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

#[test]
fn every_format_reads_the_same_from_a_url() {
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
