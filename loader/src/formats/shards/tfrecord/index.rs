//! Offset indexes of uncompressed shards (`<shard>.idx`, DALI's format):
//! read and checked against the shard before use, written after a scan.

use super::framing::{header_len, MAX_RECORD};
use crate::error::{Error, Result};
use crate::storage::Blob;
use std::path::{Path, PathBuf};

/// `<shard>.idx`.
pub(crate) fn index_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".idx");
    PathBuf::from(p)
}

/// A DALI-style index (`bytes` of the file `idx`: `offset size` per line,
/// size including the 16 bytes of framing), its shape checked before anything trusts it
/// ([`parse_index`]), and that the first and last entries agree with the
/// record header at their offsets (length and length checksum). The other
/// records' headers are not read here (that read every byte of a remote
/// shard, 1 to 8 MiB windows over the whole object): each record's
/// framing and checksums are checked when it is read, so a stale index
/// that still tiles the shard fails there, naming the shard and offset. A
/// stale or lying index is an error naming it.
pub(super) fn read_index_file(
    (idx, bytes): (&Path, &[u8]),
    (shard, file): (&Path, &Blob),
    file_len: u64,
) -> Result<Offsets> {
    let records = parse_index(idx, bytes, file_len)?;
    let bad = |line: usize, reason: String| bad_line(idx, line, reason);
    let ends = [0, records.len().saturating_sub(1)];
    for i in ends.into_iter().take(records.len().min(2)) {
        let (offset, len) = records.get(i);
        let mut head = [0u8; 12];
        file.read_exact_at(shard, offset, &mut head)?;
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
    }
    Ok(records)
}

/// Where the records of an uncompressed shard are: each record's offset
/// and, last, the end of the last record, 8 bytes a record. Record `i`
/// spans the bytes from bound `i` to bound `i + 1` (its data 16 bytes
/// fewer: the framing). Held by this process, or mapped from the node's
/// copy in the cache directory, which the node's processes share.
#[derive(Debug)]
pub(crate) enum Offsets {
    /// In this process's memory.
    Owned(Vec<u64>),
    /// The node's copy: the bounds as little-endian `u64`s, its length
    /// checked when it was mapped ([`Offsets::mapped`]).
    Mapped(crate::storage::Backing),
}

impl Offsets {
    /// The offsets of contiguous `(offset, data length)` records from
    /// the start of the shard (as a scan finds them).
    pub(super) fn of_records(records: &[(u64, u64)]) -> Self {
        let mut bounds: Vec<u64> = records.iter().map(|r| r.0).collect();
        if let Some(&(offset, len)) = records.last() {
            bounds.push(offset + 16 + len);
        }
        Self::Owned(bounds)
    }

    /// The node's copy `backing` of a shard's `records` offsets ending at
    /// byte `ends`, when it is one: its length, first and last bound
    /// checked (a file that is not is made again).
    pub(super) fn mapped(
        backing: crate::storage::Backing,
        records: u64,
        ends: u64,
    ) -> Option<Self> {
        let want = records.checked_add(1)?.checked_mul(8)?;
        if backing.bytes().len() as u64 != want {
            return None;
        }
        let o = Self::Mapped(backing);
        (o.bound(0) == 0 && o.bound(records as usize) == ends).then_some(o)
    }

    /// The bounds as the node's copy stores them.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        match self {
            Offsets::Owned(v) => v.iter().flat_map(|b| b.to_le_bytes()).collect(),
            Offsets::Mapped(b) => b.bytes().to_vec(),
        }
    }

    /// Records in the shard.
    pub(super) fn len(&self) -> usize {
        let bounds = match self {
            Offsets::Owned(v) => v.len(),
            Offsets::Mapped(b) => b.bytes().len() / 8,
        };
        bounds.saturating_sub(1)
    }

    fn bound(&self, i: usize) -> u64 {
        match self {
            Offsets::Owned(v) => v[i],
            Offsets::Mapped(b) => {
                let at = &b.bytes()[8 * i..8 * i + 8];
                u64::from_le_bytes(at.try_into().expect("8 bytes"))
            }
        }
    }

    /// Record `i`'s offset and data length (`i < len()`).
    pub(super) fn get(&self, i: usize) -> (u64, u64) {
        let offset = self.bound(i);
        (offset, self.bound(i + 1) - offset - 16)
    }
}

/// The offsets of the records of a DALI-style index (`bytes`, the file
/// `idx`) of a shard whose records end at byte `file_len` (its size, or
/// where damage left out begins), its shape checked: the entries tile
/// those bytes exactly (no wrap-around), and none is over the record-size
/// limit. An index that does not is an error naming it.
pub(super) fn parse_index(idx: &Path, bytes: &[u8], file_len: u64) -> Result<Offsets> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error::Dataset {
        path: idx.to_path_buf(),
        reason: "not UTF-8 text".into(),
        source: Some(Box::new(e)),
    })?;
    let bad = |line: usize, reason: String| bad_line(idx, line, reason);
    let mut bounds = Vec::new();
    let mut next = 0u64;
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
        bounds.push(offset);
    }
    if !bounds.is_empty() {
        bounds.push(next);
    }
    if next != file_len {
        return Err(Error::Dataset {
            path: idx.to_path_buf(),
            reason: format!(
                "index covers {next} bytes but the shard has {file_len}: the index is stale"
            ),
            source: None,
        });
    }
    Ok(Offsets::Owned(bounds))
}

/// The error of line `line` (from 0) of index `idx`: `reason`.
fn bad_line(idx: &Path, line: usize, reason: String) -> Error {
    Error::Dataset {
        path: idx.to_path_buf(),
        reason: format!(
            "line {}: {reason}; delete the index (or set read_index_files: false) to scan the shard",
            line + 1
        ),
        source: None,
    }
}

/// The DALI-style index of a shard's records (`offsets`): a line
/// `offset size` each, the size with the 16 bytes of framing.
pub(crate) fn index_text(offsets: &Offsets) -> Vec<u8> {
    let mut text = String::with_capacity(offsets.len() * 16);
    for i in 0..offsets.len() {
        let (offset, len) = offsets.get(i);
        text.push_str(&format!("{offset} {}\n", len + 16));
    }
    text.into_bytes()
}

pub(super) fn write_index_file(idx: &Path, offsets: &Offsets) -> Result<()> {
    std::fs::write(idx, index_text(offsets)).map_err(|source| Error::Io {
        path: idx.to_path_buf(),
        source,
    })
}
