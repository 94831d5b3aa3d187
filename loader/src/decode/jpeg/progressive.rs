//! The four kinds of progressive scan (ITU T.81 G.1.2): DC first and
//! refinement, AC first and refinement with end-of-band runs. Coefficients
//! accumulate in zigzag order in the block they belong to, so refinement
//! finds the non-zero ones of a band with a bit mask instead of a walk.

use super::huffman::{Bits, Table};

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
