//! Antialiased bilinear resampling of packed RGB8 pixels: Pillow's
//! `BILINEAR` (the filter torchvision's `antialias=True` follows), a
//! horizontal pass into an intermediate `u8` image and a vertical pass into
//! the destination, in reusable buffers, so steady-state resizing allocates
//! nothing.
//!
//! Weights are Pillow's (triangle filter stretched by the downscale factor,
//! normalized per output pixel), in 16-bit fixed point with as many
//! fraction bits as the largest weight allows (14 to 22). The horizontal
//! pass has an AVX2 kernel (two rows at a time, four taps per
//! shuffle + multiply-add); the portable kernel computes the same integer
//! sums, so both give the same bytes. The vertical pass is a plain loop the
//! compiler vectorizes.

use std::ops::Range;

/// Rows of packed RGB8 pixels: the `width x height` window at `(x0, y0)` of
/// an image whose rows start every `stride` bytes of `rgb`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) rgb: &'a [u8],
    pub(crate) stride: usize,
    pub(crate) x0: usize,
    pub(crate) y0: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
}

impl<'a> View<'a> {
    /// A whole `width x height` image.
    pub(crate) fn whole(rgb: &'a [u8], width: usize, height: usize) -> Self {
        View {
            rgb,
            stride: width * 3,
            x0: 0,
            y0: 0,
            width,
            height,
        }
    }

    /// Byte offset of the window's row `y` in `rgb`.
    pub(crate) fn row(&self, y: usize) -> usize {
        (self.y0 + y) * self.stride + self.x0 * 3
    }

    /// Whether every window row lies inside `rgb`.
    pub(crate) fn fits(&self) -> bool {
        self.width > 0
            && self.height > 0
            && self.x0 * 3 + self.width * 3 <= self.stride
            && self.row(self.height - 1) + self.width * 3 <= self.rgb.len()
    }
}

pub(crate) use crate::geometry::Crop;

/// One axis's filter: output `i` reads `taps` samples from `start[i]` with
/// weights `weights[i * taps..][..taps]` (fixed point, `precision` bits).
/// Starts are moved left, with leading zero weights, so every tap lies
/// inside the axis whenever the axis is at least `taps` long.
#[derive(Debug, Default)]
struct Axis {
    start: Vec<usize>,
    weights: Vec<i16>,
    /// Pillow's floating-point weights, before fixed point.
    raw: Vec<f64>,
    taps: usize,
    precision: u32,
}

impl Axis {
    /// Pillow's `precompute_coeffs` for the source range `[in0, in1)` of an
    /// axis `size` samples long onto `out` samples, outputs in reverse order
    /// if `reverse`, taps padded by `pad` (Pillow's maximum in, the
    /// padded count out).
    fn build(
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

    fn weights(&self, i: usize) -> &[i16] {
        &self.weights[i * self.taps..][..self.taps]
    }

    /// The samples the outputs read: from the first start to the last tap,
    /// clipped to an axis `size` long.
    fn reach(&self, size: usize) -> Range<usize> {
        let lo = self.start.iter().copied().min().unwrap_or(0);
        let hi = self.start.iter().map(|s| s + self.taps).max().unwrap_or(0);
        lo.min(size)..hi.min(size)
    }

    /// `acc >> precision`, clamped to a byte.
    fn byte(&self, acc: i32) -> u8 {
        (acc >> self.precision).clamp(0, 255) as u8
    }

    /// The accumulator's start value: one half, for rounding.
    fn half(&self) -> i32 {
        (1 << self.precision) >> 1
    }
}

/// Per-thread resampling buffers.
#[derive(Debug, Default)]
pub(crate) struct Resampler {
    horizontal: Axis,
    vertical: Axis,
    /// The horizontally resized rows the vertical pass reads.
    rows: Vec<u8>,
}

impl Resampler {
    /// Bytes held, for the RAM budget's accounting.
    pub(crate) fn bytes(&self) -> usize {
        let axis = |a: &Axis| {
            a.start.capacity() * std::mem::size_of::<usize>()
                + a.weights.capacity() * 2
                + a.raw.capacity() * 8
        };
        axis(&self.horizontal) + axis(&self.vertical) + self.rows.capacity()
    }

    /// Resizes the box `src_box` of `src` (window pixels; taps outside the
    /// box read the window around it, clamped at its edges) to `width x
    /// height` packed RGB8 in `dst`, mirrored left-right if `flip`.
    ///
    /// Panics if `dst` is not `width * height * 3` bytes or the window does
    /// not lie inside `src.rgb`; callers check both.
    pub(crate) fn resize(
        &mut self,
        src: &View<'_>,
        src_box: Crop,
        (width, height): (usize, usize),
        flip: bool,
        dst: &mut [u8],
    ) {
        assert!(src.fits(), "resize window outside its pixels");
        assert_eq!(dst.len(), width * height * 3, "resize destination size");
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `resize_avx2` needs AVX2, which this CPU has (detected
            // just above).
            return unsafe { self.resize_avx2(src, src_box, (width, height), flip, dst) };
        }
        self.resize_with::<false>(src, src_box, (width, height), flip, dst)
    }

