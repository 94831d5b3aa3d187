//! Every part of a record, from shards written by the real libraries
//! (`tests/fixtures/shards/make_shards.py`: TensorFlow's TFRecordWriter,
//! webdataset's TarWriter): a map that asks for parts gets each feature and
//! member as stored; one that asks for none reads image + class only.

use candle_wick::source::{Parts, TfRecord, Value, WebDataset, WebDatasetOptions};
use candle_wick::Source;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/shards")
        .join(name)
}

/// `(labels, sizes as [h, w])` the generator wrote.
fn expected() -> (Vec<i64>, Vec<[usize; 2]>) {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("expected.json")).unwrap()).unwrap();
    let labels = v["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_i64().unwrap())
        .collect();
    let sizes = v["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            [
                s[0].as_u64().unwrap() as usize,
                s[1].as_u64().unwrap() as usize,
            ]
        })
        .collect();
    (labels, sizes)
}

#[test]
fn every_tf_example_feature_is_a_part() {
    let (labels, sizes) = expected();
    let tf = TfRecord::open([
        fixture("tf-00000-of-00002.tfrecord"),
        fixture("tf-00001-of-00002.tfrecord"),
    ])
    .unwrap();
    for i in 0..tf.len() {
        let all = tf.read_parts(i, &Parts::All, Vec::new()).unwrap();
        let names: Vec<&str> = all.parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "image/class/label",
                "image/encoded",
                "image/format",
                "image/height",
                "image/object/bbox/xmin"
            ],
            "sample {i}: every feature, sorted by name"
        );
        assert_eq!(
            all.part("image/class/label"),
            Some(&Value::Int64(vec![labels[i]]))
        );
        assert_eq!(
            all.part("image/height"),
            Some(&Value::Int64(vec![sizes[i][0] as i64]))
        );
        assert_eq!(all.part_bytes("image/format").unwrap(), b"PNG");
        assert_eq!(
            all.part("image/object/bbox/xmin"),
            Some(&Value::Float(vec![0.1, 0.2]))
        );
        assert_eq!(all.part_bytes("image/encoded").unwrap(), &all.bytes[..]);
        assert_eq!(all.label as i64, labels[i]);
        // Only what is asked for; none by default.
        let one = tf
            .read_parts(i, &Parts::Named(vec!["image/height".into()]), Vec::new())
            .unwrap();
        assert_eq!(one.parts.len(), 1);
        assert!(tf.read(i).unwrap().parts.is_empty());
        // A missing part is an error naming the sample and the parts it has.
        let e = one.part_bytes("image/width").unwrap_err().to_string();
        assert!(
            e.contains("image/width") && e.contains("image/height"),
            "{e}"
        );
        assert!(e.contains("tf-0000"), "{e}");
    }
}

#[test]
fn every_webdataset_member_is_a_part() {
    let (labels, _) = expected();
    let wds = WebDataset::open_with(
        [fixture("wds-000000.tar"), fixture("wds-000001.tar")],
        WebDatasetOptions::default(),
    )
    .unwrap();
    assert_eq!(wds.len(), labels.len());
    for (i, &label) in labels.iter().enumerate() {
        let all = wds.read_parts(i, &Parts::All, Vec::new()).unwrap();
        let names: Vec<&str> = all.parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["cls", "json", "png"],
            "sample {i}: members in tar order"
        );
        assert_eq!(all.part_bytes("png").unwrap(), &all.bytes[..]);
        let cls = std::str::from_utf8(all.part_bytes("cls").unwrap()).unwrap();
        assert_eq!(cls.trim().parse::<i64>().unwrap(), label);
        let json: serde_json::Value =
            serde_json::from_slice(all.part_bytes("json").unwrap()).unwrap();
        assert_eq!(json["i"].as_u64(), Some(i as u64));
        assert_eq!(json["label"].as_i64(), Some(label));
        let named = wds
            .read_parts(i, &Parts::Named(vec!["json".into()]), Vec::new())
            .unwrap();
        assert_eq!(named.parts.len(), 1);
        assert!(wds.read(i).unwrap().parts.is_empty());
    }
}
