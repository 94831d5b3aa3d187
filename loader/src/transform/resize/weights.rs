//! One axis's resampling filter: Pillow's antialiased bilinear weights,
//! in fixed point, with every tap inside the axis.

use std::ops::Range;

/// One axis's filter: output `i` reads `taps` samples from `start[i]` with
/// weights `weights[i * taps..][..taps]` (fixed point, `precision` bits).
/// Starts are moved left, with leading zero weights, so every tap lies
/// inside the axis whenever the axis is at least `taps` long.
#[derive(Debug, Default)]
pub(super) struct Axis {
    pub(super) start: Vec<usize>,
    pub(super) weights: Vec<i16>,
    /// Pillow's floating-point weights, before fixed point.
    pub(super) raw: Vec<f64>,
    pub(super) taps: usize,
    pub(super) precision: u32,
}

impl Axis {
    /// Pillow's `precompute_coeffs` for the source range `[in0, in1)` of an
    /// axis `size` samples long onto `out` samples, outputs in reverse order
    /// if `reverse`, taps padded by `pad` (Pillow's maximum in, the
    /// padded count out).
    pub(super) fn build(
        &mut self,
        size: usize,
        (in0, in1): (f64, f64),
        out: usize,
        reverse: bool,
        pad: fn(usize) -> usize,
    ) {
        let scale = (in1 - in0) / out as f64;
        let filter_scale = scale.max(1.0);
        // The triangle filter's support is 1, stretched by the downscale.
        let support = filter_scale;
        let inv = 1.0 / filter_scale;
        let ksize = support.ceil() as usize * 2 + 1;
        let taps = pad(ksize);
        self.taps = taps;
        self.start.clear();
        self.raw.clear();
        self.raw.resize(out * taps, 0.0);
        let mut max = 0f64;
        for (d, row) in self.raw.chunks_exact_mut(taps).enumerate() {
            let i = if reverse { out - 1 - d } else { d };
            let center = in0 + (i as f64 + 0.5) * scale;
            // `as` truncates toward zero, as Pillow's `(int)` cast does.
            let lo = ((center - support + 0.5) as i64).clamp(0, size as i64) as usize;
            let hi = ((center + support + 0.5) as i64).clamp(0, size as i64) as usize;
            let n = hi.saturating_sub(lo).min(ksize);
            let mut sum = 0.0;
            for (x, w) in row[..n].iter_mut().enumerate() {
                let t = ((x + lo) as f64 - center + 0.5) * inv;
                *w = (1.0 - t.abs()).max(0.0);
                sum += *w;
            }
            if sum != 0.0 {
                row[..n].iter_mut().for_each(|w| *w /= sum);
            }
            let start = if size >= taps {
                lo.min(size - taps)
            } else {
                lo
            };
            let shift = lo - start;
            row.copy_within(..n, shift);
            row[..shift].fill(0.0);
            max = row.iter().fold(max, |m, &w| m.max(w));
            self.start.push(start);
        }
        let mut precision = 22;
        // Pillow's rounding of the (non-negative) weights: `(int)(0.5 + w * one)`.
        let fixed = |w: f64, one: f64| (0.5 + w * one) as i32;
        while precision > 0 && fixed(max, f64::from(1u32 << precision)) > i32::from(i16::MAX) {
            precision -= 1;
        }
        self.precision = precision;
        let one = f64::from(1u32 << precision);
        self.weights.clear();
        self.weights
            .extend(self.raw.iter().map(|&w| fixed(w, one) as i16));
    }

    #[inline]
    pub(super) fn weights(&self, i: usize) -> &[i16] {
        &self.weights[i * self.taps..][..self.taps]
    }

    /// The samples the outputs read: from the first start to the last tap,
    /// clipped to an axis `size` long.
    #[inline]
    pub(super) fn reach(&self, size: usize) -> Range<usize> {
        let lo = self.start.iter().copied().min().unwrap_or(0);
        let hi = self.start.iter().map(|s| s + self.taps).max().unwrap_or(0);
        lo.min(size)..hi.min(size)
    }

    /// `acc >> precision`, clamped to a byte.
    #[inline]
    pub(super) fn byte(&self, acc: i32) -> u8 {
        (acc >> self.precision).clamp(0, 255) as u8
    }

    /// The accumulator's start value: one half, for rounding.
    #[inline]
    pub(super) fn half(&self) -> i32 {
        (1 << self.precision) >> 1
    }
}
