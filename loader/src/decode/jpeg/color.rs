//! Chroma upsampling and YCbCr to RGB for one output row.
//!
//! Upsampling is libjpeg's "fancy" (triangle) filter, the default of
//! libjpeg, libjpeg-turbo and so of PIL and torchvision: each output sample
//! weighs the nearest input sample 3/4 and the next nearest 1/4 per axis.
//! Neighbours past the edge of the image repeat the edge sample, as libjpeg
//! does; inside the image they must be decoded (the caller decodes a margin).

use super::markers::Header;
use super::{Geometry, Scratch, Window};

/// One component's decoded samples and where they sit in the image.
pub(super) struct Plane<'a> {
    pub(super) samples: &'a [u8],
    /// Samples per row of `samples`.
    pub(super) stride: usize,
    /// Component coordinates of `samples[0]`.
    pub(super) x0: usize,
    pub(super) y0: usize,
    /// One past the last valid component column and row (the decoded part
    /// that lies inside the image).
    pub(super) x_end: usize,
    pub(super) y_end: usize,
    /// Image pixels per component sample: 1 or 2.
    pub(super) fx: usize,
    pub(super) fy: usize,
    /// The component is more than 2 samples wide in the whole image.
    /// libjpeg upsamples a horizontally subsampled component of at most 2
    /// samples by replication instead of the triangle filter
    /// (`jinit_upsampler`: `downsampled_width > 2`), in both axes.
    pub(super) fancy: bool,
}

impl Plane<'_> {
    fn row(&self, cy: usize) -> &[u8] {
        let start = (cy - self.y0) * self.stride;
        &self.samples[start..start + self.stride]
    }

    /// The full-resolution samples of image row `y`, columns `x..x + len`:
    /// the plane's own row where the component is not subsampled (no
    /// copy: that was 7% of a large photo's decode), else upsampled into
    /// `wide`; `sums` is scratch.
    #[inline(always)]
    pub(super) fn upsample_row<'a>(
        &'a self,
        y: usize,
        x: usize,
        len: usize,
        sums: &mut Vec<u16>,
        wide: &'a mut Vec<u8>,
    ) -> &'a [u8] {
        let cy = y / self.fy;
        if self.fx == 1 && self.fy == 1 {
            let start = x - self.x0;
            return &self.row(cy)[start..start + len];
        }
        if self.fx == 2 && !self.fancy {
            // libjpeg's h2v1_upsample / h2v2_upsample: each sample repeated.
            let row = self.row(cy);
            wide.clear();
            wide.extend((x..x + len).map(|i| row[i / 2 - self.x0]));
            return wide;
        }
        // Column sums over the component columns the row needs, one
        // neighbour either side, on a x4 scale.
        let first = (x / self.fx).saturating_sub(1).max(self.x0);
        let last = ((x + len - 1) / self.fx + 1).min(self.x_end - 1);
        let near = &self.row(cy)[first - self.x0..=last - self.x0];
        sums.clear();
        if self.fy == 2 {
            let far = if y.is_multiple_of(2) {
                cy.saturating_sub(1).max(self.y0)
            } else {
                (cy + 1).min(self.y_end - 1)
            };
            let far = &self.row(far)[first - self.x0..=last - self.x0];
            sums.extend(near.iter().zip(far).map(|(&a, &b)| 3 * a as u16 + b as u16));
        } else {
            sums.extend(near.iter().map(|&a| 4 * a as u16));
        }
        if self.fx == 1 {
            wide.clear();
            wide.extend(
                sums[x - first..][..len]
                    .iter()
                    .map(|&v| ((v + 2) >> 2) as u8),
            );
            return wide;
        }
        // Both output pixels of every component column in `first..=last`,
        // then the part the caller asked for. libjpeg's rounding: h2v1
        // adds 1 and 2 (x4 scale), h2v2 8 and 7 (x16).
        let (even, odd) = if self.fy == 2 { (8, 7) } else { (4, 8) };
        let n = sums.len();
        wide.clear();
        wide.resize(2 * n, 0);
        let px = |c: u16, nb: u16, bias: u16| ((3 * c + nb + bias) >> 4) as u8;
        wide[0] = px(sums[0], sums[0], even);
        wide[2 * n - 1] = px(sums[n - 1], sums[n - 1], odd);
        if n > 1 {
            wide[1] = px(sums[0], sums[1], odd);
            wide[2 * n - 2] = px(sums[n - 1], sums[n - 2], even);
            // The columns between the edges (none for n = 2; with n = 1,
            // a one-sample row, both outputs are the edge's, set above).
            for (pair, w) in wide[2..2 * n - 2].chunks_exact_mut(2).zip(sums.windows(3)) {
                pair[0] = px(w[1], w[0], even);
                pair[1] = px(w[1], w[2], odd);
            }
        }
        let start = x - 2 * first;
        &wide[start..start + len]
    }
}

