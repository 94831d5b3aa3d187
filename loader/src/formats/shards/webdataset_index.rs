//! A WebDataset shard's index: where each sample's image is, its label,
//! key and members, as arrays (24 bytes a sample, 16 a member and the
//! key's bytes, against some 170 a sample for a struct with a `String` and
//! a `Vec` each), read in place from one block of bytes that is also the
//! shard's sidecar file (`<shard>.wickidx`, written by `wick index`). A
//! rank maps a shard's sidecar when it first reads the shard, instead of
//! reading the shard's tar headers: the pages are the page cache's, shared
//! by every process of the node that maps the same file (a local shard's
//! sidecar, or the node's cache directory's copy of a remote one).
//!
//! The sidecar, little-endian: the magic `WICKWDS1`; the shard's size, the
//! counts of samples, members, key bytes and extensions (u64 each); per
//! sample the image offset (u64), image length, label, end of its members
//! and end of its key (u32 each); per member its extension, offset (u64)
//! and length; each extension as a u32 length and its bytes; the keys'
//! bytes; a CRC-32C of everything before it. Loading checks every count
//! against the file's length before allocating, and every offset against
//! the shard's size, so a damaged or foreign file is an error, never a
//! panic or a read outside the shard.

use crate::error::Cause;
use crate::storage::Backing;

/// The ending a shard's sidecar adds to the shard's name.
pub(crate) const SIDECAR_SUFFIX: &str = ".wickidx";
const MAGIC: &[u8; 8] = b"WICKWDS1";
/// Largest image member indexed (as the tar pass allows).
const MAX_LEN: u64 = crate::storage::local::MAX_FILE_BYTES;
/// Bytes before the arrays: the magic and five counts.
const HEADER: usize = 8 + 5 * 8;

/// One member of a sample: its extension (an index into the shard's
/// extensions), offset and length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member {
    pub(crate) ext: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// A shard's index being built by the tar pass, as arrays.
#[derive(Debug, Default)]
pub(crate) struct IndexBuilder {
    image_offset: Vec<u64>,
    image_len: Vec<u32>,
    label: Vec<u32>,
    member_end: Vec<u32>,
    key_end: Vec<u32>,
    member_ext: Vec<u32>,
    member_offset: Vec<u64>,
    member_len: Vec<u32>,
    exts: Vec<String>,
    keys: String,
}

impl IndexBuilder {
    /// The id of extension `ext` in this shard, added when new.
    pub(crate) fn ext_id(&mut self, ext: &str) -> u32 {
        match self.exts.iter().position(|e| e == ext) {
            Some(i) => i as u32,
            None => {
                self.exts.push(ext.to_string());
                self.exts.len() as u32 - 1
            }
        }
    }

    /// Appends a sample. A member over the image limit (512 MiB, which
    /// the tar pass checks first) or a shard past 4 GiB of keys or 2^32
    /// members is an error.
    pub(crate) fn push(
        &mut self,
        key: &str,
        (offset, len): (u64, u64),
        label: u32,
        members: &[Member],
    ) -> Result<(), Cause> {
        let too_many = || Cause::from("a shard of more than 4 GiB of keys or 2^32 members");
        let small = |len: u64| match len <= MAX_LEN {
            true => Ok(len as u32),
            false => Err(Cause::from(format!(
                "a member of {len} bytes is over the limit"
            ))),
        };
        self.image_len.push(small(len)?);
        self.image_offset.push(offset);
        self.label.push(label);
        for m in members {
            self.member_len.push(small(m.len)?);
            self.member_ext.push(m.ext);
            self.member_offset.push(m.offset);
        }
        self.member_end
            .push(u32::try_from(self.member_ext.len()).map_err(|_| too_many())?);
        self.keys.push_str(key);
        self.key_end
            .push(u32::try_from(self.keys.len()).map_err(|_| too_many())?);
        Ok(())
    }

    /// The index of a shard of `shard_len` bytes, its bytes those of the
    /// sidecar file.
    pub(crate) fn finish(self, shard_len: u64) -> Result<ShardIndex, Cause> {
        ShardIndex::parse(Backing::Heap(self.to_bytes(shard_len)), shard_len)
    }

