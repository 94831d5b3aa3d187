//! The four kinds of progressive scan (ITU T.81 G.1.2): DC first and
//! refinement, AC first and refinement with end-of-band runs. Coefficients
//! accumulate in zigzag order in the block they belong to, so refinement
//! finds the non-zero ones of a band with a bit mask instead of a walk.

use super::huffman::{Bits, Table};
use super::markers::{Header, Scan};
use super::{idct, Geometry, Scratch};

/// Per-scan state: DC predictors and the end-of-band run.
#[derive(Default)]
pub(super) struct State {
    pub(super) pred: [i32; 3],
    pub(super) eobrun: u32,
}

fn shifted(v: i32, al: u32) -> i16 {
    (v << al).clamp(i16::MIN as i32, i16::MAX as i32) as i16
}

impl Bits<'_> {
    /// DC first scan: the difference to the predictor, shifted up by `al`.
    #[inline(always)]
    pub(super) fn dc_first(
        &mut self,
        dc: &Table,
        pred: &mut i32,
        coef: &mut i16,
        al: u32,
    ) -> Option<()> {
        self.ensure();
        let size = self.symbol(dc)? as u32;
        if size > 15 {
            return None;
        }
        *pred = (*pred + self.receive_extend(size)).clamp(-(1 << 15), 1 << 15);
        *coef = shifted(*pred, al);
        Some(())
    }

    /// DC refinement: one more bit of the DC coefficient.
    #[inline(always)]
    pub(super) fn dc_refine(&mut self, coef: &mut i16, al: u32) {
        self.ensure();
        if self.bits(1) == 1 {
            *coef |= (1i32 << al) as i16;
        }
    }

    /// AC first scan over zigzag positions `ss..=se`.
    #[inline(always)]
    pub(super) fn ac_first(
        &mut self,
        ac: &Table,
        coef: &mut [i16; 64],
        (ss, se, al): (usize, usize, u32),
        eobrun: &mut u32,
    ) -> Option<()> {
        if *eobrun > 0 {
            *eobrun -= 1;
            return Some(());
        }
        let mut k = ss;
        while k <= se {
            self.ensure();
            let rs = self.symbol(ac)? as u32;
            let (run, size) = ((rs >> 4) as usize, rs & 15);
            if size == 0 {
                if run < 15 {
                    *eobrun = (1 << run) - 1 + self.bits(run as u32);
                    break;
                }
                k += 16;
                continue;
            }
            k += run;
            if k > se {
                return None;
            }
            coef[k] = shifted(self.receive_extend(size), al);
            k += 1;
        }
        Some(())
    }

    /// AC refinement: a correction bit for every coefficient already
    /// non-zero, and new coefficients of magnitude `1 << al`.
    #[inline(always)]
    pub(super) fn ac_refine(
        &mut self,
        ac: &Table,
        coef: &mut [i16; 64],
        (ss, se, al): (usize, usize, u32),
        eobrun: &mut u32,
    ) -> Option<()> {
        let (p1, m1) = (1i16 << al, (-1i16) << al);
        // One correction bit per non-zero coefficient in `mask`, in order:
        // a set bit grows its magnitude.
        let correct = |bits: &mut Self, coef: &mut [i16; 64], mut mask: u64| {
            while mask != 0 {
                let c = &mut coef[mask.trailing_zeros() as usize];
                bits.ensure();
                if bits.bits(1) == 1 && *c & p1 == 0 {
                    *c = c.saturating_add(if *c >= 0 { p1 } else { m1 });
                }
                mask &= mask - 1;
            }
        };
        let mut nonzero = nonzero_mask(coef);
        let mut k = ss;
        if *eobrun == 0 {
            while k <= se {
                self.ensure();
                let rs = self.symbol(ac)? as u32;
                let (run, size) = (rs >> 4, rs & 15);
                let mut value = 0i16;
                if size != 0 {
                    if size != 1 {
                        return None;
                    }
                    value = if self.bits(1) == 1 { p1 } else { m1 };
                } else if run != 15 {
                    *eobrun = (1 << run) + self.bits(run);
                    break;
                }
                // Skip `run` zero coefficients, correcting the non-zero ones
                // on the way; the new value goes in the zero after them.
                let band = band(k, se);
                let mut zeros = !nonzero & band;
                for _ in 0..run {
                    zeros &= zeros.wrapping_sub(1);
                }
                let stop = if zeros == 0 {
                    se + 1
                } else {
                    zeros.trailing_zeros() as usize
                };
                let below = if stop > 63 { u64::MAX } else { (1 << stop) - 1 };
                correct(self, coef, nonzero & band & below);
                k = stop;
                if value != 0 {
                    if k > se {
                        return None;
                    }
                    coef[k] = value;
                    nonzero |= 1 << k;
                }
                k += 1;
            }
        }
        if *eobrun > 0 {
            // Inside an end-of-band run: only corrections are left.
            if k <= se {
                correct(self, coef, nonzero & band(k, se));
            }
            *eobrun -= 1;
        }
        Some(())
    }
}

/// Bit `i` set where `coef[i]` is non-zero.
#[inline(always)]
fn nonzero_mask(coef: &[i16; 64]) -> u64 {
    let mut mask = 0u64;
    for (i, &c) in coef.iter().enumerate() {
        mask |= u64::from(c != 0) << i;
    }
    mask
}

/// Bits `k..=se` (`k <= se <= 63`).
#[inline(always)]
fn band(k: usize, se: usize) -> u64 {
    (u64::MAX >> (63 - se)) & (u64::MAX << k)
}

