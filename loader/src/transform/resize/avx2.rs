//! The AVX2 resampling kernels (x86-64 with AVX2 and FMA, checked at run
//! time); the portable kernels give the same bytes.

use super::portable::horizontal_pixel;
use super::{Axis, View};
use std::arch::x86_64::*;

/// Resizes the source rows at byte offsets `offsets` (equal for a lone
/// last row) horizontally into `out`: one output line, or two back to
/// back. Up to five taps of a pixel per 16-byte load: byte shuffles
/// line up each channel's pixel pairs as 16-bit lanes and multiply-adds
/// weigh them, the two rows in the two 128-bit halves. Pixels go four at
/// a time, packed together into one store per row.
///
/// Needs `axis.taps` from [`super::group_taps`] and the window at least
/// `axis.taps` wide (so every tap lies inside the row).
///
/// # Safety
/// The CPU must have AVX2 (the caller checks it at run time), and the
/// two conditions above must hold.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn horizontal_rows(
    src: &View<'_>,
    offsets: [usize; 2],
    axis: &Axis,
    out: &mut [u8],
) {
    // SAFETY: the caller runs with AVX2 enabled, and the kernels
    // need no more than this function (`taps` from `group_taps`).
    unsafe {
        match axis.taps {
            4 => rows::<4, 1>(src, offsets, axis, out),
            5 => rows::<5, 1>(src, offsets, axis, out),
            10 => rows::<5, 2>(src, offsets, axis, out),
            15 => rows::<5, 3>(src, offsets, axis, out),
            _ => rows::<5, 0>(src, offsets, axis, out),
        }
    }
}

/// [`horizontal_rows`] with `G` groups of `K` taps (`G` 0: `axis.taps /
/// K`, read at run time).
///
/// # Safety
/// As [`horizontal_rows`].
#[target_feature(enable = "avx2")]
unsafe fn rows<const K: usize, const G: usize>(
    src: &View<'_>,
    offsets: [usize; 2],
    axis: &Axis,
    out: &mut [u8],
) {
    let line = axis.start.len() * 3;
    let pair = out.len() == 2 * line;
    // Lanes (r0, r1, g0, g1, b0, b1, 0, 0) of pixels 0-1, 2-3, and 4
    // (with zeros for its pair).
    #[rustfmt::skip]
    let m01 = _mm256_setr_epi8(
        0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
        0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
    );
    #[rustfmt::skip]
    let m23 = _mm256_setr_epi8(
        6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,
        6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,
    );
    #[rustfmt::skip]
    let m4 = _mm256_setr_epi8(
        12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, -1, -1, -1, -1,
        12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, -1, -1, -1, -1,
    );
    // Four packed RGBx pixels to twelve RGB bytes.
    #[rustfmt::skip]
    let compact = _mm256_setr_epi8(
        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
    );
    let shift = _mm_cvtsi32_si128(axis.precision as i32);
    let half = _mm256_set1_epi32(axis.half());
    let rgb = src.rgb;
    let (o0, o1) = (offsets[0], offsets[1].max(offsets[0]));
    let k = Kernel {
        m01,
        m23,
        m4,
        shift,
        half,
    };
    let w = src.width * 3;
    let (row0, row1) = (&rgb[o0..o0 + w], &rgb[o1..o1 + w]);
    let (out0, out1) = out.split_at_mut(line);
    let n = axis.start.len();
    let mut d = 0;
    while d < n {
        let block = if d + 4 <= n {
            let oo = (o0, o1);
            // SAFETY: the caller runs with AVX2 enabled.
            let sums = unsafe {
                (
                    k.sum::<K, G>(rgb, oo, axis, d),
                    k.sum::<K, G>(rgb, oo, axis, d + 1),
                    k.sum::<K, G>(rgb, oo, axis, d + 2),
                    k.sum::<K, G>(rgb, oo, axis, d + 3),
                )
            };
            match sums {
                (Some(a), Some(b), Some(c), Some(e)) => Some((a, b, c, e)),
                _ => None,
            }
        } else {
            None
        };
        let Some((a, b, c, e)) = block else {
            // A last partial block, or one too near the end of `rgb`.
            horizontal_pixel(row0, axis, d, &mut out0[d * 3..d * 3 + 3]);
            if pair {
                horizontal_pixel(row1, axis, d, &mut out1[d * 3..d * 3 + 3]);
            }
            d += 1;
            continue;
        };
        let bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
        let bytes = _mm256_shuffle_epi8(bytes, compact);
        let (lo, hi) = (
            _mm256_castsi256_si128(bytes),
            _mm256_extracti128_si256::<1>(bytes),
        );
        let at = d * 3;
        if at + 16 <= line {
            // 12 bytes and 4 of the next block's, written after this.
            // SAFETY: `at + 16 <= line`, the length of both lines.
            unsafe {
                _mm_storeu_si128(out0.as_mut_ptr().add(at).cast(), lo);
                if pair {
                    _mm_storeu_si128(out1.as_mut_ptr().add(at).cast(), hi);
                }
            }
        } else {
            let mut bytes = [[0u8; 16]; 2];
            // SAFETY: both arrays are 16 bytes.
            unsafe {
                _mm_storeu_si128(bytes[0].as_mut_ptr().cast(), lo);
                _mm_storeu_si128(bytes[1].as_mut_ptr().cast(), hi);
            }
            out0[at..at + 12].copy_from_slice(&bytes[0][..12]);
            if pair {
                out1[at..at + 12].copy_from_slice(&bytes[1][..12]);
            }
        }
        d += 4;
    }
}