    /// [`Self::resize_with`] compiled for AVX2: the horizontal kernel's
    /// intrinsics and a wider vectorized vertical pass.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn resize_avx2(
        &mut self,
        src: &View<'_>,
        src_box: Crop,
        size: (usize, usize),
        flip: bool,
        dst: &mut [u8],
    ) {
        self.resize_with::<true>(src, src_box, size, flip, dst)
    }

    /// Both passes; `AVX2` says the caller runs with AVX2 enabled.
    #[inline(always)]
    fn resize_with<const AVX2: bool>(
        &mut self,
        src: &View<'_>,
        b: Crop,
        (width, height): (usize, usize),
        flip: bool,
        dst: &mut [u8],
    ) {
        let Resampler {
            horizontal,
            vertical,
            rows,
        } = self;
        horizontal.build(
            src.width,
            (b.left, b.left + b.width),
            width,
            flip,
            group_taps,
        );
        vertical.build(src.height, (b.top, b.top + b.height), height, false, |k| k);
        let needed = vertical.reach(src.height);
        let line = width * 3;
        // Every byte is written by the horizontal pass: grow, never clear.
        if rows.len() < needed.len() * line {
            rows.resize(needed.len() * line, 0);
        }
        let rows = &mut rows[..needed.len() * line];
        horizontal_pass::<AVX2>(src, needed.clone(), horizontal, rows);
        for (y, out) in dst.chunks_exact_mut(line).enumerate() {
            #[cfg(target_arch = "x86_64")]
            if AVX2 {
                // SAFETY: the caller runs with AVX2 enabled (`AVX2`).
                unsafe { avx2::vertical_row(rows, line, needed.start, vertical, y, out) };
                continue;
            }
            vertical_row(rows, line, needed.start, vertical, y, 0, out);
        }
    }
}

/// The horizontal pass's tap count for at most `ksize` taps: whole groups
/// of the AVX2 kernel, which reads up to five pixels per load (four when
/// four are enough).
fn group_taps(ksize: usize) -> usize {
    if ksize <= 4 {
        4
    } else {
        ksize.div_ceil(5) * 5
    }
}

