//! A WebDataset shard's index: where each sample's image is, its label,
//! key and members, as a struct of arrays (about 30 bytes a sample plus
//! its key and 16 a member, against some 170 for a struct with a `String`
//! and a `Vec` each), and the same arrays as a file, the shard's sidecar
//! (`<shard>.wickidx`, written by `wick index`), which a rank loads when it
//! first reads the shard instead of reading the shard's tar headers.
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

/// The ending a shard's sidecar adds to the shard's name.
pub(crate) const SIDECAR_SUFFIX: &str = ".wickidx";
const MAGIC: &[u8; 8] = b"WICKWDS1";
/// Largest image member indexed (as the tar pass allows).
const MAX_LEN: u64 = crate::storage::local::MAX_FILE_BYTES;

/// One shard's samples (see the module's documentation).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ShardIndex {
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

/// One member of a sample: its extension (an index into the shard's
/// extensions), offset and length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member {
    pub(crate) ext: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl ShardIndex {
    /// Samples in the shard.
    pub(crate) fn len(&self) -> usize {
        self.label.len()
    }

    /// `(offset, length)` of sample `n`'s image member.
    pub(crate) fn image(&self, n: usize) -> (u64, u64) {
        (self.image_offset[n], u64::from(self.image_len[n]))
    }

    /// Sample `n`'s label.
    pub(crate) fn label(&self, n: usize) -> u32 {
        self.label[n]
    }

    /// Sample `n`'s key (its members' names up to the first dot).
    pub(crate) fn key(&self, n: usize) -> &str {
        let start = if n == 0 { 0 } else { self.key_end[n - 1] };
        &self.keys[start as usize..self.key_end[n] as usize]
    }

    /// Sample `n`'s members: `(extension, offset, length)`, in tar order.
    pub(crate) fn members(&self, n: usize) -> impl Iterator<Item = (&str, u64, u64)> + '_ {
        let start = if n == 0 { 0 } else { self.member_end[n - 1] };
        (start as usize..self.member_end[n] as usize).map(|m| {
            (
                self.exts[self.member_ext[m] as usize].as_str(),
                self.member_offset[m],
                u64::from(self.member_len[m]),
            )
        })
    }

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

    /// Bytes the index holds in memory.
    pub(crate) fn memory(&self) -> u64 {
        let n = self.len() as u64;
        let m = self.member_ext.len() as u64;
        n * (8 + 4 * 4) + m * 16 + self.keys.len() as u64
    }

    /// The sidecar of this index, for a shard of `shard_len` bytes.
    pub(crate) fn to_bytes(&self, shard_len: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.memory() as usize);
        out.extend_from_slice(MAGIC);
        for v in [
            shard_len,
            self.len() as u64,
            self.member_ext.len() as u64,
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

    /// The CRC-32C a sidecar ends with (what a manifest records of it).
    pub(crate) fn checksum(sidecar: &[u8]) -> u32 {
        let tail = &sidecar[sidecar.len().saturating_sub(4)..];
        u32::from_le_bytes(tail.try_into().unwrap_or_default())
    }

    /// Reads a sidecar made for a shard of `shard_len` bytes, checking it
    /// whole (see the module's documentation).
    pub(crate) fn from_bytes(bytes: &[u8], shard_len: u64) -> Result<Self, Cause> {
        if bytes.len() < MAGIC.len() + 5 * 8 + 4 || &bytes[..8] != MAGIC {
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
        // allocated for it.
        let need = n
            .checked_mul(24)
            .and_then(|a| m.checked_mul(16).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(key_bytes))
            .and_then(|a| exts.checked_mul(4).and_then(|b| a.checked_add(b)));
        if need.is_none_or(|need| need > (body.len() - r.at) as u64) {
            return Err("the index's counts run past its end".into());
        }
        let (n, m) = (n as usize, m as usize);
        let mut ix = ShardIndex {
            image_offset: r.many(n, Fields::u64),
            image_len: r.many(n, Fields::u32),
            label: r.many(n, Fields::u32),
            member_end: r.many(n, Fields::u32),
            key_end: r.many(n, Fields::u32),
            member_ext: r.many(m, Fields::u32),
            member_offset: r.many(m, Fields::u64),
            member_len: r.many(m, Fields::u32),
            ..ShardIndex::default()
        };
        for _ in 0..exts {
            let l = r.u32() as usize;
            let text = r.take(l).ok_or("the index's extensions run past its end")?;
            let text = std::str::from_utf8(text).map_err(|_| "an extension is not UTF-8")?;
            ix.exts.push(text.to_string());
        }
        let keys = r
            .take(key_bytes as usize)
            .ok_or("the index's keys run past its end")?;
        if r.at != body.len() {
            return Err("the index has bytes past its keys".into());
        }
        ix.keys = String::from_utf8(keys.to_vec()).map_err(|_| "a key is not UTF-8")?;
        ix.check(shard_len)?;
        Ok(ix)
    }

    /// Checks what [`Self::from_bytes`] read: ends rising to the totals,
    /// keys cut at character boundaries, extensions known, every member
    /// inside the shard.
    fn check(&self, shard_len: u64) -> Result<(), Cause> {
        let rising = |ends: &[u32], total: usize| {
            ends.windows(2).all(|w| w[0] <= w[1]) && ends.last().map_or(0, |&e| e as usize) == total
        };
        if !rising(&self.member_end, self.member_ext.len()) {
            return Err("the index's member table is out of order".into());
        }
        if !rising(&self.key_end, self.keys.len())
            || !self
                .key_end
                .iter()
                .all(|&e| self.keys.is_char_boundary(e as usize))
        {
            return Err("the index's key table is out of order".into());
        }
        if self
            .member_ext
            .iter()
            .any(|&e| e as usize >= self.exts.len())
        {
            return Err("a member names an extension the index does not have".into());
        }
        let inside = |offset: u64, len: u32| {
            u64::from(len) <= MAX_LEN
                && offset
                    .checked_add(u64::from(len))
                    .is_some_and(|e| e <= shard_len)
        };
        let images = self.image_offset.iter().zip(&self.image_len);
        let members = self.member_offset.iter().zip(&self.member_len);
        if let Some((o, l)) = images.chain(members).find(|(&o, &l)| !inside(o, l)) {
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

    fn many<T>(&mut self, n: usize, one: fn(&mut Self) -> T) -> Vec<T> {
        (0..n).map(|_| one(self)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_index() -> ShardIndex {
        let mut ix = ShardIndex::default();
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

    /// An index written and read back is the same, and every damage to
    /// its bytes, a shard of another size or a cut file is an error
    /// (never a panic).
    #[test]
    fn a_sidecar_reads_back_and_damage_is_an_error() {
        let ix = sample_index();
        let bytes = ix.to_bytes(5 * 4096);
        let back = ShardIndex::from_bytes(&bytes, 5 * 4096).unwrap();
        assert_eq!(back, ix);
        assert_eq!(back.key(3), "k3-é");
        assert_eq!(back.image(2), (2 * 4096 + 512, 1000));
        assert_eq!(back.label(4), 12);
        let m: Vec<_> = back
            .members(1)
            .map(|(e, _, l)| (e.to_string(), l))
            .collect();
        assert_eq!(
            m,
            [("jpg".into(), 1000), ("cls".into(), 1), ("txt".into(), 10)]
        );

        let e = ShardIndex::from_bytes(&bytes, 5 * 4096 + 1).unwrap_err();
        assert!(
            e.reason.contains("changed since it was indexed"),
            "{}",
            e.reason
        );
        for cut in [0, 7, 20, bytes.len() - 1] {
            assert!(
                ShardIndex::from_bytes(&bytes[..cut], 5 * 4096).is_err(),
                "cut at {cut}"
            );
        }
        for at in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(
                ShardIndex::from_bytes(&bad, 5 * 4096).is_err(),
                "flip at {at}"
            );
        }
        // Counts that promise more than the file holds, with a valid
        // checksum: refused before anything is allocated.
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let body = huge.len() - 4;
        let crc = crc32c::crc32c(&huge[..body]);
        huge[body..].copy_from_slice(&crc.to_le_bytes());
        let e = ShardIndex::from_bytes(&huge, 5 * 4096).unwrap_err();
        assert!(e.reason.contains("run past its end"), "{}", e.reason);
        // A member outside the shard, with a valid checksum.
        let mut ix = sample_index();
        ix.member_offset[4] = 5 * 4096;
        let e = ShardIndex::from_bytes(&ix.to_bytes(5 * 4096), 5 * 4096).unwrap_err();
        assert!(e.reason.contains("outside the"), "{}", e.reason);
    }
}
