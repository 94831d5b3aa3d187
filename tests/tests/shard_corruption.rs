//! Damaged shards: a flipped byte, a truncated record, a bad CRC, a bad tar
//! header, a lying safetensors header. Each gives an error naming the shard
//! and the byte offset, or, when skipping, loses only the damaged records.
//! Every byte flip and every truncation of small shards is tried too: no
//! panic, no hang (a deterministic stand-in for a fuzz target).

use candle_wick::source::{
    SafetensorsShards, ShardOptions, TfRecord, TfRecordOptions, WebDataset, WebDatasetOptions,
};
use candle_wick::{BadSamples, Error, Loader, Output, Source, Transforms};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/shards")
        .join(name)
}

/// A copy of fixture `name` in `dir`, changed by `edit`.
fn damaged(dir: &Path, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(fixture(name)).unwrap();
    edit(&mut bytes);
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `(offset, data length)` of each record of an intact TFRecord fixture.
fn tf_records(name: &str) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(fixture(name)).unwrap();
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        out.push((at as u64, len));
        at += 16 + len as usize;
    }
    out
}

fn shard_error(e: &Error) -> (PathBuf, u64, String) {
    match e {
        // The reason with its cause, as the message shows it.
        Error::Shard {
            path,
            offset,
            reason,
            source,
            ..
        } => {
            let cause = source.as_ref().map(|s| format!(": {s}"));
            (
                path.clone(),
                *offset,
                reason.clone() + &cause.unwrap_or_default(),
            )
        }
        other => panic!("expected a shard error, got {other}"),
    }
}

/// A change made to a shard's bytes.
type Edit<'a> = Box<dyn Fn(&mut Vec<u8>) + 'a>;

const TF: &str = "tf-00000-of-00002.tfrecord";

fn skip_damaged() -> TfRecordOptions {
    TfRecordOptions {
        shard: ShardOptions { skip_damaged: true },
        ..Default::default()
    }
}

#[test]
fn tfrecord_bad_data_crc_fails_that_record_only() {
    let dir = tempfile::tempdir().unwrap();
    let recs = tf_records(TF);
    let (off, _) = recs[2];
    let path = damaged(dir.path(), TF, |b| b[off as usize + 12 + 5] ^= 0x40);
    let src = TfRecord::open([&path]).unwrap();
    assert_eq!(src.len(), 6);
    let (p, at, reason) = shard_error(&src.read(2).unwrap_err());
    assert_eq!((p, at), (path.clone(), off));
    assert!(reason.contains("data checksum"), "{reason}");
    assert!(src.read(1).is_ok() && src.read(3).is_ok());

    // Through the loader under `skip`: exactly that record is lost and named.
    let mut loader = Loader::builder(src)
        .batch_size(4)
        .image_size(8)
        .transforms(Transforms::eval(8))
        .output(Output::U8Nhwc)
        .shard(0, 1)
        .bad_samples(BadSamples::Skip)
        .build()
        .unwrap();
    let mut n = 0;
    let mut skipped = Vec::new();
    for b in loader.epoch(0) {
        let b = b.unwrap();
        n += b.len();
        skipped.extend(b.skipped.into_iter().map(|s| s.key));
    }
    assert_eq!(n, 5);
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].ends_with(&format!("{TF}#2")), "{skipped:?}");
}

#[test]
fn tfrecord_bad_length_crc_and_truncation_name_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let recs = tf_records(TF);
    for (what, edit) in [
        (
            "length checksum",
            Box::new(|b: &mut Vec<u8>| b[recs[3].0 as usize + 9] ^= 1) as Edit,
        ),
        (
            "past the end",
            Box::new(|b: &mut Vec<u8>| b.truncate(recs[3].0 as usize + 20)),
        ),
        (
            "inside a record header",
            Box::new(|b: &mut Vec<u8>| b.truncate(recs[3].0 as usize + 5)),
        ),
    ] {
        let path = damaged(dir.path(), TF, |b| edit(b));
        let (p, at, reason) = shard_error(&TfRecord::open([&path]).unwrap_err());
        assert_eq!((p, at), (path.clone(), recs[3].0), "{what}");
        assert!(reason.contains(what), "{what}: {reason}");
        // Skipping: the three records before the damage remain, and the
        // damage is reported.
        let src = TfRecord::open_with([&path], skip_damaged()).unwrap();
        assert_eq!(src.len(), 3, "{what}");
        assert_eq!(src.damage().len(), 1);
        assert_eq!(src.damage()[0].offset, recs[3].0);
        for i in 0..3 {
            src.read(i).unwrap();
        }
    }
}