/// The shuffle masks and constants of [`rows`].
#[derive(Clone, Copy)]
struct Kernel {
    m01: __m256i,
    m23: __m256i,
    m4: __m256i,
    shift: __m128i,
    half: __m256i,
}

impl Kernel {
    /// The sums of output pixel `d` for the rows at byte offsets `o0 <=
    /// o1` of `rgb` (shifted, one row per 128-bit half), or None when
    /// its last load would read past `rgb`.
    ///
    /// # Safety
    /// The CPU must have AVX2; the loads are checked against `rgb`.
    #[inline(always)]
    unsafe fn sum<const K: usize, const G: usize>(
        &self,
        rgb: &[u8],
        (o0, o1): (usize, usize),
        axis: &Axis,
        d: usize,
    ) -> Option<__m256i> {
        let taps = axis.taps;
        let groups = if G == 0 { taps / K } else { G };
        let start = axis.start[d];
        // The last load reads 16 bytes from the last group's first pixel.
        if o1 + (start + taps - K) * 3 + 16 > rgb.len() {
            return None;
        }
        let pairs = |lo: i16, hi: i16| {
            // SAFETY: the caller has AVX2.
            unsafe { _mm256_set1_epi32(i32::from(lo as u16) | i32::from(hi as u16) << 16) }
        };
        let ptr = rgb.as_ptr();
        let weights = axis.weights(d);
        let mut acc = self.half;
        for g in 0..groups {
            let at = (start + K * g) * 3;
            let w = &weights[K * g..K * g + K];
            // SAFETY: both loads end at or before the bound checked
            // above (`o0 <= o1`, `g < taps / K`), inside `rgb`; the
            // caller has AVX2.
            unsafe {
                let a = _mm_loadu_si128(ptr.add(o0 + at).cast());
                let b = _mm_loadu_si128(ptr.add(o1 + at).cast());
                let v = _mm256_set_m128i(b, a);
                let p01 = _mm256_madd_epi16(_mm256_shuffle_epi8(v, self.m01), pairs(w[0], w[1]));
                let p23 = _mm256_madd_epi16(_mm256_shuffle_epi8(v, self.m23), pairs(w[2], w[3]));
                acc = _mm256_add_epi32(acc, _mm256_add_epi32(p01, p23));
                if K == 5 {
                    let p4 = _mm256_madd_epi16(_mm256_shuffle_epi8(v, self.m4), pairs(w[4], 0));
                    acc = _mm256_add_epi32(acc, p4);
                }
            }
        }
        // SAFETY: the caller has AVX2.
        Some(unsafe { _mm256_sra_epi32(acc, self.shift) })
    }
}

