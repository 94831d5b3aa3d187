//! The four kinds of progressive scan (ITU T.81 G.1.2): DC first and
//! refinement, AC first and refinement with end-of-band runs. Coefficients
//! accumulate in natural order in the block they belong to.

use super::huffman::{Bits, Table, ZIGZAG};

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
    #[inline(always)]
    fn ensure(&mut self) {
        if self.buffered() < 32 {
            self.refill();
        }
    }

    /// DC first scan: the difference to the predictor, shifted up by `al`.
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
    pub(super) fn dc_refine(&mut self, coef: &mut i16, al: u32) {
        self.ensure();
        if self.bits(1) == 1 {
            *coef |= (1i32 << al) as i16;
        }
    }

    /// AC first scan over zigzag positions `ss..=se`.
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
            coef[ZIGZAG[k] as usize] = shifted(self.receive_extend(size), al);
            k += 1;
        }
        Some(())
    }

    /// AC refinement: a correction bit for every coefficient already
    /// non-zero, and new coefficients of magnitude `1 << al`.
    pub(super) fn ac_refine(
        &mut self,
        ac: &Table,
        coef: &mut [i16; 64],
        (ss, se, al): (usize, usize, u32),
        eobrun: &mut u32,
    ) -> Option<()> {
        let (p1, m1) = (1i16 << al, (-1i16) << al);
        // A correction bit for a non-zero coefficient: grow its magnitude.
        let correct = |bits: &mut Self, c: &mut i16| {
            bits.ensure();
            if bits.bits(1) == 1 && *c & p1 == 0 {
                *c = c.saturating_add(if *c >= 0 { p1 } else { m1 });
            }
        };
        let mut k = ss;
        if *eobrun == 0 {
            while k <= se {
                self.ensure();
                let rs = self.symbol(ac)? as u32;
                let (mut run, size) = ((rs >> 4) as i32, rs & 15);
                let mut value = 0i16;
                if size != 0 {
                    if size != 1 {
                        return None;
                    }
                    value = if self.bits(1) == 1 { p1 } else { m1 };
                } else if run != 15 {
                    *eobrun = (1 << run) + self.bits(run as u32);
                    break;
                }
                // Skip `run` zero coefficients, correcting non-zero ones on
                // the way; the new value goes in the next zero.
                while k <= se {
                    let c = &mut coef[ZIGZAG[k] as usize];
                    if *c != 0 {
                        correct(self, c);
                    } else {
                        if run == 0 {
                            break;
                        }
                        run -= 1;
                    }
                    k += 1;
                }
                if value != 0 {
                    if k > se {
                        return None;
                    }
                    coef[ZIGZAG[k] as usize] = value;
                }
                k += 1;
            }
        }
        if *eobrun > 0 {
            // Inside an end-of-band run: only corrections are left.
            while k <= se {
                let c = &mut coef[ZIGZAG[k] as usize];
                if *c != 0 {
                    correct(self, c);
                }
                k += 1;
            }
            *eobrun -= 1;
        }
        Some(())
    }
}