/// Every scan of a progressive JPEG, each down to the window's last MCU
/// row, then the inverse transform of the window's blocks.
#[inline(always)]
pub(super) fn progressive<M: idct::Madd>(
    bytes: &[u8],
    mut pos: usize,
    first: Scan,
    h: &mut Header,
    s: &mut Scratch,
    g: &Geometry,
) -> Option<()> {
    for (coefs, c) in s.coefs.iter_mut().zip(&h.comps[..h.ncomp]) {
        coefs.clear();
        coefs.resize(g.mcus_x * c.h * g.mcu_y1 * c.v * 64, 0);
    }
    let mut scan = first;
    loop {
        let mut bits = Bits::new(bytes.get(pos..)?);
        progressive_scan(&mut bits, &scan, h, s, g)?;
        pos = super::markers::skip_to_marker(bytes, pos + bits.position())?;
        match h.next_scan(bytes, &mut pos, &mut s.tables)? {
            Some(next) => scan = next,
            None => break,
        }
    }
    let quant: [idct::Quant; 4] = std::array::from_fn(|i| idct::Quant::new(&h.quant[i]));
    for (ci, c) in h.comps[..h.ncomp].iter().enumerate() {
        let blocks_x = g.mcus_x * c.h;
        let stride = g.planes[ci].0;
        for by in g.mcu_y0 * c.v..g.mcu_y1 * c.v {
            for bx in g.mcu_x0 * c.h..g.mcu_x1 * c.h {
                let at = (by * blocks_x + bx) * 64;
                let zigzag = s.coefs[ci].get(at..at + 64)?;
                let last = zigzag.iter().rposition(|&v| v != 0).unwrap_or(0);
                let mut coef = [0i16; 64];
                for (&n, &v) in super::huffman::ZIGZAG.iter().zip(&zigzag[..=last]) {
                    coef[n as usize] = v;
                }
                let (rows, cols) = idct::extent(last);
                let x = (bx - g.mcu_x0 * c.h) * g.block[ci];
                let y = (by - g.mcu_y0 * c.v) * g.block[ci];
                let plane = &mut s.planes[ci][y * stride + x..];
                match &g.reduced[ci] {
                    None => idct::block::<M>(&coef, &quant[c.tq], rows, cols, plane, stride),
                    Some(r) => r.block::<M>(&coef, &quant[c.tq].plain, rows, cols, plane, stride),
                }
            }
        }
    }
    Some(())
}

/// One progressive scan, down to the window's last MCU row.
#[inline(always)]
pub(super) fn progressive_scan(
    bits: &mut Bits,
    scan: &Scan,
    h: &Header,
    s: &mut Scratch,
    g: &Geometry,
) -> Option<()> {
    let tables = &s.tables;
    let mut state = State::default();
    let mut left = h.restart;
    let mut restart = |bits: &mut Bits, state: &mut State| {
        if h.restart > 0 {
            if left == 0 {
                if !bits.restart() {
                    return None;
                }
                *state = State::default();
                left = h.restart;
            }
            left -= 1;
        }
        Some(())
    };
    if scan.ns > 1 {
        // Interleaved (DC only): MCUs as in a baseline scan.
        for mcu_y in 0..g.mcu_y1 {
            for mcu_x in 0..g.mcus_x {
                restart(bits, &mut state)?;
                for si in 0..scan.ns {
                    let ci = scan.order[si];
                    let c = &h.comps[ci];
                    for by in 0..c.v {
                        for bx in 0..c.h {
                            let (x, y) = (mcu_x * c.h + bx, mcu_y * c.v + by);
                            let coef = block(&mut s.coefs[ci], g.mcus_x * c.h, x, y)?;
                            scan_block(bits, scan, h, tables, &mut state, si, coef)?;
                        }
                    }
                }
            }
        }
    } else {
        // One component: its own block grid, one block per MCU.
        let ci = scan.order[0];
        let c = &h.comps[ci];
        let cols = (h.width * c.h).div_ceil(h.hmax).div_ceil(8);
        let rows = (h.height * c.v)
            .div_ceil(h.vmax)
            .div_ceil(8)
            .min(g.mcu_y1 * c.v);
        for y in 0..rows {
            for x in 0..cols {
                restart(bits, &mut state)?;
                let coef = block(&mut s.coefs[ci], g.mcus_x * c.h, x, y)?;
                scan_block(bits, scan, h, tables, &mut state, 0, coef)?;
            }
        }
    }
    bits.intact().then_some(())
}

/// One block's part of a progressive scan; `si`: the component's place in
/// the scan.
#[inline(always)]
pub(super) fn scan_block(
    bits: &mut Bits,
    scan: &Scan,
    h: &Header,
    tables: &[Table; 8],
    state: &mut State,
    si: usize,
    coef: &mut [i16; 64],
) -> Option<()> {
    let (ss, se, al) = (scan.ss, scan.se, scan.al);
    let c = &h.comps[scan.order[si]];
    let (dc, ac) = (&tables[c.td], &tables[4 + c.ta]);
    match (ss == 0, scan.ah == 0) {
        (true, true) => bits.dc_first(dc, &mut state.pred[si], &mut coef[0], al),
        (true, false) => {
            bits.dc_refine(&mut coef[0], al);
            Some(())
        }
        (false, true) => bits.ac_first(ac, coef, (ss, se, al), &mut state.eobrun),
        (false, false) => bits.ac_refine(ac, coef, (ss, se, al), &mut state.eobrun),
    }
}

/// Block `(bx, by)` of a component whose block rows are `blocks_x` long.
#[inline(always)]
pub(super) fn block(
    coefs: &mut [i16],
    blocks_x: usize,
    bx: usize,
    by: usize,
) -> Option<&mut [i16; 64]> {
    let at = (by * blocks_x + bx) * 64;
    coefs.get_mut(at..at + 64)?.try_into().ok()
}
