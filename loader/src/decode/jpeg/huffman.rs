//! Huffman tables and the bit reader of a baseline JPEG scan.
//!
//! Codes of up to [`FAST_BITS`] bits are found with one table lookup. For a
//! baseline block's AC coefficients a second table gives, with the code's
//! length, its run, its value's size and both lengths together, so a
//! coefficient costs one lookup, one shift of the buffer and branch-free
//! arithmetic for its value: no branch depends on how long the value is
//! (on a noisy photo such a branch mispredicts often). The reader keeps 64
//! bits buffered and refills 8 bytes at a time when none of them is 0xFF
//! (no byte stuffing or marker to handle).

/// Bits looked up at once; longer codes take the slow path.
const FAST_BITS: u32 = 9;
const FAST_SIZE: usize = 1 << FAST_BITS;

/// Bits looked up at once when AC coefficients are skipped, not stored:
/// every whole code and value in them is stepped over together.
const SKIP_BITS: u32 = 12;
const SKIP_SIZE: usize = 1 << SKIP_BITS;
/// A skip entry's flag: its last code is an end of block.
const SKIP_EOB: usize = 1 << 11;

/// Natural (row-major) index of the coefficient at each zigzag position.
pub(super) const ZIGZAG: [u8; 64] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];

/// One Huffman table (DHT segment), in lookup form.
pub(super) struct Table {
    /// `length << 8 | symbol` for the code that starts with these
    /// `FAST_BITS` bits, or 0 when that code is longer.
    fast: [u16; FAST_SIZE],
    /// For AC tables: `symbol << 16 | code length << 8 | code length +
    /// value size` for the code that starts with these `FAST_BITS` bits
    /// (`symbol` is `run << 4 | size`), or 0 when that code is longer.
    fast_ac: [u32; FAST_SIZE],
    /// For AC tables, once [`Self::prepare_skip`] has run (`skip_ready`):
    /// the codes and values that lie whole in these `SKIP_BITS` bits,
    /// decoded in turn up to an end of block or a run that would pass the
    /// block's end: `bits | need << 4 | eob << 11`, where
    /// `bits` is their length, `eob` says the last is an end of block and
    /// `need` is the coefficients they step over plus `eob` (they belong to
    /// the current block when it has that many positions left). 0 when the
    /// first code and value do not fit.
    skip: Box<[u16; SKIP_SIZE]>,
    skip_ready: bool,
    /// The DHT segment (counts and symbols) the tables were built from, so
    /// that the same one in the next image is not built again.
    source: Vec<u8>,
    /// `maxcode[l]`: one past the last code of length `l`, left-aligned to
    /// 16 bits.
    maxcode: [u32; 17],
    /// `delta[l]`: index in `symbols` of a code of length `l`, minus the code.
    delta: [i32; 17],
    symbols: [u8; 256],
    /// Set by a DHT segment.
    pub(super) defined: bool,
}

impl Table {
    pub(super) fn empty() -> Self {
        Table {
            fast: [0; FAST_SIZE],
            fast_ac: [0; FAST_SIZE],
            skip: Box::new([0; SKIP_SIZE]),
            skip_ready: false,
            source: Vec::new(),
            maxcode: [0; 17],
            delta: [0; 17],
            symbols: [0; 256],
            defined: false,
        }
    }