    fn to_bytes(&self, shard_len: u64) -> Vec<u8> {
        let n = self.label.len();
        let m = self.member_ext.len();
        let mut out = Vec::with_capacity(HEADER + n * 24 + m * 16 + self.keys.len() + 64);
        out.extend_from_slice(MAGIC);
        for v in [
            shard_len,
            n as u64,
            m as u64,
            self.keys.len() as u64,
            self.exts.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let put64 =
            |out: &mut Vec<u8>, v: &[u64]| v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        let put32 =
            |out: &mut Vec<u8>, v: &[u32]| v.iter().for_each(|x| out.extend(x.to_le_bytes()));
        put64(&mut out, &self.image_offset);
        for v in [
            &self.image_len,
            &self.label,
            &self.member_end,
            &self.key_end,
        ] {
            put32(&mut out, v);
        }
        put32(&mut out, &self.member_ext);
        put64(&mut out, &self.member_offset);
        put32(&mut out, &self.member_len);
        for e in &self.exts {
            out.extend((e.len() as u32).to_le_bytes());
            out.extend_from_slice(e.as_bytes());
        }
        out.extend_from_slice(self.keys.as_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend(crc.to_le_bytes());
        out
    }
}

/// Where each array starts in an index's bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Sections {
    image_offset: usize,
    image_len: usize,
    label: usize,
    member_end: usize,
    key_end: usize,
    member_ext: usize,
    member_offset: usize,
    member_len: usize,
    keys: usize,
}

/// One shard's samples (see the module's documentation), read in place
/// from its bytes: nothing is copied out but the extensions.
#[derive(Debug)]
pub(crate) struct ShardIndex {
    backing: Backing,
    samples: usize,
    at: Sections,
    exts: Vec<String>,
}

impl ShardIndex {
    /// Samples in the shard.
    pub(crate) fn len(&self) -> usize {
        self.samples
    }

    fn u64_at(&self, base: usize, i: usize) -> u64 {
        let b = &self.backing.bytes()[base + 8 * i..base + 8 * i + 8];
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    }

    fn u32_at(&self, base: usize, i: usize) -> u32 {
        let b = &self.backing.bytes()[base + 4 * i..base + 4 * i + 4];
        u32::from_le_bytes(b.try_into().expect("4 bytes"))
    }

    /// The end of sample `n - 1` in the array of ends at `base` (0 for
    /// the first sample).
    fn start(&self, base: usize, n: usize) -> usize {
        match n {
            0 => 0,
            n => self.u32_at(base, n - 1) as usize,
        }
    }

    /// `(offset, length)` of sample `n`'s image member.
    pub(crate) fn image(&self, n: usize) -> (u64, u64) {
        (
            self.u64_at(self.at.image_offset, n),
            u64::from(self.u32_at(self.at.image_len, n)),
        )
    }

    /// Sample `n`'s label.
    pub(crate) fn label(&self, n: usize) -> u32 {
        self.u32_at(self.at.label, n)
    }

    /// Sample `n`'s key (its members' names up to the first dot).
    pub(crate) fn key(&self, n: usize) -> &str {
        let (start, end) = (
            self.start(self.at.key_end, n),
            self.u32_at(self.at.key_end, n) as usize,
        );
        let bytes = &self.backing.bytes()[self.at.keys + start..self.at.keys + end];
        // Checked when the index was read; a mapping damaged since reads
        // as zeros, which the reader reports.
        std::str::from_utf8(bytes).unwrap_or_default()
    }

    /// Sample `n`'s members: `(extension, offset, length)`, in tar order.
    pub(crate) fn members(&self, n: usize) -> impl Iterator<Item = (&str, u64, u64)> + '_ {
        let (start, end) = (
            self.start(self.at.member_end, n),
            self.u32_at(self.at.member_end, n) as usize,
        );
        (start..end).map(|m| {
            let ext = self.u32_at(self.at.member_ext, m) as usize;
            (
                self.exts.get(ext).map_or("", String::as_str),
                self.u64_at(self.at.member_offset, m),
                u64::from(self.u32_at(self.at.member_len, m)),
            )
        })
    }

    /// Whether the index's mapped file was cut short while mapped (what
    /// was read from it since is zeros, not the file).
    pub(crate) fn damaged(&self) -> bool {
        self.backing.damaged()
    }

    /// Bytes of this process's memory the index holds (a mapped file's
    /// pages are the page cache's, shared).
    #[cfg(test)]
    pub(crate) fn memory(&self) -> u64 {
        let exts: usize = self.exts.iter().map(|e| e.len() + 24).sum();
        match &self.backing {
            Backing::Heap(b) => (b.len() + exts) as u64,
            Backing::Mapped(..) => exts as u64,
        }
    }

    /// The index as its sidecar file's bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// The CRC-32C a sidecar ends with (what a manifest records of it).
    pub(crate) fn checksum(sidecar: &[u8]) -> u32 {
        let tail = &sidecar[sidecar.len().saturating_sub(4)..];
        u32::from_le_bytes(tail.try_into().unwrap_or_default())
    }

