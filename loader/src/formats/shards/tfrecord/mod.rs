//! TFRecord shards of `tf.train.Example` protos, as `tf.io.TFRecordWriter`
//! writes them.
//!
//! A record is `u64 length (LE) | u32 masked crc32c(length) | data |
//! u32 masked crc32c(data)`. Both checksums are verified: the length's
//! when the offset index is built on open, the data's on every read.

mod example;
mod framing;
mod index;

pub(crate) use example::example_bytes;
pub(crate) use framing::masked_crc;

use super::manifest::{self, IndexedWith, Lazy, Listed};
use super::{ShardOptions, ShardSet};
use crate::contract::{Damage, Parts, Record, RecordStream, ShardInfo, Source};
use crate::error::shard_error;
use crate::error::{Error, Result};
use crate::formats::{DatasetKind, Format};
use crate::storage::{Blob, BlobReader};
use example::parse_example;
use framing::{check_record, scan, RecordReader};
pub(crate) use index::index_path;
pub(crate) use index::index_text;
use index::{parse_index, read_index_file, write_index_file, Offsets};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// How a TFRecord shard is compressed (`tf.io.TFRecordOptions`'
/// `compression_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Compression {
    /// By the file name: `.gz` GZIP, `.zz`/`.zlib` ZLIB, else none. Default.
    #[default]
    Auto,
    /// Not compressed.
    None,
    /// The whole shard is one GZIP stream.
    Gzip,
    /// The whole shard is one ZLIB stream.
    Zlib,
}

impl Compression {
    fn resolve(self, path: &Path) -> Compression {
        if self != Compression::Auto {
            return self;
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("gz") | Some("gzip") => Compression::Gzip,
            Some("zz") | Some("zlib") => Compression::Zlib,
            _ => Compression::None,
        }
    }
}

/// Options for [`TfRecord::open_with`].
#[derive(Debug, Clone)]
pub struct TfRecordOptions {
    /// The bytes feature holding the encoded image. Default `image/encoded`.
    pub image_key: String,
    /// The int64 feature holding the class. Default `image/class/label`.
    pub label_key: String,
    /// Compression of the shards. Default [`Compression::Auto`].
    pub compression: Compression,
    /// Use `<shard>.idx` beside an uncompressed shard when it exists (one
    /// `offset size` line per record, the format of DALI's `tfrecord2idx`)
    /// instead of scanning the shard. Default `true`.
    pub read_index_files: bool,
    /// Write `<shard>.idx` after scanning a shard that has none. Default
    /// `false`.
    pub write_index_files: bool,
    /// Damage handling on open.
    pub shard: ShardOptions,
}

impl Default for TfRecordOptions {
    fn default() -> Self {
        Self {
            image_key: "image/encoded".into(),
            label_key: "image/class/label".into(),
            compression: Compression::Auto,
            read_index_files: true,
            write_index_files: false,
            shard: ShardOptions::default(),
        }
    }
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    compression: Compression,
    /// An uncompressed shard's file and record offsets: made at open, or
    /// loaded from its manifest's listing on its first read. A compressed
    /// shard is read in order and keeps only its count, so a stream of
    /// many tiny records costs no memory per record.
    opened: Lazy<Opened>,
    /// Records in the shard.
    count: usize,
}

/// An uncompressed shard's file, open for positioned reads, and where
/// each record is.
#[derive(Debug)]
struct Opened {
    file: Blob,
    offsets: Offsets,
}

/// A shard read through at open (no manifest lists it).
pub(crate) struct Counted {
    /// The shard, open.
    pub(crate) blob: Blob,
    /// Its size.
    pub(crate) len: u64,
    /// Where each record is (uncompressed; none when compressed).
    pub(crate) offsets: Offsets,
    /// How many records it holds.
    pub(crate) count: usize,
    /// Whether it is compressed (no offsets).
    pub(crate) compressed: bool,
    /// Damage left out, with `skip_damaged`.
    pub(crate) damage: Vec<Damage>,
}

