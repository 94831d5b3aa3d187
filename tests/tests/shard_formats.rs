//! Shards written by the real libraries (TensorFlow's TFRecordWriter,
//! webdataset's TarWriter, Python safetensors; see
//! `tests/fixtures/shards/make_shards.py`) read back pixel for pixel, label
//! for label, by random access, by streaming, and through the loader.

use candle_wick::__bench::decode_rgb_into;
use candle_wick::source::{Record, SafetensorsShards, TfRecord, WebDataset, WebDatasetOptions};
use candle_wick::{BadSamples, Loader, Output, Size, Source, Transforms};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/shards")
        .join(name)
}

/// `(pixels, height, width, label)` of each sample, as PIL decoded them.
fn expected() -> Vec<(Vec<u8>, usize, usize, u32)> {
    let bytes = std::fs::read(fixture("expected.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let labels = st.tensor("labels").unwrap();
    let labels: Vec<u32> = labels
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    labels
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let t = st.tensor(&format!("pixels_{i}")).unwrap();
            (t.data().to_vec(), t.shape()[0], t.shape()[1], l)
        })
        .collect()
}

fn check_record(r: &Record, want: &(Vec<u8>, usize, usize, u32), what: &str) {
    let mut px = Vec::new();
    let Size {
        width: w,
        height: h,
    } = decode_rgb_into(&r.key, &r.bytes, &mut px).unwrap();
    assert_eq!((h, w), (want.1, want.2), "{what}: size of {}", r.key);
    assert_eq!(&px[..w * h * 3], &want.0[..], "{what}: pixels of {}", r.key);
    assert_eq!(r.label, want.3, "{what}: label of {}", r.key);
}

fn check_source(src: &dyn Source, what: &str) {
    let want = expected();
    assert_eq!(src.len(), want.len(), "{what}");
    for (i, w) in want.iter().enumerate() {
        check_record(&src.read(i).unwrap(), w, what);
    }
}

fn tfrecord_shards() -> Vec<PathBuf> {
    vec![
        fixture("tf-00000-of-00002.tfrecord"),
        fixture("tf-00001-of-00002.tfrecord"),
    ]
}

fn wds_shards() -> Vec<PathBuf> {
    vec![fixture("wds-000000.tar"), fixture("wds-000001.tar")]
}

#[test]
fn tfrecord_written_by_tensorflow() {
    let src = TfRecord::open(tfrecord_shards()).unwrap();
    assert_eq!(src.shards().len(), 2);
    assert_eq!(src.shards()[1].first, 6);
    check_source(&src, "tfrecord");
}

#[test]
fn compressed_tfrecords_stream_and_refuse_random_access() {
    for name in ["tf-gzip.tfrecord.gz", "tf-zlib.tfrecord.zz"] {
        check_compressed(name);
    }
}

fn check_compressed(name: &str) {
    let src = TfRecord::open([fixture(name)]).unwrap();
    let err = src.read(0).unwrap_err().to_string();
    assert!(err.contains("no random access"), "{err}");
    let want = expected();
    let stream = src
        .stream_shard(0, &candle_wick::source::Parts::Default)
        .unwrap()
        .expect("a compressed shard has its own reader");
    let records: Vec<Record> = stream.map(Result::unwrap).collect();
    assert_eq!(records.len(), want.len());
    for (r, w) in records.iter().zip(&want) {
        check_record(r, w, name);
    }
}

#[test]
fn webdataset_written_by_webdataset() {
    let src = WebDataset::open(wds_shards()).unwrap();
    check_source(&src, "wds .cls");
    assert!(
        src.key(7).ends_with("wds-000001.tar:sample0007"),
        "{}",
        src.key(7)
    );
    let json = WebDataset::open_with(
        wds_shards(),
        WebDatasetOptions {
            label_ext: Some("json".into()),
            ..Default::default()
        },
    )
    .unwrap();
    check_source(&json, "wds .json");
}

#[test]
fn safetensors_written_by_safetensors() {
    let src = SafetensorsShards::open([fixture("st-encoded.safetensors")]).unwrap();
    check_source(&src, "safetensors encoded");
    let px = SafetensorsShards::open([fixture("st-pixels.safetensors")]).unwrap();
    for (i, w) in expected().iter().enumerate() {
        let r = px.read(i).unwrap();
        assert_eq!(r.rgb_size, Some(Size::new(16, 12)));
        assert_eq!(r.label, w.3);
        // The script stored the top-left 12x16 of each image.
        for y in 0..12 {
            let row = &w.0[y * w.2 * 3..][..16 * 3];
            assert_eq!(
                &r.bytes[y * 48..][..48],
                row,
                "pixels row {y} of sample {i}"
            );
        }
    }
}

/// Labels of one epoch through the loader, in order.
fn loader_labels(src: impl Source, stream: bool) -> Vec<u32> {
    let mut b = Loader::builder(src)
        .batch_size(4)
        .image_size(8)
        .transforms(Transforms::eval(8))
        .output(Output::U8Nhwc)
        .workers(2)
        .shard(0, 1)
        .bad_samples(BadSamples::Fail);
    if stream {
        b = b.interleave(1, 1);
    }
    let mut loader = b.build().unwrap();
    let mut labels = Vec::new();
    for batch in loader.epoch(0) {
        labels.extend(batch.unwrap().labels().unwrap().to_vec1::<u32>().unwrap());
    }
    labels
}

#[test]
fn every_format_loads_through_the_loader_by_index_and_by_stream() {
    let want: Vec<u32> = expected().iter().map(|w| w.3).collect();
    for stream in [false, true] {
        assert_eq!(
            loader_labels(TfRecord::open(tfrecord_shards()).unwrap(), stream),
            want
        );
        assert_eq!(
            loader_labels(WebDataset::open(wds_shards()).unwrap(), stream),
            want
        );
        let st = SafetensorsShards::open([fixture("st-encoded.safetensors")]).unwrap();
        assert_eq!(loader_labels(st, stream), want);
        let px = SafetensorsShards::open([fixture("st-pixels.safetensors")]).unwrap();
        assert_eq!(loader_labels(px, stream), want);
    }
    let gz = TfRecord::open([fixture("tf-gzip.tfrecord.gz")]).unwrap();
    assert_eq!(loader_labels(gz, true), want);
}