    /// Builds the table from a DHT's 16 code counts and its symbols; `None`
    /// when the counts do not describe a prefix code. The same table as the
    /// one built last is kept, skip entries included (photos from one
    /// encoder share their tables).
    pub(super) fn build(&mut self, counts: &[u8], symbols: &[u8]) -> Option<()> {
        if counts.len() != 16 || symbols.len() > 256 {
            return None;
        }
        if self.source.len() == counts.len() + symbols.len()
            && self.source[..16] == *counts
            && self.source[16..] == *symbols
        {
            self.defined = true;
            return Some(());
        }
        self.source.clear();
        self.skip_ready = false;
        self.fast.fill(0);
        self.fast_ac.fill(0);
        self.symbols[..symbols.len()].copy_from_slice(symbols);
        let (mut code, mut k) = (0u32, 0usize);
        for len in 1..=16u32 {
            let n = counts[len as usize - 1] as usize;
            self.delta[len as usize] = k as i32 - code as i32;
            if code + n as u32 > 1 << len {
                return None;
            }
            for _ in 0..n {
                let sym = *symbols.get(k)?;
                if len <= FAST_BITS {
                    let shift = FAST_BITS - len;
                    let first = (code << shift) as usize;
                    let entry = (len << 8) as u16 | sym as u16;
                    self.fast[first..first + (1 << shift)].fill(entry);
                }
                code += 1;
                k += 1;
            }
            self.maxcode[len as usize] = code << (16 - len);
            code <<= 1;
        }
        if k != symbols.len() {
            return None;
        }
        for (ac, &e) in self.fast_ac.iter_mut().zip(&self.fast) {
            let (len, rs) = ((e >> 8) as u32, (e & 0xFF) as u32);
            if e != 0 {
                *ac = rs << 16 | len << 8 | (len + (rs & 15));
            }
        }
        self.source.extend_from_slice(counts);
        self.source.extend_from_slice(symbols);
        self.defined = true;
        Some(())
    }

    /// Builds the skip entries of an AC table, if not built yet (a few
    /// microseconds: worth it when many blocks are skipped).
    pub(super) fn prepare_skip(&mut self) {
        if !self.skip_ready && self.defined {
            let mut counts = [0u8; 16];
            counts.copy_from_slice(&self.source[..16]);
            self.build_skip(&counts);
            self.skip_ready = true;
        }
    }

    /// Fills `skip` (see there) from the DHT's counts. Only end of block
    /// and runs of 16 zeros are taken among the symbols without a value:
    /// any other is left to the one-code path, which judges it.
    ///
    /// Built width by width: the entries of `w` bits that start with a
    /// code and value of `t` bits are that code joined to the entries of
    /// the `w - t` bits after it, a copy over a slice per code and value
    /// (a few microseconds, against tens for decoding each entry's codes).
    fn build_skip(&mut self, counts: &[u8]) {
        // The entries for `w < SKIP_BITS` bits, at `(1 << w) - 1`.
        let mut narrow = [0u16; SKIP_SIZE];
        for w in 1..=SKIP_BITS {
            let (lower, rest) = narrow.split_at_mut((1 << w) - 1);
            let out: &mut [u16] = if w == SKIP_BITS {
                &mut self.skip[..]
            } else {
                &mut rest[..1 << w]
            };
            out.fill(0);
            let (mut code, mut k) = (0usize, 0usize);
            for len in 1..=w {
                for _ in 0..counts[len as usize - 1] {
                    let rs = self.symbols[k] as u32;
                    let (run, size) = (rs >> 4, rs & 15);
                    let t = len + size;
                    let start = code << (w - len);
                    if rs == 0 {
                        out[start..start + (1 << (w - len))]
                            .fill((len | 1 << 4) as u16 | SKIP_EOB as u16);
                    } else if t <= w && (size != 0 || run == 15) {
                        let first = (t | (run + 1) << 4) as u16;
                        let after = &lower[(1 << (w - t)) - 1..][..1 << (w - t)];
                        for (i, &e) in out[start..start + (1 << (w - len))]
                            .iter_mut()
                            .zip(after.iter().cycle())
                        {
                            let need = (run + 1) as u16 + (e >> 4 & 0x7F);
                            *i = if e == 0 || need > 64 {
                                first
                            } else {
                                (t as u16 + (e & 15)) | need << 4 | (e & SKIP_EOB as u16)
                            };
                        }
                    }
                    code += 1;
                    k += 1;
                }
                code <<= 1;
            }
        }
    }
}

/// JPEG's sign extension of a `size`-bit magnitude category value, as the
/// standard writes it: the reference `Bits::value` is held to.
#[cfg(test)]
fn extend(v: i32, size: u32) -> i32 {
    if size == 0 {
        0
    } else if v < 1 << (size - 1) {
        v - (1 << size) + 1
    } else {
        v
    }
}

