//! TFRecord shards of `tf.train.Example` protos, as `tf.io.TFRecordWriter`
//! writes them.
//!
//! A record is `u64 length (LE) | u32 masked crc32c(length) | data |
//! u32 masked crc32c(data)`. Both checksums are verified: the length's
//! when the offset index is built on open, the data's on every read.

use super::shards::{open_shard, shard_error, ShardOptions, ShardSet};
use super::{read_exact_at, Damage, Record, RecordStream, ShardInfo, Source};
use crate::error::{Error, Result};
use prost::Message;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

/// Largest record wick reads (512 MiB): a larger length is treated as damage
/// rather than allocated.
const MAX_RECORD: u64 = 512 << 20;

/// CRC32C as TFRecord stores it (rotated, plus a constant).
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The `tf.train.Example` proto, the subset wick reads and writes.
#[derive(Clone, PartialEq, prost::Message)]
struct Example {
    #[prost(message, optional, tag = "1")]
    features: Option<Features>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Features {
    #[prost(map = "string, message", tag = "1")]
    feature: HashMap<String, Feature>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Feature {
    #[prost(oneof = "Kind", tags = "1, 2, 3")]
    kind: Option<Kind>,
}

// The variant names are the proto's field names.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(message, tag = "1")]
    BytesList(BytesList),
    #[prost(message, tag = "2")]
    FloatList(FloatList),
    #[prost(message, tag = "3")]
    Int64List(Int64List),
}

#[derive(Clone, PartialEq, prost::Message)]
struct BytesList {
    #[prost(bytes = "vec", repeated, tag = "1")]
    value: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FloatList {
    #[prost(float, repeated, tag = "1")]
    value: Vec<f32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Int64List {
    #[prost(int64, repeated, tag = "1")]
    value: Vec<i64>,
}

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
    file: Option<File>,
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
/// use candle_wick::{Loader, TfRecord};
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
        for path in paths {
            let path = path.as_ref();
            let compression = opts.compression.resolve(path);
            let (file, len) = open_shard(path)?;
            let (records, count, file) = if compression == Compression::None {
                let idx = index_path(path);
                let records = if opts.read_index_files && idx.exists() {
                    read_index_file(&idx, path, &file, len)?
                } else {
                    let records = scan(path, &file, len, &opts.shard, &mut set)?;
                    if opts.write_index_files {
                        write_index_file(&idx, &records)?;
                    }
                    records
                };
                let count = records.len();
                (records, count, Some(file))
            } else {
                let mut count = 0;
                let mut reader = RecordReader::new(decompress(file, compression), path);
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
            set.push(path, count);
            shards.push(Shard {
                path: path.to_path_buf(),
                compression,
                file,
                records,
                count,
            });
        }
        Ok(Self { shards, set, opts })
    }
}

/// The image bytes and label of a serialized `tf.train.Example`.
fn parse_example(data: &[u8], image_key: &str, label_key: &str) -> Result<(Vec<u8>, u32), String> {
    let mut ex = Example::decode(data).map_err(|e| format!("not a tf.train.Example: {e}"))?;
    let mut features = ex.features.take().map(|f| f.feature).unwrap_or_default();
    let image = match features.remove(image_key).and_then(|f| f.kind) {
        Some(Kind::BytesList(mut b)) if b.value.len() == 1 => b.value.remove(0),
        Some(Kind::BytesList(b)) => {
            return Err(format!(
                "feature {image_key:?} holds {} byte strings, not 1",
                b.value.len()
            ))
        }
        Some(_) => return Err(format!("feature {image_key:?} is not a bytes_list")),
        None => return Err(format!("no feature {image_key:?}")),
    };
    let label = match features.get(label_key).and_then(|f| f.kind.as_ref()) {
        Some(Kind::Int64List(l)) if l.value.len() == 1 => u32::try_from(l.value[0])
            .map_err(|_| format!("label {} is not a class index", l.value[0]))?,
        Some(Kind::Int64List(l)) => {
            return Err(format!(
                "feature {label_key:?} holds {} values, not 1",
                l.value.len()
            ))
        }
        Some(_) => return Err(format!("feature {label_key:?} is not an int64_list")),
        None => return Err(format!("no feature {label_key:?}")),
    };
    Ok((image, label))
}

/// Serializes a `tf.train.Example` with an image and a label, under the
/// given feature keys.
pub(crate) fn example_bytes(image: &[u8], label: i64, image_key: &str, label_key: &str) -> Vec<u8> {
    let mut feature = HashMap::new();
    feature.insert(
        image_key.to_string(),
        Feature {
            kind: Some(Kind::BytesList(BytesList {
                value: vec![image.to_vec()],
            })),
        },
    );
    feature.insert(
        label_key.to_string(),
        Feature {
            kind: Some(Kind::Int64List(Int64List { value: vec![label] })),
        },
    );
    Example {
        features: Some(Features { feature }),
    }
    .encode_to_vec()
}

impl Source for TfRecord {
    fn len(&self) -> usize {
        self.set.len()
    }

