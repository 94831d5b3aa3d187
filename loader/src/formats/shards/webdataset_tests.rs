use super::*;

/// A reader over `bytes` whose reads fail with an OS error (EIO) from
/// byte `fail_at` on: a disk failing mid-shard.
struct Failing {
    inner: std::io::Cursor<Vec<u8>>,
    fail_at: u64,
}

impl Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let pos = self.inner.position();
        if pos >= self.fail_at {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        let n = buf.len().min((self.fail_at - pos) as usize);
        self.inner.read(&mut buf[..n])
    }
}

impl std::io::Seek for Failing {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(to)
    }
}

/// One tar member of type `kind` named `name` in its own header.
fn raw_member(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_path(name).unwrap();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_entry_type(kind);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// A PAX record, `"<len> key=value\n"` with `len` counting itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut n = body.len() + 1;
    loop {
        let s = format!("{n}{body}");
        if s.len() == n {
            return s.into_bytes();
        }
        n = s.len();
    }
}

#[test]
fn long_names_and_pax_paths_name_members_and_huge_ones_are_refused() {
    let index = |tar: Vec<u8>| {
        let len = tar.len() as u64;
        let mut set = ShardSet::default();
        let skip = WebDatasetOptions {
            shard: ShardOptions { skip_damaged: true },
            ..WebDatasetOptions::default()
        };
        let r = index_shard(
            Path::new("s.tar"),
            std::io::Cursor::new(tar),
            len,
            &skip,
            &mut set,
        );
        (r, set.damage)
    };
    let regular = tar::EntryType::Regular;
    let long = "k".repeat(300);
    let good_members = |b: &mut tar::Builder<Vec<u8>>| {
        // PAX paths name the members; their headers' names are ignored.
        for (name, data) in [("pax/one.png", &b"img"[..]), ("pax/one.cls", b"4")] {
            let pax = pax_record("path", name);
            raw_member(b, tar::EntryType::XHeader, "PaxHeader/x", &pax);
            raw_member(b, regular, "ignored.bin", data);
        }
        // A 300-byte key: the tar crate writes GNU long-name members.
        for (ext, data) in [("png", &b"img2"[..]), ("cls", b"3")] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, format!("{long}.{ext}"), data)
                .unwrap();
        }
    };
    let mut b = tar::Builder::new(Vec::new());
    good_members(&mut b);
    let (samples, damage) = index(b.into_inner().unwrap());
    let samples = samples.unwrap();
    let got: Vec<_> = (0..samples.len())
        .map(|n| (samples.key(n), samples.label(n), samples.image(n).1))
        .collect();
    assert_eq!(got, [("pax/one", 4, 3), (long.as_str(), 3, 4)]);
    assert!(damage.is_empty());

    // A long-name member of 1 MiB (the tar crate would read it whole):
    // refused by its header, before a byte of it is read.
    let mut b = tar::Builder::new(Vec::new());
    raw_member(
        &mut b,
        tar::EntryType::GNULongName,
        "././@LongLink",
        &vec![b'a'; 1 << 20],
    );
    raw_member(&mut b, regular, "x.png", b"img");
    let (r, _) = index(b.into_inner().unwrap());
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("over the 64 KiB limit") && e.contains("s.tar"),
        "{e}"
    );

    // A PAX size the header disagrees with: damage where it is.
    let mut b = tar::Builder::new(Vec::new());
    good_members(&mut b);
    let pax = pax_record("size", "999");
    raw_member(&mut b, tar::EntryType::XHeader, "PaxHeader/y", &pax);
    raw_member(&mut b, regular, "late.png", b"img");
    let (r, damage) = index(b.into_inner().unwrap());
    assert_eq!(r.unwrap().len(), 2, "the samples before it are kept");
    assert!(damage[0].reason.contains("PAX size"), "{damage:?}");
}

