//! Baseline (sequential) scans: each MCU's blocks decoded, dequantized and
//! inverse-transformed straight into the planes, rows outside the window
//! skipped.

use super::huffman::Bits;
use super::markers::{Header, Scan};
use super::{idct, Geometry, Scratch};

/// Blocks with skipped coefficients from which a scan's AC tables get their
/// skip entries: about where building them costs less than it saves.
const SKIP_TABLE_BLOCKS: usize = 4096;

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
    // Skip entries pay for their building (a few microseconds a table)
    // only where thousands of blocks have coefficients skipped: outside the
    // window, or anywhere at a reduced scale.
    let (mcus, window) = (
        g.mcu_y1 * g.mcus_x,
        (g.mcu_y1 - g.mcu_y0) * (g.mcu_x1 - g.mcu_x0),
    );
    let scanned = &scan.order[..scan.ns];
    let skipped: usize = scanned
        .iter()
        .map(|&ci| {
            let c = &h.comps[ci];
            c.h * c.v
                * if g.reduced[ci].is_some() {
                    mcus
                } else {
                    mcus - window
                }
        })
        .sum();
    if skipped >= SKIP_TABLE_BLOCKS {
        for &ci in scanned {
            s.tables[4 + h.comps[ci].ta].prepare_skip();
        }
    }
    let tables = &s.tables;
    // The coefficients each component's transform reads: the rest of a
    // block is skipped, not stored.
    let kmax: [usize; 3] = std::array::from_fn(|i| g.reduced[i].as_ref().map_or(63, |r| r.kmax));
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
                        bits.block::<false>(dc, ac, &mut pred[si], &mut coef, 0)?;
                        continue;
                    }
                    let last = bits.block::<true>(dc, ac, &mut pred[si], &mut coef, kmax[ci])?;
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