    fn read(&self, index: usize) -> Result<Record> {
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
        read_exact_at(file, &shard.path, offset, &mut buf)?;
        let data = check_record(&shard.path, offset, &buf)?;
        let (image, label) = parse_example(data, &self.opts.image_key, &self.opts.label_key)
            .map_err(|reason| shard_error(&shard.path, offset, reason))?;
        Ok(Record::encoded(self.set.key(index), image, label))
    }

    fn key(&self, index: usize) -> String {
        self.set.key(index)
    }

    fn shards(&self) -> &[ShardInfo] {
        &self.set.infos
    }

    fn stream_shard(&self, shard: usize) -> Result<Option<RecordStream>> {
        let s = &self.shards[shard];
        if s.compression == Compression::None {
            return Ok(None);
        }
        let (file, _) = open_shard(&s.path)?;
        let mut reader = RecordReader::new(decompress(file, s.compression), &s.path);
        let (path, image_key, label_key) = (
            s.path.clone(),
            self.opts.image_key.clone(),
            self.opts.label_key.clone(),
        );
        let stream = (0..s.count).map(move |number| {
            let (offset, data) = reader.next_record()?;
            let (image, label) = parse_example(&data, &image_key, &label_key)
                .map_err(|reason| shard_error(&path, offset, reason))?;
            Ok(Record::encoded(
                format!("{}#{number}", path.display()),
                image,
                label,
            ))
        });
        Ok(Some(Box::new(stream)))
    }

    fn damage(&self) -> &[Damage] {
        &self.set.damage
    }
}

fn decompress(file: File, c: Compression) -> Box<dyn BufRead + Send> {
    let file = BufReader::with_capacity(1 << 16, file);
    match c {
        Compression::Gzip => Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file))),
        Compression::Zlib => Box::new(BufReader::new(flate2::bufread::ZlibDecoder::new(file))),
        _ => Box::new(file),
    }
}

/// Checks a whole record (`header | data | footer`) read at `offset` and
/// returns its data.
fn check_record<'a>(path: &Path, offset: u64, buf: &'a [u8]) -> Result<&'a [u8]> {
    let len = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    if masked_crc(&buf[..8]) != crc {
        return Err(shard_error(path, offset, "record length checksum mismatch"));
    }
    if len + 16 != buf.len() as u64 {
        return Err(shard_error(
            path,
            offset,
            format!("record length {len} disagrees with the index"),
        ));
    }
    let data = &buf[12..12 + len as usize];
    let crc = u32::from_le_bytes(buf[12 + len as usize..].try_into().expect("4 bytes"));
    if masked_crc(data) != crc {
        return Err(shard_error(path, offset, "record data checksum mismatch"));
    }
    Ok(data)
}

/// Reads the record headers of an uncompressed shard (seeking over the
/// data) and returns each record's offset and data length.
fn scan(
    path: &Path,
    file: &File,
    file_len: u64,
    opts: &ShardOptions,
    set: &mut ShardSet,
) -> Result<Vec<(u64, u64)>> {
    let mut records = Vec::new();
    let mut offset = 0;
    let mut head = [0u8; 12];
    while offset < file_len {
        let fail = if file_len - offset < 12 {
            Some(format!(
                "file ends inside a record header ({} bytes left)",
                file_len - offset
            ))
        } else {
            read_exact_at(file, path, offset, &mut head)?;
            match header_len(&head) {
                Err(reason) => Some(reason),
                Ok(len) if offset + 16 + len > file_len => Some(format!(
                    "record of {len} bytes runs past the end of the file ({} bytes left)",
                    file_len - offset - 12
                )),
                Ok(len) => {
                    records.push((offset, len));
                    offset += 16 + len;
                    None
                }
            }
        };
        if let Some(reason) = fail {
            set.damaged(opts, path, offset, reason)?;
            break;
        }
    }
    Ok(records)
}

