//! Every part of a record, from shards written by the real libraries
//! (`tests/fixtures/shards/make_shards.py` and `make_parts.py`:
//! TensorFlow's TFRecordWriter, webdataset's TarWriter, Python
//! safetensors) and from a file list: a map that asks for parts gets each
//! feature, member, tensor row and column as stored; one that asks for
//! none reads image + class only.

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

/// The values `make_parts.py` wrote, one object per sample.
fn parts_expected() -> Vec<serde_json::Value> {
    let bytes = std::fs::read(fixture("parts-expected.json")).unwrap();
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn webdataset_members_beyond_image_and_class_by_extension() {
    let want = parts_expected();
    let opts = WebDatasetOptions::default();
    let wds = WebDataset::open_with([fixture("parts-wds-000000.tar")], opts).unwrap();
    assert_eq!(wds.len(), want.len());
    let ask = Parts::Named(vec!["seg.png".into(), "json".into(), "txt".into()]);
    for (i, w) in want.iter().enumerate() {
        let r = wds.read_parts(i, &ask, Vec::new()).unwrap();
        assert!(r.key.ends_with(w["key"].as_str().unwrap()), "{}", r.key);
        assert_eq!(r.label as i64, w["label"].as_i64().unwrap());
        let mask = r.part_bytes("seg.png").unwrap();
        assert_eq!(mask.len() as u64, w["mask_png_len"].as_u64().unwrap());
        // The mask decodes as class ids: the rows safetensors holds.
        let mut ids = Vec::new();
        let size = candle_wick::ops::decode_label_map_into(&r.key, mask, &mut ids).unwrap();
        for (y, row) in w["mask_rows"].as_array().unwrap().iter().enumerate() {
            for (x, v) in row.as_array().unwrap().iter().enumerate() {
                assert_eq!(u64::from(ids[y * size.width + x]), v.as_u64().unwrap());
            }
        }
        let json: serde_json::Value =
            serde_json::from_slice(r.part_bytes("json").unwrap()).unwrap();
        assert_eq!(json["classes"], w["classes"]);
        assert_eq!(
            json["boxes"].as_array().unwrap().len(),
            w["boxes"].as_array().unwrap().len()
        );
        let txt = std::str::from_utf8(r.part_bytes("txt").unwrap()).unwrap();
        assert_eq!(txt, w["caption"].as_str().unwrap());
    }
}

#[test]
fn tf_example_lists_of_any_length_and_several_byte_strings() {
    let want = parts_expected();
    let tf = TfRecord::open([fixture("parts-tf.tfrecord")]).unwrap();
    for (i, w) in want.iter().enumerate() {
        let r = tf.read_parts(i, &Parts::All, Vec::new()).unwrap();
        let boxes = w["boxes"].as_array().unwrap();
        let xmin: Vec<f32> = boxes.iter().map(|b| f32s(b)[0]).collect();
        let ymin: Vec<f32> = boxes.iter().map(|b| f32s(b)[1]).collect();
        assert_eq!(r.part("image/object/bbox/xmin"), Some(&Value::Float(xmin)));
        assert_eq!(r.part("image/object/bbox/ymin"), Some(&Value::Float(ymin)));
        let classes: Vec<i64> = w["classes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_i64().unwrap())
            .collect();
        assert_eq!(
            r.part("image/object/class/label"),
            Some(&Value::Int64(classes))
        );
        assert_eq!(
            r.part_bytes("caption").unwrap(),
            w["caption"].as_str().unwrap().as_bytes()
        );
        let tags: Vec<Vec<u8>> = w["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().as_bytes().to_vec())
            .collect();
        let got = r.part("tags").unwrap();
        match tags.len() {
            // One value is plain bytes, several a list.
            1 => assert_eq!(got, &Value::Bytes(tags[0].clone())),
            _ => assert_eq!(got, &Value::BytesList(tags)),
        }
    }
}

/// The TensorFlow-written parts shard compressed into `dir` as
/// `parts-tf.tfrecord.<ext>`: `gz` (gzip) or `zz` (zlib).
fn compressed_parts(dir: &std::path::Path, ext: &str) -> PathBuf {
    use std::io::Write;
    let plain = std::fs::read(fixture("parts-tf.tfrecord")).unwrap();
    let level = flate2::Compression::default();
    let bytes = if ext == "gz" {
        let mut w = flate2::write::GzEncoder::new(Vec::new(), level);
        w.write_all(&plain).unwrap();
        w.finish().unwrap()
    } else {
        let mut w = flate2::write::ZlibEncoder::new(Vec::new(), level);
        w.write_all(&plain).unwrap();
        w.finish().unwrap()
    };
    let path = dir.join(format!("parts-tf.tfrecord.{ext}"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A compressed shard has no random access: the streaming mode reads it
/// with the source's own reader, which gives the same named parts as a
/// random-access read of the uncompressed shard (the TensorFlow-written
/// fixture, gzip- and zlib-compressed here: TensorFlow's GZIP and ZLIB
/// options compress the whole record stream the same way).
#[test]
fn a_compressed_shard_streams_every_feature() {
    let dir = tempfile::tempdir().unwrap();
    let (gz, zz) = (
        compressed_parts(dir.path(), "gz"),
        compressed_parts(dir.path(), "zz"),
    );
    let uncompressed = TfRecord::open([fixture("parts-tf.tfrecord")]).unwrap();
    let n = uncompressed.len();
    assert!(n > 1, "the fixture has several records");
    for path in [gz, zz] {
        let compressed = TfRecord::open([&path]).unwrap();
        assert_eq!(compressed.len(), n, "{path:?}");
        for parts in [
            Parts::All,
            Parts::Named(vec!["caption".into(), "tags".into()]),
        ] {
            let streamed: Vec<_> = compressed
                .stream_shard(0, &parts)
                .unwrap()
                .expect("a compressed shard streams with its own reader")
                .collect::<candle_wick::Result<_>>()
                .unwrap();
            assert_eq!(streamed.len(), n);
            for (i, got) in streamed.iter().enumerate() {
                let want = uncompressed.read_parts(i, &parts, Vec::new()).unwrap();
                assert_eq!((&got.bytes, got.label), (&want.bytes, want.label), "{i}");
                assert!(!want.parts.is_empty(), "record {i} has named parts");
                assert_eq!(got.parts, want.parts, "record {i} of {path:?}, {parts:?}");
            }
        }
        // Asking for no parts reads image + class only.
        let first = compressed
            .stream_shard(0, &Parts::Default)
            .unwrap()
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert!(first.parts.is_empty());
    }
}

/// Through a loader in the streaming mode: a map that asks for a feature
/// of a gzip shard gets it for every sample, in order.
#[test]
fn a_loader_streams_named_parts_from_a_compressed_shard() {
    use candle_wick::fields::{Field, FieldType};
    use candle_wick::map::{map_fn, Sample};
    let dir = tempfile::tempdir().unwrap();
    let gz = compressed_parts(dir.path(), "gz");
    let want = parts_expected();
    const MAX: usize = 64;
    // The caption's bytes, zero-padded, and its length.
    let map = map_fn(
        vec![
            Field::new("caption", FieldType::U8, &[MAX]),
            Field::new("len", FieldType::U32, &[]),
        ],
        |s: &mut Sample<'_>| {
            let caption = s.record().part_bytes("caption")?;
            let out = s.take::<u8>(0)?;
            out.fill(0);
            out[..caption.len()].copy_from_slice(caption);
            s.take::<u32>(1)?[0] = caption.len() as u32;
            Ok(())
        },
    )
    .parts(Parts::Named(vec!["caption".into()]));
    let mut loader = candle_wick::Loader::builder(TfRecord::open([&gz]).unwrap())
        .map(map)
        .batch_size(2)
        .interleave(1, 1)
        .workers(2)
        .build()
        .unwrap();
    let mut i = 0;
    for batch in loader.epoch(0) {
        let batch = batch.unwrap();
        let bytes = batch.get("caption").unwrap().to_vec2::<u8>().unwrap();
        let lens = batch.get("len").unwrap().to_vec1::<u32>().unwrap();
        for (row, len) in bytes.iter().zip(lens) {
            let caption = want[i]["caption"].as_str().unwrap().as_bytes();
            assert_eq!(&row[..len as usize], caption, "sample {i}");
            i += 1;
        }
    }
    assert_eq!(i, want.len(), "every sample, once");
}

#[test]
fn safetensors_rows_of_every_per_sample_tensor() {
    let want = parts_expected();
    let st =
        candle_wick::source::SafetensorsShards::open([fixture("parts-st.safetensors")]).unwrap();
    for (i, w) in want.iter().enumerate() {
        let r = st.read_parts(i, &Parts::All, Vec::new()).unwrap();
        let names: Vec<&str> = r.parts.iter().map(|(n, _)| n.as_str()).collect();
        // Every tensor of one row per sample, sorted (`offsets` has N + 1).
        assert_eq!(names, ["boxes", "ids", "labels", "mask"]);
        let Some(Value::Array { dtype, shape, data }) = r.part("boxes") else {
            panic!("boxes: {:?}", r.part("boxes"))
        };
        assert_eq!((dtype.as_str(), shape.as_slice()), ("F32", &[4, 4][..]));
        let rows: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want_rows: Vec<f32> = w["box_rows"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(f32s)
            .collect();
        assert_eq!(rows, want_rows);
        let Some(Value::Array { dtype, shape, data }) = r.part("mask") else {
            panic!("mask")
        };
        assert_eq!((dtype.as_str(), shape.as_slice()), ("U8", &[6, 8][..]));
        let want_mask: Vec<u8> = w["mask_rows"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u8)
            })
            .collect();
        assert_eq!(data, &want_mask);
        let Some(Value::Array { dtype, data, .. }) = r.part("ids") else {
            panic!("ids")
        };
        assert_eq!(dtype, "I64");
        assert_eq!(
            i64::from_le_bytes(data[..8].try_into().unwrap()),
            w["id"].as_i64().unwrap()
        );
        assert_eq!(r.label as i64, w["label"].as_i64().unwrap());
    }
}

#[test]
fn file_list_columns_after_path_and_label_are_parts() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a.png", "b.png"] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    let list = dir.path().join("list.csv");
    std::fs::write(
        &list,
        "path,label,mask,caption\na.png,3,m/a.png,a cat\nb.png,1,m/b.png\n",
    )
    .unwrap();
    let fl = candle_wick::source::FileList::new(&list).unwrap();
    let r = fl.read_parts(0, &Parts::All, Vec::new()).unwrap();
    assert_eq!(r.part("mask"), Some(&Value::Text("m/a.png".into())));
    assert_eq!(r.part("caption"), Some(&Value::Text("a cat".into())));
    let short = fl.read_parts(1, &Parts::All, Vec::new()).unwrap();
    assert_eq!(short.part("mask"), Some(&Value::Text("m/b.png".into())));
    assert_eq!(
        short.part("caption"),
        None,
        "a short row's column is absent"
    );
    assert!(fl.read(0).unwrap().parts.is_empty());
    // Without a header the columns are numbered.
    std::fs::write(&list, "a.png,3,x\n").unwrap();
    let fl = candle_wick::source::FileList::new(&list).unwrap();
    let r = fl.read_parts(0, &Parts::All, Vec::new()).unwrap();
    assert_eq!(r.part("col2"), Some(&Value::Text("x".into())));
}
