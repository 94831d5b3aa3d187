//! TFRecord framing: `u64 length (LE) | u32 masked crc32c(length) | data |
//! u32 masked crc32c(data)`, checked record by record, read from a file at
//! offsets or one after another from any byte stream.

use crate::error::{shard_error, Cause};
use crate::error::{Error, Result};
use crate::formats::shards::{ShardOptions, ShardSet};
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};

/// Largest record wick reads (512 MiB): a larger length is treated as damage
/// rather than allocated.
pub(super) const MAX_RECORD: u64 = 512 << 20;

/// CRC32C as TFRecord stores it (rotated, plus a constant).
pub(crate) fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Checks a whole record (`header | data | footer`) read at `offset` and
/// returns its data.
pub(super) fn check_record<'a>(path: &Path, offset: u64, buf: &'a [u8]) -> Result<&'a [u8]> {
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
pub(super) fn scan(
    path: &Path,
    file: &mut crate::storage::BlobReader,
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
            file.read_exact_at(offset, &mut head)?;
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
pub(super) fn header_len(head: &[u8; 12]) -> Result<u64, String> {
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

/// Reads records one after another from any byte stream.
pub(super) struct RecordReader {
    inner: Box<dyn BufRead + Send>,
    path: PathBuf,
    offset: u64,
}

impl RecordReader {
    pub(super) fn new(inner: Box<dyn BufRead + Send>, path: &Path) -> Self {
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
    pub(super) fn io(&self, e: std::io::Error) -> Error {
        use std::io::ErrorKind::{InvalidData, InvalidInput, UnexpectedEof};
        match e.kind() {
            UnexpectedEof => shard_error(&self.path, self.offset, "stream ends inside a record"),
            InvalidData | InvalidInput => {
                shard_error(&self.path, self.offset, Cause::new("corrupt stream", e))
            }
            _ => Error::Io {
                path: self.path.clone(),
                source: e,
            },
        }
    }

    /// The next record's `(offset, data length)`; `None` at a clean end.
    pub(super) fn next_header(&mut self) -> Option<Result<(u64, u64)>> {
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
    pub(super) fn skip(&mut self, len: u64) -> Result<()> {
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
    pub(super) fn next_record(&mut self) -> Result<(u64, Vec<u8>)> {
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
