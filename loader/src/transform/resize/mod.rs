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

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;
mod weights;

use portable::{group_taps, horizontal_pass, vertical_row};
use weights::Axis;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(w: usize, h: usize) -> Vec<u8> {
        (0..w * h * 3)
            .map(|i| ((i * 37 + i / 7 * 11) % 256) as u8)
            .collect()
    }

    /// The portable kernel's output and the AVX2 kernel's, or `None` (the
    /// test reports itself skipped) on a CPU without AVX2, where `resize`
    /// would run the portable kernel and the comparison would be with
    /// itself.
    fn both(
        r: &mut Resampler,
        view: &View<'_>,
        b: Crop,
        (w, h): (usize, usize),
        flip: bool,
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        let mut portable = vec![0u8; w * h * 3];
        r.resize_with::<false>(view, b, (w, h), flip, &mut portable);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut out = vec![0u8; w * h * 3];
            // SAFETY: this CPU has AVX2 (detected just above).
            unsafe { r.resize_avx2(view, b, (w, h), flip, &mut out) };
            return Some((portable, out));
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
                let Some((portable, best)) = both(&mut r, &view, b, (w, h), flip) else {
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
            let Some((portable, best)) = both(&mut r, &view, b, (w, h), flip) else {
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