/// JFIF YCbCr to packed RGB, in 16-bit fixed point exactly as libjpeg's
/// `ycc_rgb_convert` (`jdcolor.c`) does: with AVX2 16 pixels at a time
/// (`ycc_avx2`), the rest here.
#[inline(always)]
pub(super) fn ycbcr_to_rgb(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2 (detected just above).
        let k = unsafe { super::ycc_avx2::ycbcr_to_rgb(y, cb, cr, out) };
        return ycbcr_to_rgb_portable(&y[k..], &cb[k..], &cr[k..], &mut out[k * 3..]);
    }
    ycbcr_to_rgb_portable(y, cb, cr, out)
}

/// [`ycbcr_to_rgb`] in plain Rust.
#[inline(always)]
fn ycbcr_to_rgb_portable(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
    const R_CR: i32 = 91_881; // FIX(1.40200)
    const G_CB: i32 = 22_554; // FIX(0.34414)
    const G_CR: i32 = 46_802; // FIX(0.71414)
    const B_CB: i32 = 116_130; // FIX(1.77200)
    const HALF: i32 = 1 << 15;
    const N: usize = 16;
    // libjpeg's rounding: each term is `(c * FIX(k) + ONE_HALF) >> 16`,
    // green's with both products negated inside the shift.
    #[inline(always)]
    fn rgb(y: u8, cb: u8, cr: u8) -> [u8; 3] {
        let (y, cb, cr) = (y as i32, cb as i32 - 128, cr as i32 - 128);
        [
            (y + ((R_CR * cr + HALF) >> 16)).clamp(0, 255) as u8,
            (y + ((HALF - G_CB * cb - G_CR * cr) >> 16)).clamp(0, 255) as u8,
            (y + ((B_CB * cb + HALF) >> 16)).clamp(0, 255) as u8,
        ]
    }
    // Whole chunks of pixels at a time (vectorised), then the rest.
    let chunks = y.len().min(cb.len()).min(cr.len()).min(out.len() / 3) / N;
    for i in 0..chunks {
        let (y, cb, cr) = (&y[i * N..][..N], &cb[i * N..][..N], &cr[i * N..][..N]);
        let mut px = [[0u8; 3]; N];
        for j in 0..N {
            px[j] = rgb(y[j], cb[j], cr[j]);
        }
        out[i * N * 3..][..N * 3].copy_from_slice(px.as_flattened());
    }
    let k = chunks * N;
    for (((o, &y), &cb), &cr) in out[k * 3..]
        .chunks_exact_mut(3)
        .zip(&y[k..])
        .zip(&cb[k..])
        .zip(&cr[k..])
    {
        o.copy_from_slice(&rgb(y, cb, cr));
    }
}

/// Gray to packed RGB.
#[inline(always)]
pub(super) fn gray_to_rgb(y: &[u8], out: &mut [u8]) {
    for (rgb, &v) in out.chunks_exact_mut(3).zip(y) {
        rgb.fill(v);
    }
}