    /// Reads a sidecar made for a shard of `shard_len` bytes, checking it
    /// whole (see the module's documentation).
    pub(crate) fn parse(backing: Backing, shard_len: u64) -> Result<Self, Cause> {
        let bytes = backing.bytes();
        if bytes.len() < HEADER + 4 || &bytes[..8] != MAGIC {
            return Err("not a wick WebDataset index (no WICKWDS1 header)".into());
        }
        let body = &bytes[..bytes.len() - 4];
        if crc32c::crc32c(body) != Self::checksum(bytes) {
            return Err("the index's checksum fails: the file is damaged".into());
        }
        let mut r = Fields { bytes: body, at: 8 };
        let [len, n, m, key_bytes, exts] = [0; 5].map(|_| r.u64());
        if len != shard_len {
            return Err(format!(
                "the index was made for a shard of {len} bytes, not {shard_len}: the shard \
                 changed since it was indexed"
            )
            .into());
        }
        // Every count bounded by the bytes there are before anything is
        // laid out over them.
        let need = n
            .checked_mul(24)
            .and_then(|a| m.checked_mul(16).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(key_bytes))
            .and_then(|a| exts.checked_mul(4).and_then(|b| a.checked_add(b)));
        if need.is_none_or(|need| need > (body.len() - r.at) as u64) {
            return Err("the index's counts run past its end".into());
        }
        let (n, m) = (n as usize, m as usize);
        let mut at = Sections::default();
        for (field, width, count) in [
            (&mut at.image_offset, 8, n),
            (&mut at.image_len, 4, n),
            (&mut at.label, 4, n),
            (&mut at.member_end, 4, n),
            (&mut at.key_end, 4, n),
            (&mut at.member_ext, 4, m),
            (&mut at.member_offset, 8, m),
            (&mut at.member_len, 4, m),
        ] {
            *field = r.at;
            r.at += width * count;
        }
        let mut ext_names = Vec::new();
        for _ in 0..exts {
            let l = r.u32() as usize;
            let text = r.take(l).ok_or("the index's extensions run past its end")?;
            let text = std::str::from_utf8(text).map_err(|_| "an extension is not UTF-8")?;
            ext_names.push(text.to_string());
        }
        at.keys = r.at;
        r.take(key_bytes as usize)
            .ok_or("the index's keys run past its end")?;
        if r.at != body.len() {
            return Err("the index has bytes past its keys".into());
        }
        let ix = ShardIndex {
            backing,
            samples: n,
            at,
            exts: ext_names,
        };
        ix.check(shard_len, m, key_bytes as usize)?;
        Ok(ix)
    }

    /// Checks what [`Self::parse`] laid out: ends rising to the totals,
    /// keys UTF-8 and cut at character boundaries, extensions known, every
    /// member inside the shard.
    fn check(&self, shard_len: u64, members: usize, key_bytes: usize) -> Result<(), Cause> {
        let n = self.samples;
        let rising = |base: usize, total: usize| {
            (1..n).all(|i| self.u32_at(base, i - 1) <= self.u32_at(base, i))
                && (n == 0 || self.u32_at(base, n - 1) as usize == total)
                && (n > 0 || total == 0)
        };
        if !rising(self.at.member_end, members) {
            return Err("the index's member table is out of order".into());
        }
        let keys = &self.backing.bytes()[self.at.keys..self.at.keys + key_bytes];
        let keys = std::str::from_utf8(keys).map_err(|_| "a key is not UTF-8")?;
        if !rising(self.at.key_end, key_bytes)
            || !(0..n).all(|i| keys.is_char_boundary(self.u32_at(self.at.key_end, i) as usize))
        {
            return Err("the index's key table is out of order".into());
        }
        if (0..members).any(|i| self.u32_at(self.at.member_ext, i) as usize >= self.exts.len()) {
            return Err("a member names an extension the index does not have".into());
        }
        let inside = |offset: u64, len: u32| {
            u64::from(len) <= MAX_LEN
                && offset
                    .checked_add(u64::from(len))
                    .is_some_and(|e| e <= shard_len)
        };
        let images = (0..n).map(|i| {
            (
                self.u64_at(self.at.image_offset, i),
                self.u32_at(self.at.image_len, i),
            )
        });
        let parts = (0..members).map(|i| {
            (
                self.u64_at(self.at.member_offset, i),
                self.u32_at(self.at.member_len, i),
            )
        });
        if let Some((o, l)) = images.chain(parts).find(|&(o, l)| !inside(o, l)) {
            return Err(format!(
                "the index places a member of {l} bytes at {o}, outside the {shard_len}-byte shard"
            )
            .into());
        }
        Ok(())
    }
}