/// Reads the entropy-coded bits of one scan.
pub(super) struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
    /// Buffered bits, most significant first.
    buf: u64,
    /// Number of valid bits in `buf`.
    n: u32,
    /// A marker or the end of the data was reached: only zero bits follow.
    ended: bool,
    /// Zero bits pushed after `ended` that are still counted in `n` or were
    /// consumed; consuming one means the data was truncated.
    pad: u32,
}

impl<'a> Bits<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
        Bits {
            data,
            pos: 0,
            buf: 0,
            n: 0,
            ended: false,
            pad: 0,
        }
    }

    /// Tops the buffer up to at least 57 bits.
    #[inline(always)]
    fn refill(&mut self) {
        if !self.ended {
            if let Some(chunk) = self.data.get(self.pos..self.pos + 8) {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                let word = u64::from_be_bytes(word);
                let inv = !word;
                let has_ff =
                    inv.wrapping_sub(0x0101_0101_0101_0101) & !inv & 0x8080_8080_8080_8080 != 0;
                if !has_ff {
                    let take = (63 - self.n) / 8;
                    self.buf |= (word >> (64 - 8 * take)) << (64 - self.n - 8 * take);
                    self.pos += take as usize;
                    self.n += 8 * take;
                    return;
                }
            }
        }
        while self.n <= 56 {
            let b = self.next_byte();
            self.buf |= (b as u64) << (56 - self.n);
            self.n += 8;
        }
    }

    fn next_byte(&mut self) -> u8 {
        if !self.ended {
            match self.data.get(self.pos) {
                Some(0xFF) => {
                    if self.data.get(self.pos + 1) == Some(&0) {
                        self.pos += 2;
                        return 0xFF;
                    }
                    self.ended = true;
                }
                Some(&b) => {
                    self.pos += 1;
                    return b;
                }
                None => self.ended = true,
            }
        }
        self.pad += 8;
        0
    }

    #[inline(always)]
    fn consume(&mut self, k: u32) {
        self.buf <<= k;
        self.n -= k;
    }

    /// Reads `size` bits (at most 16) as an unsigned value; needs that many
    /// buffered bits.
    #[inline(always)]
    pub(super) fn bits(&mut self, size: u32) -> u32 {
        if size == 0 {
            return 0;
        }
        let v = (self.buf >> (64 - size)) as u32;
        self.consume(size);
        v
    }

    /// Where the reader stands in the data: at or before the marker that
    /// ends the scan.
    pub(super) fn position(&self) -> usize {
        self.pos
    }

    /// Reads `size` bits (at most 16) as a sign-extended value, without a
    /// branch on its sign (a coin toss on a photo).
    #[inline(always)]
    pub(super) fn receive_extend(&mut self, size: u32) -> i32 {
        let v = self.value(0, size);
        self.consume(size);
        v
    }

    /// Refills when fewer than 32 bits are buffered: enough for one symbol
    /// and its value bits.
    #[inline(always)]
    pub(super) fn ensure(&mut self) {
        if self.n < 32 {
            self.refill();
        }
    }

    /// Decodes one symbol; needs at least 16 buffered bits.
    #[inline(always)]
    pub(super) fn symbol(&mut self, t: &Table) -> Option<u8> {
        let e = t.fast[(self.buf >> (64 - FAST_BITS)) as usize];
        if e != 0 {
            self.consume((e >> 8) as u32);
            return Some(e as u8);
        }
        let v = (self.buf >> 48) as u32;
        for len in FAST_BITS + 1..=16 {
            if v < t.maxcode[len as usize] {
                let index = (v >> (16 - len)) as i32 + t.delta[len as usize];
                let sym = *t.symbols.get(usize::try_from(index).ok()?)?;
                self.consume(len);
                return Some(sym);
            }
        }
        None
    }

    /// Whether every bit consumed so far came from the data (no padding
    /// past a marker or the end was read).
    pub(super) fn intact(&self) -> bool {
        self.pad <= self.n
    }

    /// Skips the entropy-coded data from the reader's position to the next
    /// restart marker, without decoding it, and stands before the marker
    /// (for [`Self::restart`], which resets the buffer); `None` when the
    /// data ends or another marker comes first. Only at the start of a
    /// restart interval, where no bits are buffered.
    pub(super) fn skip_to_restart(&mut self) -> Option<()> {
        debug_assert_eq!(self.n, 0, "skipping with bits buffered");
        let mut p = self.pos;
        loop {
            p += memchr::memchr(0xFF, self.data.get(p..)?)?;
            match *self.data.get(p + 1)? {
                // A stuffed 0xFF data byte, or fill bytes before a marker.
                0x00 => p += 2,
                0xFF => p += 1,
                0xD0..=0xD7 => break,
                _ => return None,
            }
        }
        self.pos = p;
        Some(())
    }

    /// Handles a restart marker: drops the buffered bits and steps over
    /// `RSTn`; `false` when the data is not at one.
    pub(super) fn restart(&mut self) -> bool {
        if !self.intact() {
            return false;
        }
        self.buf = 0;
        self.n = 0;
        self.pad = 0;
        self.ended = false;
        let mut p = self.pos;
        if self.data.get(p) != Some(&0xFF) {
            return false;
        }
        while self.data.get(p) == Some(&0xFF) {
            p += 1;
        }
        match self.data.get(p) {
            Some(0xD0..=0xD7) => {
                self.pos = p + 1;
                true
            }
            _ => false,
        }
    }

    /// Decodes one 8x8 block: DC difference into `pred`, and when `STORE`,
    /// the quantized coefficients in natural order into `coef` (which must be
    /// zero on entry) up to zigzag position `kmax` at least (the rest are
    /// skipped, several codes to a lookup). Returns a zigzag position at or
    /// after the last stored coefficient (0: DC only; past it only after a
    /// run of 16 zeros that ends the block, which encoders do not write), or
    /// `None` for a code the tables do not hold. (Tracking the last position
    /// exactly was a store a coefficient.)
    #[inline(always)]
    pub(super) fn block<const STORE: bool>(
        &mut self,
        dc: &Table,
        ac: &Table,
        pred: &mut i32,
        coef: &mut [i16; 64],
        kmax: usize,
    ) -> Option<usize> {
        self.ensure();
        let size = self.symbol(dc)? as u32;
        if size > 15 {
            return None;
        }
        let diff = self.receive_extend(size);
        *pred = (*pred + diff).clamp(i16::MIN as i32, i16::MAX as i32);
        coef[0] = *pred as i16;
        let mut k = 1usize;
        while k <= kmax {
            if !self.coefficient::<STORE>(ac, &mut k, coef)? {
                return Some(k.min(64) - 1);
            }
        }
        if k < 64 {
            self.skip_rest(ac, k, coef)?;
        }
        Some(k.min(64) - 1)
    }

    /// Steps over the rest of a block's AC coefficients, from zigzag
    /// position `k`: several codes to a lookup once the table's skip
    /// entries are built (`coef` is not written). Not inlined: kept out of
    /// the stored path's loop.
    #[inline(never)]
    fn skip_rest(&mut self, ac: &Table, mut k: usize, coef: &mut [i16; 64]) -> Option<()> {
        if !ac.skip_ready {
            while k < 64 && self.coefficient::<false>(ac, &mut k, coef)? {}
            return Some(());
        }
        'block: while k < 64 {
            self.ensure();
            // Two lookups to a refill check: 32 buffered bits hold both.
            for _ in 0..2 {
                let e = ac.skip[(self.buf >> (64 - SKIP_BITS)) as usize] as usize;
                let need = e >> 4 & 0x7F;
                if e == 0 || k + need > 64 {
                    if !self.coefficient::<false>(ac, &mut k, coef)? {
                        break 'block;
                    }
                    continue 'block;
                }
                self.consume((e & 15) as u32);
                if e & SKIP_EOB != 0 {
                    break 'block;
                }
                k += need;
                if k == 64 {
                    break 'block;
                }
            }
        }
        Some(())
    }

    /// The `size`-bit value (at most 16) `offset` bits into the buffer,
    /// sign-extended as JPEG's `EXTEND` does, without a branch: a leading 0 bit
    /// means negative, `raw - (2^size - 1)`; 0 when `size` is 0.
    #[inline(always)]
    fn value(&self, offset: u32, size: u32) -> i32 {
        let x = self.buf << offset;
        let raw = ((x >> 1) >> (63 - size)) as i32;
        let negative = !((x as i64 >> 63) as i32);
        raw + (negative & (1 - (1 << size)))
    }

    /// Decodes one AC code and its value at zigzag position `k` (stored in
    /// `coef` when `STORE`) and moves `k` past it; `Some(false)` at the end
    /// of the block.
    #[inline(always)]
    fn coefficient<const STORE: bool>(
        &mut self,
        ac: &Table,
        k: &mut usize,
        coef: &mut [i16; 64],
    ) -> Option<bool> {
        self.ensure();
        let f = ac.fast_ac[(self.buf >> (64 - FAST_BITS)) as usize];
        if f != 0 {
            // The value's bits start after the code.
            let rs = f >> 16;
            let v = self.value((f >> 8) & 0xFF, rs & 15);
            self.consume(f & 0xFF);
            if rs == 0 {
                return Some(false);
            }
            let size = rs & 15;
            *k += (rs >> 4) as usize;
            if *k > 63 {
                // A run of 16 zeros past the block's end ends it.
                if size == 0 {
                    return Some(false);
                }
                return None;
            }
            if STORE {
                coef[ZIGZAG[*k] as usize] = v as i16;
            }
            *k += 1;
            return Some(true);
        }
        let rs = self.symbol(ac)? as u32;
        let (run, size) = ((rs >> 4) as usize, rs & 15);
        if size == 0 {
            if run != 15 {
                return Some(false);
            }
            *k += 16;
            return Some(true);
        }
        *k += run;
        if *k > 63 {
            return None;
        }
        let v = self.receive_extend(size);
        if STORE {
            coef[ZIGZAG[*k] as usize] = v as i16;
        }
        *k += 1;
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `codes` (value, length) MSB first, stuffing 0xFF bytes.
    fn pack(codes: &[(u32, u32)]) -> Vec<u8> {
        let (mut acc, mut n, mut out) = (0u64, 0u32, Vec::new());
        for &(v, len) in codes {
            acc = acc << len | v as u64;
            n += len;
            while n >= 8 {
                let b = (acc >> (n - 8)) as u8;
                out.push(b);
                if b == 0xFF {
                    out.push(0);
                }
                n -= 8;
            }
        }
        if n > 0 {
            let b = ((acc << (8 - n)) as u8) | ((1 << (8 - n)) - 1) as u8;
            out.push(b);
            if b == 0xFF {
                out.push(0);
            }
        }
        out
    }

    #[test]
    fn fast_and_slow_codes_decode() {
        // Lengths 2, 3 and 12: codes 00, 010, then 0110_0000_0000.
        let mut counts = [0u8; 16];
        counts[1] = 1;
        counts[2] = 1;
        counts[11] = 1;
        let mut t = Table::empty();
        t.build(&counts, &[5, 7, 9]).unwrap();
        let data = pack(&[(0b00, 2), (0b011000000000, 12), (0b010, 3), (0xFF, 8)]);
        let mut bits = Bits::new(&data);
        bits.refill();
        assert_eq!(bits.symbol(&t), Some(5));
        assert_eq!(bits.symbol(&t), Some(9));
        assert_eq!(bits.symbol(&t), Some(7));
        assert_eq!(bits.receive_extend(8), 255);
        assert!(bits.intact());
    }

    /// Table K.5's code lengths (the standard luminance AC table) over all
    /// 162 AC symbols, the shorter codes to the smaller runs and sizes.
    fn ac_table() -> Table {
        let counts = [0u8, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7d];
        let mut symbols: Vec<u8> = (0..16u8)
            .flat_map(|run| (1..=10u8).map(move |size| run << 4 | size))
            .collect();
        symbols.sort_by_key(|&rs| (rs >> 4) + (rs & 15));
        // End of block a 5-bit code, so random bits make long blocks too.
        symbols.insert(8, 0x00);
        symbols.insert(30, 0xF0);
        let mut t = Table::empty();
        t.build(&counts, &symbols).unwrap();
        t
    }

    /// Bits consumed so far (the data holds no 0xFF byte).
    fn consumed(b: &Bits) -> u32 {
        8 * b.pos as u32 + b.pad - b.n
    }

    /// Skipping a block's coefficients several codes at a time reads the
    /// same bits, and ends blocks and fails where decoding them one at a
    /// time does: blocks from random bits (every kind of code, runs past
    /// the block's end, long codes), skipped whole or past 4, 24 or 63.
    #[test]
    fn skipped_coefficients_read_what_stored_ones_do() {
        let mut dc = Table::empty();
        let dc_counts = [0u8, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0];
        dc.build(&dc_counts, &(0..12).collect::<Vec<u8>>()).unwrap();
        let mut ac = ac_table();
        ac.prepare_skip();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let (mut blocks, mut failed) = (0, 0);
        for _ in 0..300 {
            let data: Vec<u8> = (0..300)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 32) as u8 & 0xFE
                })
                .collect();
            for kmax in [0usize, 4, 24, 63] {
                let (mut one, mut skip) = (Bits::new(&data), Bits::new(&data));
                let (mut p1, mut p2) = (0, 0);
                while !one.ended {
                    let (mut c1, mut c2) = ([0i16; 64], [0i16; 64]);
                    let r1 = one.block::<true>(&dc, &ac, &mut p1, &mut c1, 63);
                    let r2 = match kmax {
                        0 => skip.block::<false>(&dc, &ac, &mut p2, &mut c2, 0),
                        _ => skip.block::<true>(&dc, &ac, &mut p2, &mut c2, kmax),
                    };
                    assert_eq!(r1.is_some(), r2.is_some(), "kmax {kmax}");
                    let Some(last) = r2 else {
                        failed += 1;
                        break;
                    };
                    blocks += 1;
                    assert_eq!(consumed(&one), consumed(&skip), "kmax {kmax}");
                    assert_eq!(p1, p2);
                    if kmax > 0 {
                        for &n in &ZIGZAG[..=kmax] {
                            assert_eq!(c1[n as usize], c2[n as usize], "kmax {kmax}");
                        }
                        // Nothing is stored after the position returned.
                        for (z, &n) in ZIGZAG.iter().enumerate().skip(last + 1) {
                            assert_eq!(c2[n as usize], 0, "kmax {kmax}: {z} after {last}");
                        }
                    }
                }
            }
        }
        // Both kinds of ending were met, many times.
        assert!(
            blocks > 5_000 && failed > 500,
            "{blocks} blocks, {failed} failed"
        );
    }

    #[test]
    fn over_full_counts_are_rejected() {
        let mut counts = [0u8; 16];
        counts[0] = 3; // three 1-bit codes cannot exist
        assert!(Table::empty().build(&counts, &[1, 2, 3]).is_none());
    }

    #[test]
    fn extend_matches_the_standard() {
        assert_eq!(extend(0, 1), -1);
        assert_eq!(extend(1, 1), 1);
        assert_eq!(extend(0b011, 3), -4);
        assert_eq!(extend(0b100, 3), 4);
        // The reader's branch-free form agrees for every size and value.
        for size in 0..=16u32 {
            for v in 0..1u32 << size {
                let mut b = Bits::new(&[]);
                b.buf = if size == 0 {
                    0
                } else {
                    (v as u64) << (64 - size)
                };
                b.n = 64;
                assert_eq!(b.receive_extend(size), extend(v as i32, size), "{size} {v}");
            }
        }
    }
}