/// Upsampling and colour conversion of the window's rows into `out`.
#[inline(always)]
pub(super) fn convert(h: &Header, g: &Geometry, win: Window, s: &mut Scratch, out: &mut Vec<u8>) {
    let (ww, wh) = (win.width(), win.height());
    if out.len() < ww * wh * 3 {
        out.resize(ww * wh * 3, 0);
    }
    let planes: [Plane; 3] = std::array::from_fn(|i| {
        let i = i.min(h.ncomp - 1);
        let c = &h.comps[i];
        let b = g.block[i];
        let (x0, y0) = (g.mcu_x0 * c.h * b, g.mcu_y0 * c.v * b);
        // The component's size at its scale: image pixels (at the image's
        // scale) per sample are `fx x fy`.
        let (fx, fy) = (
            h.hmax * g.block[0] / (c.h * b),
            h.vmax * g.block[0] / (c.v * b),
        );
        let (pw, ph) = g.planes[i];
        Plane {
            samples: &s.planes[i],
            stride: pw,
            x0,
            y0,
            x_end: (x0 + pw).min(g.width.div_ceil(fx)),
            y_end: (y0 + ph).min(g.height.div_ceil(fy)),
            fx,
            fy,
            fancy: g.width.div_ceil(fx) > 2,
        }
    });
    let [r0, r1, r2] = &mut s.rows;
    let sums = &mut s.sums;
    for (y, dst) in (win.y0..win.y1).zip(out.chunks_exact_mut(ww * 3)) {
        let luma = planes[0].upsample_row(y, win.x0, ww, sums, r0);
        if h.ncomp == 1 {
            gray_to_rgb(luma, dst);
        } else {
            let cb = planes[1].upsample_row(y, win.x0, ww, sums, r1);
            let cr = planes[2].upsample_row(y, win.x0, ww, sums, r2);
            ycbcr_to_rgb(luma, cb, cr, dst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole `width x height` component subsampled by `(fx, fy)`.
    fn plane(
        samples: &[u8],
        (width, height): (usize, usize),
        (fx, fy): (usize, usize),
        fancy: bool,
    ) -> Plane<'_> {
        Plane {
            samples,
            stride: width,
            x0: 0,
            y0: 0,
            x_end: width,
            y_end: height,
            fx,
            fy,
            fancy,
        }
    }

    #[test]
    fn h2v1_matches_libjpeg() {
        // libjpeg h2v1_fancy_upsample on [10, 50, 90]:
        // 10, (30+50+2)/4=20... edges repeat.
        let samples = [10u8, 50, 90];
        let p = plane(&samples, (3, 1), (2, 1), true);
        let (mut sums, mut wide) = (Vec::new(), Vec::new());
        let out = p.upsample_row(0, 0, 6, &mut sums, &mut wide);
        // even: (3*c + left + 1) / 4, odd: (3*c + right + 2) / 4
        assert_eq!(out, [10, 20, 40, 60, 80, 90]);
        let part = p.upsample_row(0, 2, 3, &mut sums, &mut wide);
        assert_eq!(part, [40, 60, 80]);
    }

    #[test]
    fn components_at_most_two_samples_wide_are_replicated_as_libjpeg_does() {
        // A 3 or 4 pixel wide 4:2:0 image: 2 chroma samples per row.
        let samples = [0u8, 160, 80, 240];
        let p = plane(&samples, (2, 2), (2, 2), false);
        let (mut sums, mut wide) = (Vec::new(), Vec::new());
        for (y, want) in [[0, 0, 160, 160], [0, 0, 160, 160], [80, 80, 240, 240]]
            .iter()
            .enumerate()
        {
            let out = p.upsample_row(y, 0, 4, &mut sums, &mut wide);
            assert_eq!(out, want, "row {y}");
        }
        assert_eq!(p.upsample_row(3, 3, 1, &mut sums, &mut wide), [240]);
    }

    #[test]
    fn h2v2_weighs_the_nearer_row() {
        let samples = [0u8, 0, 160, 160];
        // As a window of a wider component: the triangle filter.
        let p = plane(&samples, (2, 2), (2, 2), true);
        let (mut sums, mut wide) = (Vec::new(), Vec::new());
        let mut row = |y| p.upsample_row(y, 0, 4, &mut sums, &mut wide).to_vec();
        assert_eq!(row(0), [0; 4], "row 0 repeats the edge above");
        assert_eq!(row(1), [40; 4], "row 1: 3/4 of row 0, 1/4 of row 1");
        assert_eq!(row(2), [120; 4]);
        assert_eq!(row(3), [160; 4]);
    }

    /// libjpeg's `ycc_rgb_convert` with its tables (`build_ycc_rgb_table`).
    fn libjpeg(y: u8, cb: u8, cr: u8) -> [u8; 3] {
        let fix = |k: f64| (k * 65536.0 + 0.5) as i32;
        let (y, cb, cr) = (y as i32, cb as i32 - 128, cr as i32 - 128);
        let r = y + ((fix(1.40200) * cr + (1 << 15)) >> 16);
        let g = y + ((-fix(0.34414) * cb + (1 << 15) + -fix(0.71414) * cr) >> 16);
        let b = y + ((fix(1.77200) * cb + (1 << 15)) >> 16);
        [r, g, b].map(|v| v.clamp(0, 255) as u8)
    }

    #[test]
    fn ycbcr_matches_libjpeg_for_every_chroma_pair() {
        // Every (cb, cr) with luma sweeping its range, in rows of a length
        // that leaves a tail after the 16-pixel groups, at offsets that
        // misalign them.
        let n = 256 * 256;
        let luma: Vec<u8> = (0..n).map(|i| (i * 37 + i / 256) as u8).collect();
        let cb: Vec<u8> = (0..n).map(|i| (i / 256) as u8).collect();
        let cr: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let want: Vec<u8> = (0..n)
            .flat_map(|i| libjpeg(luma[i], cb[i], cr[i]))
            .collect();
        for start in [0, 5] {
            let mut fast = vec![0u8; n * 3];
            let mut portable = vec![0u8; n * 3];
            for at in (start..n).step_by(1001) {
                let end = (at + 1001).min(n);
                ycbcr_to_rgb(
                    &luma[at..end],
                    &cb[at..end],
                    &cr[at..end],
                    &mut fast[at * 3..],
                );
                ycbcr_to_rgb_portable(
                    &luma[at..end],
                    &cb[at..end],
                    &cr[at..end],
                    &mut portable[at * 3..],
                );
            }
            let s = start * 3;
            assert!(fast[s..] == want[s..], "dispatched, from {start}");
            assert!(portable[s..] == want[s..], "portable, from {start}");
        }
        // A neutral pixel stays neutral (an earlier rounding made it green).
        assert_eq!(libjpeg(128, 128, 128), [128; 3]);
    }

    #[test]
    fn ycbcr_primaries() {
        let mut out = [0u8; 9];
        ycbcr_to_rgb(&[76, 150, 29], &[85, 44, 255], &[255, 21, 107], &mut out);
        let want = [254, 0, 0, 0, 255, 1, 0, 0, 254];
        for (g, w) in out.iter().zip(want) {
            assert!(g.abs_diff(w) <= 1, "{out:?}");
        }
    }
}