/// Resizes rows `ys` of `src` horizontally into `out` (one `line` of
/// `axis.start.len()` pixels per row).
#[inline(always)]
fn horizontal_pass<const AVX2: bool>(
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
fn horizontal_pixel(row: &[u8], axis: &Axis, d: usize, px: &mut [u8]) {
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
fn vertical_row(
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{horizontal_pixel, Axis, View};
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
                    let p01 =
                        _mm256_madd_epi16(_mm256_shuffle_epi8(v, self.m01), pairs(w[0], w[1]));
                    let p23 =
                        _mm256_madd_epi16(_mm256_shuffle_epi8(v, self.m23), pairs(w[2], w[3]));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(w: usize, h: usize) -> Vec<u8> {
        (0..w * h * 3)
            .map(|i| ((i * 37 + i / 7 * 11) % 256) as u8)
            .collect()
    }

    /// The AVX2 kernel's output, or `None` (the test reports itself
    /// skipped) on a CPU without AVX2, where `resize` would run the
    /// portable kernel and the comparison would be with itself.
    fn fast(
        r: &mut Resampler,
        view: &View<'_>,
        b: Crop,
        (w, h): (usize, usize),
        flip: bool,
    ) -> Option<Vec<u8>> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut out = vec![0u8; w * h * 3];
            // SAFETY: this CPU has AVX2 (detected just above).
            unsafe { r.resize_avx2(view, b, (w, h), flip, &mut out) };
            return Some(out);
        }
        eprintln!("skipped: this CPU has no AVX2 kernel to compare with the portable one");
        None
    }

    /// Both kernels give the same bytes, for upscales, downscales, odd row
    /// counts, flips and windows narrower than the taps.
    #[test]
    fn avx2_and_portable_kernels_agree() {
        let (iw, ih) = (61, 47);
        let rgb = pattern(iw, ih);
        let cases = [
            (
                View {
                    rgb: &rgb,
                    stride: iw * 3,
                    x0: 0,
                    y0: 0,
                    width: iw,
                    height: ih,
                },
                (24, 24),
            ),
            (
                View {
                    rgb: &rgb,
                    stride: iw * 3,
                    x0: 5,
                    y0: 3,
                    width: 40,
                    height: 31,
                },
                (96, 80),
            ),
            (
                View {
                    rgb: &rgb,
                    stride: iw * 3,
                    x0: 50,
                    y0: 40,
                    width: 11,
                    height: 7,
                },
                (5, 3),
            ),
            (
                View {
                    rgb: &rgb,
                    stride: iw * 3,
                    x0: 57,
                    y0: 44,
                    width: 4,
                    height: 3,
                },
                (9, 2),
            ),
            // Narrower than the taps of a 4x downscale: the portable kernel.
            (
                View {
                    rgb: &rgb,
                    stride: iw * 3,
                    x0: 57,
                    y0: 40,
                    width: 4,
                    height: 7,
                },
                (1, 2),
            ),
        ];
        for (view, (w, h)) in cases {
            for flip in [false, true] {
                let b = Crop {
                    left: 0.7,
                    top: 0.2,
                    width: view.width as f64 - 1.1,
                    height: view.height as f64 - 0.5,
                };
                let mut r = Resampler::default();
                let mut portable = vec![0u8; w * h * 3];
                r.resize_with::<false>(&view, b, (w, h), flip, &mut portable);
                let Some(best) = fast(&mut r, &view, b, (w, h), flip) else {
                    return;
                };
                assert!(
                    portable == best,
                    "{w}x{h} from {}x{} flip {flip}",
                    view.width,
                    view.height
                );
            }
        }
    }

    /// Random windows, boxes, sizes and flips, from 1x1 windows to 300x
    /// downscales (more taps than the vertical kernel's pair list) and
    /// far upscales: the kernels agree and nothing panics.
    #[test]
    fn random_geometries_agree_across_kernels() {
        use rand::Rng;
        let mut rng = crate::rng::keyed_rng(7, 0, crate::rng::Purpose::Sample, 0);
        let (iw, ih) = (300, 200);
        let rgb = pattern(iw, ih);
        let mut r = Resampler::default();
        for case in 0..300 {
            let (width, height) = (rng.random_range(1..=iw), rng.random_range(1..=ih));
            let (x0, y0) = (
                rng.random_range(0..=iw - width),
                rng.random_range(0..=ih - height),
            );
            let view = View {
                rgb: &rgb,
                stride: iw * 3,
                x0,
                y0,
                width,
                height,
            };
            let bw = rng.random_range(0.05..=1.0) * width as f64;
            let bh = rng.random_range(0.05..=1.0) * height as f64;
            let b = Crop {
                left: rng.random_range(0.0..=width as f64 - bw),
                top: rng.random_range(0.0..=height as f64 - bh),
                width: bw,
                height: bh,
            };
            let (w, h) = (rng.random_range(1..=300), rng.random_range(1..=300));
            let flip = rng.random::<bool>();
            let mut portable = vec![0u8; w * h * 3];
            r.resize_with::<false>(&view, b, (w, h), flip, &mut portable);
            let Some(best) = fast(&mut r, &view, b, (w, h), flip) else {
                return;
            };
            assert!(
                portable == best,
                "case {case}: {width}x{height} at ({x0}, {y0}), {b:?} -> {w}x{h} flip {flip}"
            );
        }
    }

    #[test]
    fn flip_mirrors_the_output() {
        let (iw, ih) = (33, 21);
        let rgb = pattern(iw, ih);
        let view = View {
            rgb: &rgb,
            stride: iw * 3,
            x0: 0,
            y0: 0,
            width: iw,
            height: ih,
        };
        let b = Crop {
            left: 1.5,
            top: 0.0,
            width: 30.0,
            height: 21.0,
        };
        let mut r = Resampler::default();
        let (mut a, mut f) = (vec![0u8; 17 * 9 * 3], vec![0u8; 17 * 9 * 3]);
        r.resize(&view, b, (17, 9), false, &mut a);
        r.resize(&view, b, (17, 9), true, &mut f);
        for (ra, rf) in a.chunks_exact(17 * 3).zip(f.chunks_exact(17 * 3)) {
            let mirrored: Vec<u8> = ra.chunks_exact(3).rev().flatten().copied().collect();
            assert_eq!(rf, &mirrored[..]);
        }
    }

    #[test]
    fn a_flat_image_stays_flat() {
        for v in [0u8, 1, 128, 254, 255] {
            let rgb = vec![v; 50 * 40 * 3];
            let view = View {
                rgb: &rgb,
                stride: 150,
                x0: 0,
                y0: 0,
                width: 50,
                height: 40,
            };
            for (w, h) in [(224, 224), (7, 5), (50, 40)] {
                let b = Crop {
                    left: 0.3,
                    top: 2.0,
                    width: 45.2,
                    height: 37.0,
                };
                let mut out = vec![0u8; w * h * 3];
                Resampler::default().resize(&view, b, (w, h), false, &mut out);
                assert!(out.iter().all(|&o| o == v), "{v} -> {w}x{h}");
            }
        }
    }
}