/// A cursor over a sidecar's checked bytes.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let got = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(got)
    }

    /// The next u64 (the caller checked the length).
    fn u64(&mut self) -> u64 {
        let b = self.take(8).unwrap_or(&[0; 8]);
        u64::from_le_bytes(b.try_into().unwrap_or_default())
    }

    /// The next u32 (the caller checked the length).
    fn u32(&mut self) -> u32 {
        let b = self.take(4).unwrap_or(&[0; 4]);
        u32::from_le_bytes(b.try_into().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_index() -> IndexBuilder {
        let mut ix = IndexBuilder::default();
        let (jpg, cls, txt) = (ix.ext_id("jpg"), ix.ext_id("cls"), ix.ext_id("txt"));
        for i in 0..5u64 {
            let base = i * 4096;
            let members = [
                Member {
                    ext: jpg,
                    offset: base + 512,
                    len: 1000,
                },
                Member {
                    ext: cls,
                    offset: base + 2048,
                    len: 1,
                },
                Member {
                    ext: txt,
                    offset: base + 3072,
                    len: 10,
                },
            ];
            let key = format!("k{i}-é");
            ix.push(&key, (base + 512, 1000), i as u32 * 3, &members)
                .unwrap();
        }
        ix
    }

    fn parse(bytes: &[u8], shard_len: u64) -> Result<ShardIndex, Cause> {
        ShardIndex::parse(Backing::Heap(bytes.to_vec()), shard_len)
    }

    /// An index written and read back gives what was put in, and every
    /// damage to its bytes, a shard of another size or a cut file is an
    /// error (never a panic).
    #[test]
    fn a_sidecar_reads_back_and_damage_is_an_error() {
        let bytes = sample_index().to_bytes(5 * 4096);
        let back = parse(&bytes, 5 * 4096).unwrap();
        assert_eq!(back.len(), 5);
        assert_eq!(back.as_bytes(), &bytes[..]);
        assert_eq!(back.key(0), "k0-é");
        assert_eq!(back.key(3), "k3-é");
        assert_eq!(back.image(2), (2 * 4096 + 512, 1000));
        assert_eq!(back.label(4), 12);
        let m: Vec<_> = back
            .members(1)
            .map(|(e, o, l)| (e.to_string(), o, l))
            .collect();
        assert_eq!(
            m,
            [
                ("jpg".into(), 4096 + 512, 1000),
                ("cls".into(), 4096 + 2048, 1),
                ("txt".into(), 4096 + 3072, 10)
            ]
        );
        let empty = IndexBuilder::default().finish(0).unwrap();
        assert_eq!(empty.len(), 0);

        let e = parse(&bytes, 5 * 4096 + 1).unwrap_err();
        assert!(
            e.reason.contains("changed since it was indexed"),
            "{}",
            e.reason
        );
        for cut in [0, 7, 20, bytes.len() - 1] {
            assert!(parse(&bytes[..cut], 5 * 4096).is_err(), "cut at {cut}");
        }
        for at in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(parse(&bad, 5 * 4096).is_err(), "flip at {at}");
        }
        // Checksummed again after a change: what the checksum cannot see.
        let resealed = |mut b: Vec<u8>| {
            let body = b.len() - 4;
            let crc = crc32c::crc32c(&b[..body]);
            b[body..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        // Counts that promise more than the file holds: refused before
        // anything is laid out over them.
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = parse(&resealed(huge), 5 * 4096).unwrap_err();
        assert!(e.reason.contains("run past its end"), "{}", e.reason);
        // A member outside the shard.
        let mut ix = sample_index();
        ix.member_offset[4] = 5 * 4096;
        let e = parse(&ix.to_bytes(5 * 4096), 5 * 4096).unwrap_err();
        assert!(e.reason.contains("outside the"), "{}", e.reason);
        // Member ends out of order, a key cut inside a character, an
        // unknown extension.
        let mut ix = sample_index();
        ix.member_end.swap(1, 2);
        let e = parse(&ix.to_bytes(5 * 4096), 5 * 4096).unwrap_err();
        assert!(e.reason.contains("member table"), "{}", e.reason);
        let mut ix = sample_index();
        ix.key_end[0] -= 1;
        let e = parse(&ix.to_bytes(5 * 4096), 5 * 4096).unwrap_err();
        assert!(e.reason.contains("key table"), "{}", e.reason);
        let mut ix = sample_index();
        ix.member_ext[3] = 9;
        let e = parse(&ix.to_bytes(5 * 4096), 5 * 4096).unwrap_err();
        assert!(e.reason.contains("extension"), "{}", e.reason);
    }
}