/// The data length in a record header, checked.
fn header_len(head: &[u8; 12]) -> Result<u64, String> {
    let len = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
    if masked_crc(&head[..8]) != crc {
        return Err("record length checksum mismatch".into());
    }
    if len > MAX_RECORD {
        return Err(format!(
            "record length {len} is over the {MAX_RECORD}-byte limit"
        ));
    }
    Ok(len)
}

/// `<shard>.idx`.
fn index_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".idx");
    PathBuf::from(p)
}

/// Reads a DALI-style index (`offset size` per line, size including the
/// 16 bytes of framing) and checks it against the shard before anything
/// trusts it: the entries tile the shard exactly (no wrap-around), none is
/// over the record-size limit, and each agrees with the record header at
/// its offset (length and length checksum). A stale or lying index is an
/// error naming it.
fn read_index_file(
    idx: &Path,
    shard: &Path,
    file: &File,
    file_len: u64,
) -> Result<Vec<(u64, u64)>> {
    let text = std::fs::read_to_string(idx).map_err(|source| Error::Io {
        path: idx.to_path_buf(),
        source,
    })?;
    let bad = |line: usize, reason: String| {
        Error::Dataset {
        path: idx.to_path_buf(),
        reason: format!(
            "line {}: {reason}; delete the index (or set read_index_files: false) to scan the shard",
            line + 1
        ),
    }
    };
    let mut records = Vec::new();
    let mut next = 0u64;
    let mut head = [0u8; 12];
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let mut it = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(offset)), Some(Ok(size)), None) = (it.next(), it.next(), it.next()) else {
            return Err(bad(i, "expected `offset size`".into()));
        };
        if offset != next || size < 16 {
            return Err(bad(
                i,
                "records do not follow each other: the index is stale".into(),
            ));
        }
        let len = size - 16;
        if len > MAX_RECORD {
            return Err(bad(
                i,
                format!("a record of {len} bytes is over the {MAX_RECORD}-byte limit"),
            ));
        }
        next = match offset.checked_add(size) {
            Some(end) if end <= file_len => end,
            _ => {
                return Err(bad(
                    i,
                    format!(
                        "a record of {size} bytes at offset {offset} runs past the end of the \
                         {file_len}-byte shard: the index is stale"
                    ),
                ))
            }
        };
        read_exact_at(file, shard, offset, &mut head)?;
        match header_len(&head) {
            Ok(actual) if actual == len => {}
            Ok(actual) => {
                return Err(bad(
                    i,
                    format!(
                        "the record at offset {offset} holds {actual} bytes, the index says {len}: \
                         the index is stale"
                    ),
                ))
            }
            Err(reason) => {
                return Err(bad(
                    i,
                    format!("no record header at offset {offset} ({reason}): the index is stale"),
                ))
            }
        }
        records.push((offset, len));
    }
    if next != file_len {
        return Err(Error::Dataset {
            path: idx.to_path_buf(),
            reason: format!(
                "index covers {next} bytes but the shard has {file_len}: the index is stale"
            ),
        });
    }
    Ok(records)
}

fn write_index_file(idx: &Path, records: &[(u64, u64)]) -> Result<()> {
    let mut text = String::with_capacity(records.len() * 16);
    for (offset, len) in records {
        text.push_str(&format!("{offset} {}\n", len + 16));
    }
    std::fs::write(idx, text).map_err(|source| Error::Io {
        path: idx.to_path_buf(),
        source,
    })
}

/// Reads records one after another from any byte stream.
struct RecordReader {
    inner: Box<dyn BufRead + Send>,
    path: PathBuf,
    offset: u64,
}

impl RecordReader {
    fn new(inner: Box<dyn BufRead + Send>, path: &Path) -> Self {
        Self {
            inner,
            path: path.to_path_buf(),
            offset: 0,
        }
    }

    /// A read error: damage when the stream itself is bad (truncated, or a
    /// corrupt compressed stream, which flate2 reports as invalid input or
    /// data), else an I/O error: a failing disk must not pass for damage,
    /// which `skip_damaged` would turn into a shorter shard on this rank.
    fn io(&self, e: std::io::Error) -> Error {
        use std::io::ErrorKind::{InvalidData, InvalidInput, UnexpectedEof};
        match e.kind() {
            UnexpectedEof => shard_error(&self.path, self.offset, "stream ends inside a record"),
            InvalidData | InvalidInput => {
                shard_error(&self.path, self.offset, format!("corrupt stream: {e}"))
            }
            _ => Error::Io {
                path: self.path.clone(),
                source: e,
            },
        }
    }

