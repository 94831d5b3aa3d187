//! The marker segments: frame header, tables, restart interval and the
//! header of each scan.

use super::huffman::Table;
use crate::decode::limits::MAX_SIDE;

#[derive(Clone, Copy, Default)]
pub(super) struct Component {
    pub(super) id: u8,
    /// Sampling factors.
    pub(super) h: usize,
    pub(super) v: usize,
    /// Quantization table.
    pub(super) tq: usize,
    /// Huffman tables of the current scan.
    pub(super) td: usize,
    pub(super) ta: usize,
}

/// The frame: what SOF and the table segments before the first scan say.
pub(super) struct Header {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) comps: [Component; 3],
    pub(super) ncomp: usize,
    pub(super) hmax: usize,
    pub(super) vmax: usize,
    pub(super) progressive: bool,
    pub(super) restart: usize,
    pub(super) quant: [[u16; 64]; 4],
    quant_defined: [bool; 4],
    adobe_transform: Option<u8>,
}

/// One scan's header.
#[derive(Clone, Copy)]
pub(super) struct Scan {
    pub(super) ns: usize,
    /// Frame component index of each scan component, in scan order.
    pub(super) order: [usize; 3],
    /// Spectral selection and successive approximation.
    pub(super) ss: usize,
    pub(super) se: usize,
    pub(super) ah: u32,
    pub(super) al: u32,
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]) as usize)
}

impl Header {
    /// A header with nothing read yet; resets the Huffman tables.
    pub(super) fn new(bytes: &[u8], tables: &mut [Table; 8]) -> Option<Self> {
        if !bytes.starts_with(&[0xFF, 0xD8]) {
            return None;
        }
        for t in tables.iter_mut() {
            t.defined = false;
        }
        Some(Header {
            width: 0,
            height: 0,
            comps: [Component::default(); 3],
            ncomp: 0,
            hmax: 1,
            vmax: 1,
            progressive: false,
            restart: 0,
            quant: [[0; 64]; 4],
            quant_defined: [false; 4],
            adobe_transform: None,
        })
    }

    /// Reads segments from `*pos` up to the next scan, whose entropy-coded
    /// data then starts at `*pos`; `Some(None)` at EOI. `None`: something
    /// this decoder does not take, or damage.
    pub(super) fn next_scan(
        &mut self,
        bytes: &[u8],
        pos: &mut usize,
        tables: &mut [Table; 8],
    ) -> Option<Option<Scan>> {
        loop {
            if *bytes.get(*pos)? != 0xFF {
                return None;
            }
            while *bytes.get(*pos)? == 0xFF {
                *pos += 1;
            }
            let marker = bytes[*pos];
            *pos += 1;
            match marker {
                0x01 | 0xD0..=0xD7 => continue,
                0xD9 => return Some(None),
                _ => {}
            }
            let len = be16(bytes, *pos)?;
            let seg = bytes.get(*pos + 2..pos.checked_add(len)?)?;
            *pos += len;
            match marker {
                0xC0..=0xC2 => self.frame(seg, marker == 0xC2)?,
                0xC4 => {
                    let mut s = seg;
                    while !s.is_empty() {
                        let (class, id) = ((s[0] >> 4) as usize, (s[0] & 15) as usize);
                        if class > 1 || id > 3 {
                            return None;
                        }
                        let counts = s.get(1..17)?;
                        let total: usize = counts.iter().map(|&c| c as usize).sum();
                        let symbols = s.get(17..17 + total)?;
                        tables[class * 4 + id].build(counts, symbols)?;
                        s = &s[17 + total..];
                    }
                }
                0xDB => {
                    let mut s = seg;
                    while !s.is_empty() {
                        let (precision, id) = ((s[0] >> 4) as usize, (s[0] & 15) as usize);
                        if precision > 1 || id > 3 {
                            return None;
                        }
                        let size = 64 * (precision + 1);
                        let values = s.get(1..1 + size)?;
                        for k in 0..64 {
                            self.quant[id][k] = if precision == 0 {
                                values[k] as u16
                            } else {
                                u16::from_be_bytes([values[2 * k], values[2 * k + 1]])
                            };
                        }
                        self.quant_defined[id] = true;
                        s = &s[1 + size..];
                    }
                }
                0xDD => self.restart = be16(seg, 0)?,
                0xEE => {
                    if seg.starts_with(b"Adobe") {
                        self.adobe_transform = Some(*seg.get(11)?);
                    }
                }
                0xE0..=0xEF | 0xFE => {}
                0xDA => return self.scan(seg, tables).map(Some),
                // Lossless, arithmetic, hierarchical, DNL...
                _ => return None,
            }
        }
    }