/// Reads shard `path` (compressed as `compression` says) through, checking
/// each record's framing: its records' offsets, or, compressed, their
/// count. Damage is handled as `shard` says.
pub(crate) fn count(
    path: &Path,
    compression: Compression,
    shard: &ShardOptions,
) -> Result<Counted> {
    let mut set = ShardSet::default();
    let compression = compression.resolve(path);
    let (blob, len) = Blob::open(path)?;
    let (offsets, count) = if compression == Compression::None {
        let mut reader = blob.reader(path, len);
        let records = scan(path, &mut reader, len, shard, &mut set)?;
        (Offsets::of_records(&records), records.len())
    } else {
        let mut count = 0;
        let mut reader = RecordReader::new(decompress(blob.reader(path, len), compression), path);
        while let Some(head) = reader.next_header() {
            match head.and_then(|(_, len)| reader.skip(len)) {
                Ok(()) => count += 1,
                Err(Error::Shard { offset, reason, .. }) => {
                    set.damaged(shard, path, offset, reason)?;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        (Offsets::Owned(Vec::new()), count)
    };
    Ok(Counted {
        blob,
        len,
        offsets,
        count,
        compressed: compression != Compression::None,
        damage: set.damage,
    })
}

/// The manifest's name for the format.
pub(crate) const MANIFEST_FORMAT: &str = "tfrecord";

/// A dataset of TFRecord shards holding `tf.train.Example`s, read at random
/// through an offset index built when it is opened.
///
/// Compressed (GZIP/ZLIB) shards have no random access: they are counted on
/// open and read in the streaming mode ([`crate::LoaderBuilder::interleave`]).
///
/// ```no_run
/// use candle_wick::source::TfRecord;
/// use candle_wick::Loader;
/// # fn main() -> candle_wick::Result<()> {
/// let train = TfRecord::open(["train-00000-of-00002", "train-00001-of-00002"])?;
/// let loader = Loader::builder(train).batch_size(64).train_transforms().build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TfRecord {
    shards: Vec<Shard>,
    set: ShardSet,
    opts: TfRecordOptions,
}

impl TfRecord {
    /// Opens shards with the default options.
    pub fn open(paths: impl IntoIterator<Item = impl AsRef<Path>>) -> Result<Self> {
        Self::open_with(paths, TfRecordOptions::default())
    }

    /// Opens shards (in the order given) and indexes their records. A
    /// shard that a manifest in its folder lists (made by `wick index` or
    /// `wick convert`) is not read until a record of it is (then its
    /// `.idx`, as the manifest lists it); the others are read now, from
    /// their `.idx` when there is one (an uncompressed shard), else
    /// through (each local shard on a core of its own, 16 remote ones at
    /// once). `read_index_files: false` reads every shard through.
    pub fn open_with(
        paths: impl IntoIterator<Item = impl AsRef<Path>>,
        opts: TfRecordOptions,
    ) -> Result<Self> {
        let paths = super::owned(paths);
        let listed = match opts.read_index_files {
            true => manifest::lookup(&paths, MANIFEST_FORMAT, &IndexedWith::default())?,
            false => vec![None; paths.len()],
        };
        let unlisted = manifest::unlisted(&paths, &listed);
        // Each shard indexed on its own (at once when remote), with its own
        // damage list, merged in order below.
        let mut opened = super::open_each(&unlisted, |path| open_unlisted(path, &opts)).into_iter();
        let mut set = ShardSet::default();
        let mut shards = Vec::with_capacity(paths.len());
        for (path, listed) in paths.into_iter().zip(listed) {
            let compression = opts.compression.resolve(&path);
            let mut loaded = None;
            let count = match &listed {
                Some((_, l)) => set.push_listed(&opts.shard, &path, l)?,
                None => {
                    let c = opened.next().expect("one open a shard no manifest lists")?;
                    set.damage.extend(c.damage);
                    set.push(&path, c.count);
                    if !c.compressed {
                        loaded = Some(Opened {
                            file: c.blob,
                            offsets: c.offsets,
                        });
                    }
                    c.count
                }
            };
            shards.push(Shard {
                path,
                compression,
                opened: Lazy::new(loaded, listed),
                count,
            });
        }
        Ok(Self { shards, set, opts })
    }

    /// Shard `s`'s file and record offsets (uncompressed shards), loaded
    /// from its manifest's listing on its first read.
    fn opened(&self, s: usize) -> Result<&Opened> {
        let shard = &self.shards[s];
        shard
            .opened
            .load(|manifest, listed| load_listed(&shard.path, manifest, listed))
    }
}

/// Shard `path`, which no manifest lists, opened: an uncompressed one
/// from its `.idx` when there is one (and `opts` reads them), else read
/// through (and its `.idx` written, when `opts` says so).
fn open_unlisted(path: &Path, opts: &TfRecordOptions) -> Result<Counted> {
    let compression = opts.compression.resolve(path);
    if compression == Compression::None && opts.read_index_files {
        let idx = index_path(path);
        // One GET of a remote `.idx`, which may not be there.
        if let Some(bytes) = crate::storage::read_if_exists(&idx, 1 << 30)? {
            let (blob, len) = Blob::open(path)?;
            let offsets = read_index_file((&idx, &bytes), (path, &blob), len)?;
            return Ok(Counted {
                count: offsets.len(),
                blob,
                len,
                offsets,
                compressed: false,
                damage: Vec::new(),
            });
        }
    }
    let c = count(path, compression, &opts.shard)?;
    if !c.compressed && opts.write_index_files && !crate::storage::is_url(path) {
        write_index_file(&index_path(path), &c.offsets)?;
    }
    Ok(c)
}

/// Shard `path`'s file and record offsets from what `manifest` lists of
/// it: the shard must have the size (and version) it had when it was
/// indexed, and its `.idx` the size and checksum the manifest gives
/// ([`manifest::open_listed`], [`manifest::map_sidecar`]; the `.idx` of a
/// remote shard is fetched once a node with a cache directory).
///
/// With a cache directory, one process of the node turns the `.idx` into
/// the offsets' binary form there (8 bytes a record, named by the `.idx`'s
/// path, size and checksum) and every process maps it: the node holds one
/// copy, in the page cache, and a process that finds it made reads no
/// `.idx`. Without one, each process parses the `.idx` into its memory.
fn load_listed(path: &Path, manifest: &Path, listed: &Listed) -> Result<Opened> {
    use crate::storage::NodeFile;
    let (file, len) = manifest::open_listed(path, manifest, listed)?;
    if listed.records == 0 {
        return Ok(Opened {
            file,
            offsets: Offsets::Owned(Vec::new()),
        });
    }
    let idx = index_path(path);
    // The records end where damage left out begins, else at the end.
    let ends = listed.damage.iter().map(|d| d.0).min().unwrap_or(len);
    let key = format!(
        "tfrecord offsets {} {} {}",
        idx.display(),
        listed.index_bytes,
        listed.index_crc
    );
    let lock = match crate::storage::node_file(&key, true)? {
        NodeFile::Ready(copy) => match Offsets::mapped(copy, listed.records, ends) {
            Some(offsets) => return Ok(Opened { file, offsets }),
            None => None,
        },
        NodeFile::Mine(lock) => Some(lock),
        NodeFile::Busy | NodeFile::Alone => None,
    };
    let backing = manifest::map_sidecar(&idx, manifest, listed, crc32c::crc32c)?;
    let offsets = parse_index(&idx, backing.bytes(), ends)?;
    if offsets.len() as u64 != listed.records {
        let what = format!(
            "the index holds {} records, not the {} the manifest lists",
            offsets.len(),
            listed.records
        );
        return Err(manifest::changed(&idx, manifest, &what));
    }
    if let Some(lock) = lock {
        crate::storage::node_publish(&key, &offsets.to_bytes())?;
        drop(lock);
        // This process maps the node's copy too, rather than keep its own.
        if let Ok(NodeFile::Ready(copy)) = crate::storage::node_file(&key, false) {
            if let Some(offsets) = Offsets::mapped(copy, listed.records, ends) {
                return Ok(Opened { file, offsets });
            }
        }
    }
    Ok(Opened { file, offsets })
}

/// TFRecord shards in the format table: uncompressed, gzip or zlib, each
/// with the index `wick convert` writes beside it.
pub(crate) const FORMAT: Format = Format {
    companions: &[".idx"],
    ..Format::shards(
        DatasetKind::TfRecord,
        "TFRecord shards",
        &[".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecord.zz"],
        |paths| Ok(Box::new(TfRecord::open(paths)?)),
    )
};

impl Source for TfRecord {
    fn len(&self) -> usize {
        self.set.len()
    }

    fn read(&self, index: usize) -> Result<Record> {
        self.read_parts(index, &Parts::Default, Vec::new())
    }

    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        drop(bytes);
        let (s, number) = self.set.locate(index)?;
        let shard = &self.shards[s];
        if shard.compression != Compression::None {
            return Err(Error::InvalidConfig(format!(
                "{:?} is {:?}-compressed: it has no random access; stream it with \
                 LoaderBuilder::interleave",
                shard.path, shard.compression
            )));
        }
        let opened = self.opened(s)?;
        let (offset, len) = opened.offsets.get(number);
        let mut buf = vec![0; len as usize + 16];
        opened.file.read_exact_at(&shard.path, offset, &mut buf)?;
        let data = check_record(&shard.path, offset, &buf)?;
        let at = (shard.path.as_path(), offset);
        example_record(&self.opts, self.set.key(index), data, parts, at)
    }

    fn key(&self, index: usize) -> String {
        self.set.key(index)
    }

    fn shards(&self) -> &[ShardInfo] {
        &self.set.infos
    }

    /// A compressed shard's records in order, each with the named `parts`
    /// as [`read_parts`](Source::read_parts) gives an uncompressed one's.
    fn stream_shard(&self, shard: usize, parts: &Parts) -> Result<Option<RecordStream>> {
        let s = &self.shards[shard];
        if s.compression == Compression::None {
            return Ok(None);
        }
        // A listed shard is read as the manifest lists it (a rewritten
        // one is refused).
        let (file, len) = match s.opened.listed() {
            Some((manifest, listed)) => manifest::open_listed(&s.path, manifest, listed)?,
            None => Blob::open(&s.path)?,
        };
        let mut reader = RecordReader::new(
            decompress(file.reader(&s.path, len), s.compression),
            &s.path,
        );
        let (path, opts, parts) = (s.path.clone(), self.opts.clone(), parts.clone());
        let stream = (0..s.count).map(move |number| {
            let (offset, data) = reader.next_record()?;
            let key = format!("{}#{number}", path.display());
            example_record(&opts, key, &data, &parts, (&path, offset))
        });
        Ok(Some(Box::new(stream)))
    }

    fn damage(&self) -> &[Damage] {
        &self.set.damage
    }
}

/// Record `key`: the `tf.train.Example` in `data` (at `offset` of `path`,
/// for errors), its image and class from the features `opts` names, and
/// the named `parts`.
fn example_record(
    opts: &TfRecordOptions,
    key: String,
    data: &[u8],
    parts: &Parts,
    (path, offset): (&Path, u64),
) -> Result<Record> {
    let (image, label, named) = parse_example(data, &opts.image_key, &opts.label_key, parts)
        .map_err(|reason| shard_error(path, offset, reason))?;
    let mut record = Record::encoded(key, image, label);
    record.parts = named;
    Ok(record)
}

fn decompress(file: BlobReader, c: Compression) -> Box<dyn BufRead + Send> {
    let file = BufReader::with_capacity(1 << 16, file);
    match c {
        Compression::Gzip => Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file))),
        Compression::Zlib => Box::new(BufReader::new(flate2::bufread::ZlibDecoder::new(file))),
        _ => Box::new(file),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // TensorFlow's crc32c_test: Mask(Value("foo")) and the raw value.
        assert_eq!(crc32c::crc32c(b"foo"), 0xcfc4_ae1d);
        let m = masked_crc(b"foo");
        let unmasked = m.wrapping_sub(0xa282_ead8).rotate_left(15);
        assert_eq!(unmasked, 0xcfc4_ae1d);
    }

    #[test]
    fn example_round_trips() {
        let bytes = example_bytes(b"\xff\xd8jpeg", 7, "image/encoded", "image/class/label");
        let (img, label, _) = parse_example(
            &bytes,
            "image/encoded",
            "image/class/label",
            &Parts::Default,
        )
        .unwrap();
        assert_eq!((img.as_slice(), label), (&b"\xff\xd8jpeg"[..], 7));
        let err = parse_example(&bytes, "image/encoded", "label", &Parts::Default).unwrap_err();
        assert!(err.reason.contains("no feature \"label\""), "{err:?}");
        let neg = example_bytes(b"x", -1, "i", "l");
        let err = parse_example(&neg, "i", "l", &Parts::Default).unwrap_err();
        assert!(err.reason.contains("-1"), "{err:?}");
        let err = parse_example(b"\xff\xff", "i", "l", &Parts::Default).unwrap_err();
        assert!(err.source.is_some(), "the proto error is kept: {err:?}");
    }

    /// Gives `ok` good reads of zeros, then fails with `kind`.
    struct Failing {
        ok: usize,
        kind: std::io::ErrorKind,
    }

    impl std::io::Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.ok == 0 {
                return Err(std::io::Error::new(self.kind, "injected"));
            }
            self.ok -= 1;
            let n = buf.len().min(4);
            buf[..n].fill(0);
            Ok(n)
        }
    }

    #[test]
    fn an_io_error_while_streaming_is_not_damage() {
        let reader = |kind| {
            RecordReader::new(
                Box::new(std::io::BufReader::with_capacity(
                    4,
                    Failing { ok: 2, kind },
                )),
                Path::new("s.tfrecord.gz"),
            )
        };
        // A failing disk or network: an I/O error, which skip_damaged must
        // not turn into a shorter shard (ranks would disagree on lengths).
        let e = reader(std::io::ErrorKind::Other)
            .next_header()
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        // A corrupt or truncated stream is damage.
        for kind in [
            std::io::ErrorKind::InvalidInput,
            std::io::ErrorKind::InvalidData,
        ] {
            let e = reader(kind).next_header().unwrap().unwrap_err();
            assert!(matches!(e, Error::Shard { .. }), "{e}");
        }
    }

    /// `wick index` over a folder of TFRecord shards, one of them
    /// compressed: the manifest lists both (the compressed one by its
    /// count, with no `.idx`), and opening reads neither (a shard cut
    /// short after indexing still opens, at its listed count); records
    /// and the compressed shard's stream are the shards' own, and the cut
    /// shard is an error naming it and `wick index` when first read.
    #[test]
    fn a_manifest_lists_plain_and_compressed_shards() {
        let dir = tempfile::tempdir().unwrap();
        let ex = |i: usize| {
            example_bytes(
                &[i as u8; 40],
                i as i64,
                "image/encoded",
                "image/class/label",
            )
        };
        let mut w = crate::write::TfRecordWriter::create(dir.path().join("a.tfrecord")).unwrap();
        (0..5).for_each(|i| w.write_record(&ex(i)).unwrap());
        w.into_inner().unwrap();
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut w = crate::write::TfRecordWriter::new(gz);
        (5..12).for_each(|i| w.write_record(&ex(i)).unwrap());
        let gz = w.into_inner().unwrap().finish().unwrap();
        std::fs::write(dir.path().join("b.tfrecord.gz"), gz).unwrap();
        let done = crate::write::index(dir.path(), &Default::default()).unwrap();
        assert_eq!((done.shards, done.records), (2, 12));
        assert!(dir.path().join("a.tfrecord.idx").exists());
        assert!(!dir.path().join("b.tfrecord.gz.idx").exists());

        let paths = [
            dir.path().join("a.tfrecord"),
            dir.path().join("b.tfrecord.gz"),
        ];
        let t = TfRecord::open(&paths).unwrap();
        assert_eq!(t.len(), 12);
        assert!(
            t.shards.iter().all(|s| s.opened.get().is_none()),
            "nothing read at open"
        );
        assert_eq!(t.read(3).unwrap().label, 3);
        let streamed: Vec<u32> = t
            .stream_shard(1, &Parts::Default)
            .unwrap()
            .unwrap()
            .map(|r| r.unwrap().label)
            .collect();
        assert_eq!(streamed, (5..12).collect::<Vec<u32>>());

        // Cut short after indexing: opens at the listed count, refused on
        // its first read.
        let a = std::fs::read(&paths[0]).unwrap();
        std::fs::write(&paths[0], &a[..a.len() - 10]).unwrap();
        let t = TfRecord::open(&paths).unwrap();
        assert_eq!(t.len(), 12);
        let e = crate::error::error_chain(&t.read(0).unwrap_err());
        assert!(e.contains("a.tfrecord") && e.contains("wick index"), "{e}");
        // Without the manifest's help (read_index_files: false), the cut
        // shard is read through: damage, an error naming it.
        let opts = TfRecordOptions {
            read_index_files: false,
            ..Default::default()
        };
        let e = TfRecord::open_with(&paths, opts).unwrap_err().to_string();
        assert!(e.contains("a.tfrecord"), "{e}");
    }

    /// A shard indexed with its damage left out (`--skip-damaged`) opens
    /// from the manifest to the records before the damage, whose `.idx`
    /// ends there, and reads them.
    #[test]
    fn a_damaged_shard_opens_from_its_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tfrecord");
        let mut w = crate::write::TfRecordWriter::create(&path).unwrap();
        (0..5u8).for_each(|i| w.write_record(&[i; 30]).unwrap());
        w.into_inner().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend([7; 9]);
        std::fs::write(&path, bytes).unwrap();
        let skip = ShardOptions { skip_damaged: true };
        let opts = crate::source::WebDatasetOptions {
            shard: skip.clone(),
            ..Default::default()
        };
        assert_eq!(crate::write::index(dir.path(), &opts).unwrap().records, 5);
        let opts = TfRecordOptions {
            shard: skip,
            ..Default::default()
        };
        let t = TfRecord::open_with([&path], opts).unwrap();
        assert_eq!((t.len(), t.damage().len()), (5, 1));
        assert!(
            t.shards[0].opened.get().is_none(),
            "opened from the manifest"
        );
        let r = t.read_parts(4, &Parts::Default, Vec::new());
        let e = crate::error::error_chain(&r.unwrap_err());
        // The records are not Examples: a parse error, not the index's.
        assert!(!e.contains("idx"), "{e}");
        assert_eq!(t.shards[0].opened.get().unwrap().offsets.len(), 5);
    }

    /// A gzip shard of many empty records (a few KB on disk, 3.2 MB
    /// decompressed) opens to its count, holding nothing per record, and
    /// streams all of them; a record cut short is damage.
    #[test]
    fn a_compressed_shard_keeps_a_count_not_an_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.tfrecord.gz");
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let mut w = crate::write::TfRecordWriter::new(gz);
        for _ in 0..200_000 {
            w.write_record(&[]).unwrap();
        }
        let bytes = w.into_inner().unwrap().finish().unwrap();
        assert!(bytes.len() < 64 << 10, "{} bytes", bytes.len());
        std::fs::write(&path, &bytes).unwrap();
        let t = TfRecord::open([&path]).unwrap();
        assert_eq!((t.len(), t.shards[0].count), (200_000, 200_000));
        assert!(t.shards[0].opened.get().is_none(), "no per-record index");
        // Every record is there to stream (each fails to parse: empty).
        let n = t.stream_shard(0, &Parts::Default).unwrap().unwrap().count();
        assert_eq!(n, 200_000);

        // A record whose header claims more than the stream holds: damage
        // ("ends inside a record"), read without allocating the claim.
        let mut claim = Vec::new();
        let len = (400u64 << 20).to_le_bytes();
        claim.extend(len);
        claim.extend(masked_crc(&len).to_le_bytes());
        claim.extend([0; 100]);
        let mut r = RecordReader::new(
            Box::new(std::io::Cursor::new(claim)),
            Path::new("cut.tfrecord.gz"),
        );
        let e = r.next_record().unwrap_err();
        assert!(matches!(e, Error::Shard { .. }), "{e}");
        assert!(e.to_string().contains("ends inside a record"), "{e}");
    }
}