#[test]
fn a_failing_disk_is_an_io_error_and_bad_bytes_are_damage() {
    use crate::write::{ShardSample, ShardWriter, WebDatasetWriter};
    let mut w = WebDatasetWriter::new(Vec::new());
    for i in 0..6 {
        let (key, bytes) = (format!("s{i}"), [7; 600]);
        let sample = ShardSample {
            key: &key,
            ext: "png",
            bytes: &bytes,
            label: i,
        };
        w.write(sample).unwrap();
    }
    let tar = w.into_inner().unwrap();
    let skip = WebDatasetOptions {
        shard: ShardOptions { skip_damaged: true },
        ..WebDatasetOptions::default()
    };
    let path = Path::new("shard-0.tar");
    let len = tar.len() as u64;
    // A sample is 2,560 bytes: the image's header and 1,024 bytes of
    // data, the label's header and one block. Reads fail in the third
    // sample's header, and where its label's data starts.
    for fail_at in [2 * 2560 + 100, 2 * 2560 + 2048] {
        let r = Failing {
            inner: std::io::Cursor::new(tar.clone()),
            fail_at,
        };
        let mut set = ShardSet::default();
        match index_shard(path, r, len, &skip, &mut set) {
            Err(Error::Io { path: p, source }) => {
                assert_eq!(p, path);
                assert_eq!(source.raw_os_error(), Some(5), "{source}");
            }
            other => panic!("fail at {fail_at}: {other:?}"),
        }
        assert!(set.damage.is_empty(), "an I/O error is not damage");
    }
    // The same archive with a corrupt header checksum: damage, kept
    // under skip_damaged, with the samples before it.
    let mut bad = tar.clone();
    bad[2 * 2560 + 148] ^= 0x11;
    let mut set = ShardSet::default();
    let r = std::io::Cursor::new(bad);
    let samples = index_shard(path, r, len, &skip, &mut set).unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(set.damage.len(), 1, "{:?}", set.damage);
    assert!(
        set.damage[0].reason.contains("bad tar header"),
        "{:?}",
        set.damage
    );
}

#[test]
fn keys_split_at_the_first_dot_of_the_file_name() {
    assert_eq!(
        split_key("a/b.c/0001.seg.png"),
        Some(("a/b.c/0001", "seg.png"))
    );
    assert_eq!(split_key("0001.jpg"), Some(("0001", "jpg")));
    assert_eq!(split_key("dir/noext"), None);
}

#[test]
fn labels_parse_from_text_and_json() {
    assert_eq!(parse_label(" 12\n", "cls", "label").unwrap(), 12);
    assert_eq!(parse_label(r#"{"label": 3}"#, "json", "label").unwrap(), 3);
    assert!(parse_label("-1", "cls", "label").is_err());
    let err = parse_label(r#"{"x": 3}"#, "json", "label").unwrap_err();
    assert!(err.reason.contains("no field"), "{err:?}");
    let err = parse_label("{", "json", "label").unwrap_err();
    assert!(err.source.is_some(), "the JSON error is kept: {err:?}");
}

/// A shard a manifest lists maps its index file on its first read (the
/// index then holds almost nothing of the process's memory), and an index
/// file cut short while mapped is an error naming it, never a crash or a
/// sample read at zeroed offsets.
#[cfg(target_os = "linux")]
#[test]
fn a_listed_shard_maps_its_index_and_a_cut_index_is_an_error() {
    use crate::write::{ShardSample, ShardWriter, WebDatasetWriter};
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s-0.tar");
    let mut w = WebDatasetWriter::create(&shard).unwrap();
    for i in 0..600u32 {
        let key = format!("sample-with-a-long-key-{i:06}");
        let bytes = [i as u8; 20];
        w.write(ShardSample {
            key: &key,
            ext: "png",
            bytes: &bytes,
            label: i % 7,
        })
        .unwrap();
    }
    w.finish().unwrap();
    crate::write::index(dir.path(), &WebDatasetOptions::default()).unwrap();
    let wds = WebDataset::open([&shard]).unwrap();
    assert!(wds.shards[0].opened.get().is_none(), "not read yet");
    let r = wds.read(599).unwrap();
    assert_eq!((r.label, r.bytes[0]), (599 % 7, (599 % 256) as u8));
    assert!(
        r.key.ends_with(":sample-with-a-long-key-000599"),
        "{}",
        r.key
    );
    let index = &wds.shards[0].opened.get().unwrap().index;
    let sidecar = sidecar_path(&shard);
    let file_len = std::fs::metadata(&sidecar).unwrap().len();
    assert!(file_len > 3 * 4096, "several pages: {file_len}");
    assert!(index.memory() < 64, "mapped: {} bytes held", index.memory());
    // Cut to its first page: the pages past it are gone from the mapping.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&sidecar)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let e = wds.read(599).unwrap_err().to_string();
    assert!(e.contains(".wickidx") && e.contains("cut short"), "{e}");
}