    /// SOF0/1 (baseline, extended Huffman) or SOF2 (progressive), 8-bit.
    fn frame(&mut self, seg: &[u8], progressive: bool) -> Option<()> {
        if self.ncomp != 0 || *seg.first()? != 8 {
            return None;
        }
        self.progressive = progressive;
        self.height = be16(seg, 1)?;
        self.width = be16(seg, 3)?;
        self.ncomp = *seg.get(5)? as usize;
        if self.width == 0 || self.height == 0 || !(self.ncomp == 1 || self.ncomp == 3) {
            return None;
        }
        if self.width > MAX_SIDE as usize || self.height > MAX_SIDE as usize {
            return None;
        }
        for i in 0..self.ncomp {
            let c = seg.get(6 + 3 * i..9 + 3 * i)?;
            let (h, v, tq) = ((c[1] >> 4) as usize, (c[1] & 15) as usize, c[2] as usize);
            if !(1..=4).contains(&h) || !(1..=4).contains(&v) || tq > 3 {
                return None;
            }
            let id = c[0];
            self.comps[i] = Component {
                id,
                h,
                v,
                tq,
                ..Component::default()
            };
        }
        if self.ncomp == 1 {
            // A single-component scan is never interleaved: its MCU is one
            // block whatever the declared factors.
            self.comps[0].h = 1;
            self.comps[0].v = 1;
        }
        let comps = &self.comps[..self.ncomp];
        self.hmax = comps.iter().map(|c| c.h).max()?;
        self.vmax = comps.iter().map(|c| c.v).max()?;
        let ratio_ok = |max: usize, f: usize| max.is_multiple_of(f) && max / f <= 2;
        comps
            .iter()
            .all(|c| ratio_ok(self.hmax, c.h) && ratio_ok(self.vmax, c.v))
            .then_some(())
    }

    fn scan(&mut self, seg: &[u8], tables: &[Table; 8]) -> Option<Scan> {
        if self.ncomp == 0 {
            return None;
        }
        let rgb_ids = self.ncomp == 3
            && self.comps[0].id == b'R'
            && self.comps[1].id == b'G'
            && self.comps[2].id == b'B';
        if self.ncomp == 3 && (self.adobe_transform == Some(0) || rgb_ids) {
            return None;
        }
        let ns = *seg.first()? as usize;
        if !(1..=self.ncomp).contains(&ns) || seg.len() != 4 + 2 * ns {
            return None;
        }
        let tail = &seg[1 + 2 * ns..];
        let (ss, se) = (tail[0] as usize, tail[1] as usize);
        let (ah, al) = ((tail[2] >> 4) as u32, (tail[2] & 15) as u32);
        if self.progressive {
            // DC scans may interleave; AC scans hold one component.
            let dc_ok = ss == 0 && se == 0;
            let ac_ok = ss > 0 && ss <= se && se <= 63 && ns == 1;
            if !(dc_ok || ac_ok) || ah > 13 || al > 13 {
                return None;
            }
        } else if ns != self.ncomp || (ss, se, ah, al) != (0, 63, 0, 0) {
            return None;
        }
        let mut scan = Scan {
            ns,
            order: [0; 3],
            ss,
            se,
            ah,
            al,
        };
        let mut seen = [false; 3];
        for i in 0..ns {
            let (id, sel) = (seg[1 + 2 * i], seg[2 + 2 * i]);
            let ci = self.comps[..self.ncomp].iter().position(|c| c.id == id)?;
            if seen[ci] {
                return None;
            }
            seen[ci] = true;
            let c = &mut self.comps[ci];
            c.td = (sel >> 4) as usize;
            c.ta = (sel & 15) as usize;
            if c.td > 3 || c.ta > 3 || !self.quant_defined[c.tq] {
                return None;
            }
            // The tables this scan reads must exist (DC refinement reads none).
            let needs_dc = ss == 0 && ah == 0;
            let needs_ac = ss > 0 || !self.progressive;
            if (needs_dc && !tables[c.td].defined) || (needs_ac && !tables[4 + c.ta].defined) {
                return None;
            }
            scan.order[i] = ci;
        }
        Some(scan)
    }
}

/// The position of the next marker at or after `pos` that is not a
/// restart marker: where the scan after a partly decoded one resumes.
pub(super) fn skip_to_marker(bytes: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        pos += memchr::memchr(0xFF, bytes.get(pos..)?)?;
        match *bytes.get(pos + 1)? {
            0x00 | 0xD0..=0xD7 | 0xFF => pos += 1,
            _ => return Some(pos),
        }
    }
}