/// [`super::vertical_row`] 32 bytes at a time: the taps in pairs, each
/// pair's two rows interleaved as 16-bit lanes and weighed by one
/// multiply-add; the unpacks' lane order is undone by the packs.
///
/// # Safety
/// The CPU must have AVX2 (the caller checks it at run time). The
/// buffer bounds are asserted.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn vertical_row(
    rows: &[u8],
    line: usize,
    first: usize,
    axis: &Axis,
    y: usize,
    out: &mut [u8],
) {
    assert_eq!(out.len(), line, "one output row");
    let start = axis.start[y] - first;
    let weights = axis.weights(y);
    // The rows with a non-zero weight: (row offset, weight); a lone
    // last one pairs with itself at weight 0.
    let taps = weights.iter().enumerate().filter(|(_, &w)| w != 0);
    let mut pairs = [(0usize, 0i32); 32];
    let mut n = 0;
    let mut pending = None;
    for (k, &w) in taps {
        let o = (start + k) * line;
        assert!(o + line <= rows.len(), "vertical tap outside the rows");
        match pending.take() {
            None => pending = Some((o, w)),
            Some((o0, w0)) => {
                if n == pairs.len() {
                    // More taps than a pair list holds (a > 60x
                    // downscale): the portable loop takes the row.
                    return super::vertical_row(rows, line, first, axis, y, 0, out);
                }
                let w01 = i32::from(w0 as u16) | i32::from(w as u16) << 16;
                pairs[n] = (o0, w01);
                pairs[n + 1] = (o, 0);
                n += 2;
            }
        }
    }
    if let Some((o, w)) = pending {
        if n == pairs.len() {
            return super::vertical_row(rows, line, first, axis, y, 0, out);
        }
        pairs[n] = (o, i32::from(w as u16));
        pairs[n + 1] = (o, 0);
        n += 2;
    }
    let pairs = &pairs[..n];
    let shift = _mm_cvtsi32_si128(axis.precision as i32);
    let half = _mm256_set1_epi32(axis.half());
    let zero = _mm256_setzero_si256();
    let ptr = rows.as_ptr();
    let mut x = 0;
    while x + 32 <= line {
        let mut acc = [half; 4];
        for p in pairs.chunks_exact(2) {
            let ((oa, w), (ob, _)) = (p[0], p[1]);
            // SAFETY: `oa + line` and `ob + line` are inside `rows`
            // (asserted above) and `x + 32 <= line`.
            let (a, b) = unsafe {
                (
                    _mm256_loadu_si256(ptr.add(oa + x).cast()),
                    _mm256_loadu_si256(ptr.add(ob + x).cast()),
                )
            };
            let w = _mm256_set1_epi32(w);
            let (alo, ahi) = (_mm256_unpacklo_epi8(a, zero), _mm256_unpackhi_epi8(a, zero));
            let (blo, bhi) = (_mm256_unpacklo_epi8(b, zero), _mm256_unpackhi_epi8(b, zero));
            let lanes = [
                _mm256_unpacklo_epi16(alo, blo),
                _mm256_unpackhi_epi16(alo, blo),
                _mm256_unpacklo_epi16(ahi, bhi),
                _mm256_unpackhi_epi16(ahi, bhi),
            ];
            for (acc, l) in acc.iter_mut().zip(lanes) {
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(l, w));
            }
        }
        let [a0, a1, a2, a3] = acc.map(|a| _mm256_sra_epi32(a, shift));
        let bytes = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
        // SAFETY: `x + 32 <= line == out.len()`.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(x).cast(), bytes) };
        x += 32;
    }
    if x < line {
        super::vertical_row(rows, line, first, axis, y, x, out);
    }
}
