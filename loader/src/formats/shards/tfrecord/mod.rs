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

use super::{ShardOptions, ShardSet};
use crate::contract::{Damage, Parts, Record, RecordStream, ShardInfo, Source};
use crate::error::shard_error;
use crate::error::{Error, Result};
use crate::formats::{DatasetKind, Format};
use crate::storage::{Blob, BlobReader};
use example::parse_example;
use framing::{check_record, scan, RecordReader};
pub(crate) use index::index_path;
use index::{read_index_file, write_index_file};
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
    /// Open file for positioned reads (uncompressed shards only).
    file: Option<Blob>,
    /// `(offset, data length)` of each record (uncompressed shards; a
    /// compressed one is read in order and keeps only its count, so a
    /// stream of many tiny records costs no memory per record).
    records: Vec<(u64, u64)>,
    /// Records in the shard.
    count: usize,
}

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

    /// Opens shards (in the order given) and indexes their records.
    pub fn open_with(
        paths: impl IntoIterator<Item = impl AsRef<Path>>,
        opts: TfRecordOptions,
    ) -> Result<Self> {
        let mut set = ShardSet::default();
        let mut shards = Vec::new();
        let paths = super::owned(paths);
        // Each shard indexed on its own (at once when remote), with its own
        // damage list, merged in order below.
        let opened = super::open_each(&paths, |path| {
            let mut set = ShardSet::default();
            let compression = opts.compression.resolve(path);
            let (file, len) = Blob::open(path)?;
            let (records, count, file) = if compression == Compression::None {
                let idx = index_path(path);
                let remote = crate::storage::is_url(path);
                let has_index = if remote {
                    opts.read_index_files && Blob::open(&idx).is_ok()
                } else {
                    opts.read_index_files && idx.exists()
                };
                let records = if has_index {
                    read_index_file(&idx, (path, &file), len)?
                } else {
                    let mut reader = file.reader(path, len);
                    let records = scan(path, &mut reader, len, &opts.shard, &mut set)?;
                    if opts.write_index_files && !remote {
                        write_index_file(&idx, &records)?;
                    }
                    records
                };
                let count = records.len();
                (records, count, Some(file))
            } else {
                let mut count = 0;
                let mut reader =
                    RecordReader::new(decompress(file.reader(path, len), compression), path);
                while let Some(head) = reader.next_header() {
                    match head.and_then(|(_, len)| reader.skip(len)) {
                        Ok(()) => count += 1,
                        Err(Error::Shard { offset, reason, .. }) => {
                            set.damaged(&opts.shard, path, offset, reason)?;
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
                (Vec::new(), count, None)
            };
            let shard = Shard {
                path: path.to_path_buf(),
                compression,
                file,
                records,
                count,
            };
            Ok((shard, set.damage))
        });
        for (path, opened) in paths.iter().zip(opened) {
            let (shard, damage) = opened?;
            set.damage.extend(damage);
            set.push(path, shard.count);
            shards.push(shard);
        }
        Ok(Self { shards, set, opts })
    }
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
        let Some(file) = &shard.file else {
            return Err(Error::InvalidConfig(format!(
                "{:?} is {:?}-compressed: it has no random access; stream it with \
                 LoaderBuilder::interleave",
                shard.path, shard.compression
            )));
        };
        let (offset, len) = shard.records[number];
        let mut buf = vec![0; len as usize + 16];
        file.read_exact_at(&shard.path, offset, &mut buf)?;
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
        let (file, len) = Blob::open(&s.path)?;
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
        assert!(t.shards[0].records.is_empty(), "no per-record index");
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
