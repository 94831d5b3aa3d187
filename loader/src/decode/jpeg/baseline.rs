//! Baseline (sequential) scans: each MCU's blocks decoded, dequantized and
//! inverse-transformed straight into the planes, rows outside the window
//! skipped.

use super::huffman::Bits;
use super::markers::{Header, Scan};
use super::{idct, Geometry, Scratch};

/// The one scan of a baseline JPEG, down to the window's last MCU row;
/// only blocks inside the window are inverse-transformed, and restart
/// intervals without any are skipped undecoded.
#[inline(always)]
pub(super) fn baseline<M: idct::Madd>(
    data: &[u8],
    scan: &Scan,
    h: &Header,
    s: &mut Scratch,
    g: &Geometry,
) -> Option<()> {
    let quant: [idct::Quant; 4] = std::array::from_fn(|i| idct::Quant::new(&h.quant[i]));
    let tables = &s.tables;
    let mut bits = Bits::new(data);
    let mut pred = [0i32; 3];
    let mut coef = [0i16; 64];
    let mut left = 0;
    let total = g.mcu_y1 * g.mcus_x;
    let (mut mcu_x, mut mcu_y) = (0, 0);
    while mcu_y < g.mcu_y1 {
        if h.restart > 0 {
            if left == 0 {
                let start = mcu_y * g.mcus_x + mcu_x;
                if start > 0 {
                    if !bits.restart() {
                        return None;
                    }
                    pred = [0; 3];
                }
                // An interval none of whose MCUs the window needs is not
                // decoded: the predictors restart after it, so its data is
                // skipped to the next marker (or decoding ends, when no MCU
                // after it is needed either).
                let end = start + h.restart;
                if !g.meets(start, end) {
                    if end >= total {
                        break;
                    }
                    bits.skip_to_restart()?;
                    mcu_x += h.restart;
                    mcu_y += mcu_x / g.mcus_x;
                    mcu_x %= g.mcus_x;
                    continue;
                }
                left = h.restart;
            }
            left -= 1;
        }
        let inside = mcu_y >= g.mcu_y0 && mcu_x >= g.mcu_x0 && mcu_x < g.mcu_x1;
        for (si, &ci) in scan.order[..scan.ns].iter().enumerate() {
            let c = &h.comps[ci];
            let (dc, ac) = (&tables[c.td], &tables[4 + c.ta]);
            let stride = g.planes[ci].0;
            for by in 0..c.v {
                for bx in 0..c.h {
                    if !inside {
                        bits.block::<false>(dc, ac, &mut pred[si], &mut coef)?;
                        continue;
                    }
                    let last = bits.block::<true>(dc, ac, &mut pred[si], &mut coef)?;
                    let x = ((mcu_x - g.mcu_x0) * c.h + bx) * g.block[ci];
                    let y = ((mcu_y - g.mcu_y0) * c.v + by) * g.block[ci];
                    let plane = &mut s.planes[ci][y * stride + x..];
                    let (rows, cols) = idct::extent(last);
                    let q = &quant[c.tq];
                    match &g.reduced[ci] {
                        None => idct::block::<M>(&coef, q, rows, cols, plane, stride),
                        Some(r) => r.block::<M>(&coef, &q.plain, rows, cols, plane, stride),
                    }
                    // All of it: a fixed size is four vector stores, a
                    // variable one (its first `rows` rows) a memset call
                    // that was 2-5% of a scaled decode.
                    coef = [0; 64];
                }
            }
        }
        mcu_x += 1;
        if mcu_x == g.mcus_x {
            mcu_x = 0;
            mcu_y += 1;
        }
    }
    bits.intact().then_some(())
}