    /// The next record's `(offset, data length)`; `None` at a clean end.
    fn next_header(&mut self) -> Option<Result<(u64, u64)>> {
        let mut head = [0u8; 12];
        let mut got = 0;
        while got < 12 {
            match self.inner.read(&mut head[got..]) {
                Ok(0) if got == 0 => return None,
                Ok(0) => {
                    return Some(Err(shard_error(
                        &self.path,
                        self.offset,
                        "stream ends inside a record header",
                    )))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(self.io(e))),
            }
        }
        Some(match header_len(&head) {
            Ok(len) => Ok((self.offset, len)),
            Err(reason) => Err(shard_error(&self.path, self.offset, reason)),
        })
    }

    /// Skips the data and footer of the record whose header was just read.
    fn skip(&mut self, len: u64) -> Result<()> {
        let n = std::io::copy(&mut (&mut self.inner).take(len + 4), &mut std::io::sink())
            .map_err(|e| self.io(e))?;
        if n != len + 4 {
            return Err(shard_error(
                &self.path,
                self.offset,
                "stream ends inside a record",
            ));
        }
        self.offset += 16 + len;
        Ok(())
    }

    /// The next whole record, checked: `(offset, data)`.
    fn next_record(&mut self) -> Result<(u64, Vec<u8>)> {
        let (offset, len) = self.next_header().unwrap_or_else(|| {
            Err(shard_error(
                &self.path,
                self.offset,
                "stream ends before the record the scan found",
            ))
        })?;
        // Grown as the bytes arrive, not allocated from the header's claim.
        let mut rest = Vec::new();
        let want = len + 4;
        let got = (&mut self.inner)
            .take(want)
            .read_to_end(&mut rest)
            .map_err(|e| self.io(e))?;
        if (got as u64) < want {
            return Err(self.io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        self.offset += 16 + len;
        let (data, foot) = rest.split_at(len as usize);
        if masked_crc(data) != u32::from_le_bytes(foot.try_into().expect("4 bytes")) {
            return Err(shard_error(
                &self.path,
                offset,
                "record data checksum mismatch",
            ));
        }
        rest.truncate(len as usize);
        Ok((offset, rest))
    }
}

/// Writes TFRecord files: each record framed with its length and both
/// masked CRC32C checksums, readable by `tf.data.TFRecordDataset`.
#[derive(Debug)]
pub struct TfRecordWriter<W: Write> {
    out: W,
    image_key: String,
    label_key: String,
}

impl TfRecordWriter<std::io::BufWriter<File>> {
    /// Creates the file `path` (uncompressed).
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::new(std::io::BufWriter::new(file)))
    }
}

impl<W: Write> TfRecordWriter<W> {
    /// Writes records to `out`, with the default feature keys.
    pub fn new(out: W) -> Self {
        let d = TfRecordOptions::default();
        Self {
            out,
            image_key: d.image_key,
            label_key: d.label_key,
        }
    }

    /// Writes one raw record.
    pub fn write_record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes())?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc(data).to_le_bytes())
    }

    /// Writes a `tf.train.Example` with `image/encoded` and
    /// `image/class/label`.
    pub fn write_example(&mut self, image: &[u8], label: u32) -> std::io::Result<()> {
        let ex = example_bytes(image, label.into(), &self.image_key, &self.label_key);
        self.write_record(&ex)
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
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
        let (img, label) = parse_example(&bytes, "image/encoded", "image/class/label").unwrap();
        assert_eq!((img.as_slice(), label), (&b"\xff\xd8jpeg"[..], 7));
        let err = parse_example(&bytes, "image/encoded", "label").unwrap_err();
        assert!(err.contains("no feature \"label\""), "{err}");
        let neg = example_bytes(b"x", -1, "i", "l");
        assert!(parse_example(&neg, "i", "l").unwrap_err().contains("-1"));
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
        let mut w = TfRecordWriter::new(gz);
        for _ in 0..200_000 {
            w.write_record(&[]).unwrap();
        }
        let bytes = w.finish().unwrap().finish().unwrap();
        assert!(bytes.len() < 64 << 10, "{} bytes", bytes.len());
        std::fs::write(&path, &bytes).unwrap();
        let t = TfRecord::open([&path]).unwrap();
        assert_eq!((t.len(), t.shards[0].count), (200_000, 200_000));
        assert!(t.shards[0].records.is_empty(), "no per-record index");
        // Every record is there to stream (each fails to parse: empty).
        let n = t.stream_shard(0).unwrap().unwrap().count();
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