#[test]
fn gzip_tfrecord_damage_is_found_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = damaged(dir.path(), "tf-gzip.tfrecord.gz", |b| {
        let n = b.len();
        b.truncate(n / 2)
    });
    let err = TfRecord::open([&path]).unwrap_err();
    assert!(err.to_string().contains("tf-gzip.tfrecord.gz"), "{err}");
}

#[test]
fn tfrecord_index_files_are_written_used_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = damaged(dir.path(), TF, |_| {});
    let opts = TfRecordOptions {
        write_index_files: true,
        ..Default::default()
    };
    let a = TfRecord::open_with([&path], opts).unwrap();
    let idx = dir.path().join(format!("{TF}.idx"));
    let text = std::fs::read_to_string(&idx).unwrap();
    assert_eq!(text.lines().count(), 6);
    assert!(text.starts_with("0 "), "{text}");
    let b = TfRecord::open([&path]).unwrap();
    assert_eq!(a.read(5).unwrap(), b.read(5).unwrap());
    // A stale index (the shard was rewritten shorter) is an error naming it.
    std::fs::write(&path, &std::fs::read(fixture(TF)).unwrap()[..100]).unwrap();
    let err = TfRecord::open([&path]).unwrap_err().to_string();
    assert!(err.contains(".idx") && err.contains("stale"), "{err}");
}

const WDS: &str = "wds-000000.tar";

/// Offset of the tar header of member `name`.
fn header_of(bytes: &[u8], name: &str) -> usize {
    bytes
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .map(|p| p / 512 * 512)
        .unwrap()
}

#[test]
fn tar_bad_header_and_truncation_name_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture(WDS)).unwrap();
    let at = header_of(&bytes, "sample0002.cls");
    let path = damaged(dir.path(), WDS, |b| b[at + 3] ^= 0x20);
    let (p, off, reason) = shard_error(&WebDataset::open([&path]).unwrap_err());
    assert_eq!(p, path);
    // The offset is where the damaged member starts: webdataset writes PAX
    // tar, so a member is a PAX header block + its data + the header.
    let off = off as usize;
    assert!(
        off == at
            || (off + 1024 == at && bytes[off..off + 100].windows(9).any(|w| w == b"PaxHeader")),
        "{off} vs {at}"
    );
    assert!(reason.contains("header"), "{reason}");
    let opts = WebDatasetOptions {
        shard: ShardOptions { skip_damaged: true },
        ..Default::default()
    };
    // Samples 0 and 1 are whole; sample 2 lost its label to the damage.
    let src = WebDataset::open_with([&path], opts.clone()).unwrap();
    assert_eq!(src.len(), 2);
    assert_eq!(src.damage()[0].offset, off as u64);

    let png = header_of(&bytes, "sample0003.png");
    let path = damaged(dir.path(), WDS, |b| b.truncate(png + 700));
    let (_, off, reason) = shard_error(&WebDataset::open([&path]).unwrap_err());
    assert_eq!(off, png as u64, "the header of the cut member");
    assert!(reason.contains("past the end"), "{reason}");
    assert_eq!(WebDataset::open_with([&path], opts).unwrap().len(), 3);
}

#[test]
fn tar_sample_without_image_or_label_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture(WDS)).unwrap();
    // Rename sample0001.png to sample0001.xyz: the sample has no image.
    let at = header_of(&bytes, "sample0001.png");
    let path = damaged(dir.path(), WDS, |b| {
        b[at + 11..at + 14].copy_from_slice(b"xyz");
        // Fix the header checksum (bytes 148..156, octal, spaces counted).
        b[at + 148..at + 156].fill(b' ');
        let sum: u32 = b[at..at + 512].iter().map(|&x| u32::from(x)).sum();
        b[at + 148..at + 156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    });
    let err = WebDataset::open([&path]).unwrap_err().to_string();
    assert!(
        err.contains("sample0001") && err.contains("no image"),
        "{err}"
    );
}

