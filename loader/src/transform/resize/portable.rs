//! The portable resampling kernels (any CPU), and the AVX2 dispatch of
//! the horizontal pass.

use super::{Axis, View};
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::avx2;

/// The horizontal pass's tap count for at most `ksize` taps: whole groups
/// of the AVX2 kernel, which reads up to five pixels per load (four when
/// four are enough).
pub(super) fn group_taps(ksize: usize) -> usize {
    if ksize <= 4 {
        4
    } else {
        ksize.div_ceil(5) * 5
    }
}

/// Resizes rows `ys` of `src` horizontally into `out` (one `line` of
/// `axis.start.len()` pixels per row).
#[inline(always)]
pub(super) fn horizontal_pass<const AVX2: bool>(
    src: &View<'_>,
    ys: Range<usize>,
    axis: &Axis,
    out: &mut [u8],
) {
    let line = axis.start.len() * 3;
    #[cfg(target_arch = "x86_64")]
    if AVX2 && src.width >= axis.taps {
        let mut lines = out.chunks_mut(2 * line);
        let mut y = ys.start;
        for pair in &mut lines {
            let offsets = [src.row(y), src.row((y + 1).min(ys.end - 1))];
            // SAFETY: the caller runs with AVX2 enabled (`AVX2`).
            unsafe { avx2::horizontal_rows(src, offsets, axis, pair) };
            y += 2;
        }
        return;
    }
    for (y, out) in ys.zip(out.chunks_exact_mut(line)) {
        let o = src.row(y);
        let row = &src.rgb[o..o + src.width * 3];
        for (d, px) in out.chunks_exact_mut(3).enumerate() {
            horizontal_pixel(row, axis, d, px);
        }
    }
}

/// Output pixel `d` of one row: the weighted sum of the pixels of `row` its
/// taps cover. Zero weights (padding) are skipped, so taps past the row's
/// end when the row is shorter than the taps are never read.
#[inline(always)]
pub(super) fn horizontal_pixel(row: &[u8], axis: &Axis, d: usize, px: &mut [u8]) {
    let start = axis.start[d];
    let mut acc = [axis.half(); 3];
    for (k, &w) in axis.weights(d).iter().enumerate() {
        if w != 0 {
            let p = &row[(start + k) * 3..][..3];
            for (a, &v) in acc.iter_mut().zip(p) {
                *a += i32::from(v) * i32::from(w);
            }
        }
    }
    for (o, a) in px.iter_mut().zip(acc) {
        *o = axis.byte(a);
    }
}

/// Output row `y` from byte `from` on: the weighted sum of the
/// horizontally resized rows its taps cover (`rows` holds rows `first..`,
/// `line` bytes each).
#[inline(always)]
pub(super) fn vertical_row(
    rows: &[u8],
    line: usize,
    first: usize,
    axis: &Axis,
    y: usize,
    from: usize,
    out: &mut [u8],
) {
    const CHUNK: usize = 64;
    let start = axis.start[y] - first;
    let weights = axis.weights(y);
    for (c, out) in out[from..].chunks_mut(CHUNK).enumerate() {
        let x = from + c * CHUNK;
        let mut acc = [axis.half(); CHUNK];
        for (k, &w) in weights.iter().enumerate() {
            if w != 0 {
                let row = &rows[(start + k) * line + x..][..out.len()];
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += i32::from(v) * i32::from(w);
                }
            }
        }
        for (o, &a) in out.iter_mut().zip(&acc) {
            *o = axis.byte(a);
        }
    }
}