#[test]
fn lying_safetensors_headers_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let name = "st-encoded.safetensors";
    let bytes = std::fs::read(fixture(name)).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + header_len].to_vec()).unwrap();
    let cases: Vec<(&str, Edit)> = vec![
        (
            "header length past the file",
            Box::new(|b: &mut Vec<u8>| b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes())),
        ),
        ("shape that disagrees with the data", {
            let h = header.replacen("[10]", "[90]", 1);
            Box::new(move |b: &mut Vec<u8>| b[8..8 + header_len].copy_from_slice(h.as_bytes()))
        }),
        ("offsets outside the bytes", {
            let h = header.clone();
            Box::new(move |b: &mut Vec<u8>| {
                // Sample 3's end offset set far past `encoded`.
                let v: serde_json::Value = serde_json::from_str(&h).unwrap();
                let start = v["offsets"]["data_offsets"][0].as_u64().unwrap() as usize;
                let at = 8 + header_len + start + 4 * 8;
                b[at..at + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
            })
        }),
        (
            "truncated data",
            Box::new(|b: &mut Vec<u8>| {
                let n = b.len();
                b.truncate(n - 10)
            }),
        ),
    ];
    for (what, edit) in cases {
        let path = damaged(dir.path(), name, |b| edit(b));
        let err = SafetensorsShards::open([&path]).unwrap_err();
        let (p, _, _) = shard_error(&err);
        assert_eq!(p, path, "{what}: {err}");
    }
}

/// Opens `path` with `open` and reads every record; any result is fine,
/// a panic is not.
fn survive(path: &Path, open: &dyn Fn(&Path) -> candle_wick::Result<Box<dyn Source>>) {
    if let Ok(src) = open(path) {
        for i in 0..src.len() {
            let _ = src.read(i);
        }
        if let Ok(Some(stream)) = src.stream_shard(0, &candle_wick::source::Parts::Default) {
            stream.for_each(drop);
        }
    }
}

#[test]
#[cfg(unix)]
fn every_flip_and_truncation_is_survived() {
    // Each opened by its name, as `wick` opens a path.
    let formats = [
        ("tf-00001-of-00002.tfrecord", 1),
        ("tf-gzip.tfrecord.gz", 7),
        ("wds-000001.tar", 5),
        ("st-encoded.safetensors", 3),
        ("st-pixels.safetensors", 3),
    ];
    let dir = tempfile::tempdir().unwrap();
    let open = |p: &Path| candle_wick::open_path(p);
    for (name, step) in formats {
        let good = std::fs::read(fixture(name)).unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, &good).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // Edits in place (a rewrite per case costs ~1 ms on a VM disk).
        let put = |at: usize, b: &[u8]| {
            std::os::unix::fs::FileExt::write_all_at(&file, b, at as u64).unwrap()
        };
        for at in (0..good.len()).step_by(step) {
            put(at, &[good[at] ^ 0xA5]);
            survive(&path, &open);
            put(at, &good[at..=at]);
            file.set_len(at as u64).unwrap();
            survive(&path, &open);
            put(at, &good[at..]);
        }
    }
}

/// Resuming a streamed epoch at any batch gives the batches a full run
/// yields from there, pixels and skipped keys included, also across a
/// record whose data checksum fails (review PT12).
#[test]
fn streaming_resume_across_a_damaged_record_matches_the_full_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (off, _) = tf_records(TF)[2];
    let a = damaged(dir.path(), TF, |b| b[off as usize + 12 + 5] ^= 0x40);
    let b = fixture("tf-00001-of-00002.tfrecord");
    let mut loader = Loader::builder(TfRecord::open([&a, &b]).unwrap())
        .batch_size(2)
        .image_size(8)
        .output(Output::U8Nhwc)
        .interleave(2, 1)
        .shuffle_buffer(3)
        .shuffle(4)
        .bad_samples(BadSamples::Skip)
        .build()
        .unwrap();
    type Seen = (Vec<u8>, Vec<String>, Vec<String>);
    let seen = |b: candle_wick::Batch| -> Seen {
        let px = tests::pixels(&b);
        (px, b.keys, b.skipped.into_iter().map(|s| s.key).collect())
    };
    let full: Vec<Seen> = loader.epoch(1).map(|b| seen(b.unwrap())).collect();
    assert!(
        full.iter().any(|b| !b.2.is_empty()),
        "the damaged record is skipped"
    );
    for k in 0..=full.len() {
        let from: Vec<Seen> = loader.epoch_from(1, k).map(|b| seen(b.unwrap())).collect();
        assert!(
            from[..] == full[k..],
            "epoch_from(1, {k}) differs from the full epoch"
        );
    }
}
