//! Writing a resized window into a sample's slot: layout (HWC bytes or
//! CHW floats), flip, and the normalize table, with an AVX2 kernel for the
//! common unflipped float case.

use super::ImageTransform;
use crate::layout::Slot;

impl ImageTransform {
    /// Writes an `height x width` RGB window whose rows start every `stride`
    /// bytes of `src` into `slot`, flipping and converting as configured.
    pub(super) fn write(&self, src: &[u8], stride: usize, flip: bool, slot: Slot<'_>) {
        let (w, h) = (self.width, self.height);
        match slot {
            Slot::U8(out) => {
                for (y, dst) in out.chunks_exact_mut(w * 3).take(h).enumerate() {
                    let row = &src[y * stride..y * stride + w * 3];
                    if flip {
                        for (d, s) in dst.chunks_exact_mut(3).zip(row.chunks_exact(3).rev()) {
                            d.copy_from_slice(s);
                        }
                    } else {
                        dst.copy_from_slice(row);
                    }
                }
            }
            Slot::F32(out) => {
                #[cfg(target_arch = "x86_64")]
                if !flip
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: `planar_avx2` needs AVX2 and FMA, which this
                    // CPU has (detected just above).
                    return unsafe { self.planar_avx2(src, stride, out) };
                }
                let plane = w * h;
                let (r, rest) = out.split_at_mut(plane);
                let (g, b) = rest.split_at_mut(plane);
                let [l0, l1, l2] = &*self.lut;
                for y in 0..h {
                    let row = &src[y * stride..y * stride + w * 3];
                    let o = y * w;
                    let dst = r[o..o + w]
                        .iter_mut()
                        .zip(&mut g[o..o + w])
                        .zip(&mut b[o..o + w]);
                    // Two loops rather than a per-pixel branch; zipped
                    // iterators and u8-indexed tables leave no bounds checks.
                    if flip {
                        for (((r, g), b), p) in dst.zip(row.chunks_exact(3).rev()) {
                            (*r, *g, *b) =
                                (l0[p[0] as usize], l1[p[1] as usize], l2[p[2] as usize]);
                        }
                    } else {
                        for (((r, g), b), p) in dst.zip(row.chunks_exact(3)) {
                            (*r, *g, *b) =
                                (l0[p[0] as usize], l1[p[1] as usize], l2[p[2] as usize]);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl ImageTransform {
    /// The unflipped `F32` case of [`write`](Self::write), eight pixels at
    /// a time: byte shuffles split the channels, then widen, convert and
    /// one fused multiply-add per channel (the same floats as `lut`).
    #[target_feature(enable = "avx2,fma")]
    fn planar_avx2(&self, src: &[u8], stride: usize, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let (w, h) = (self.width, self.height);
        let plane = w * h;
        // Channel c of pixels 0-7: bytes c, c+3, ... of the first 16 bytes
        // (`first[c]`) and of the next 8 (`next[c]`), OR-ed together.
        #[rustfmt::skip]
        let first = [
            _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
        ];
        #[rustfmt::skip]
        let next = [
            _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, -1, -1, -1, -1, -1, -1, -1, -1),
            _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, -1, -1, -1, -1, -1, -1, -1, -1),
        ];
        let scale = self.scale.map(|s| _mm256_set1_ps(s));
        let bias = self.bias.map(|b| _mm256_set1_ps(b));
        let lut = &*self.lut;
        let (r, rest) = out.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        let planes = [r, g, b];
        for y in 0..h {
            let row = &src[y * stride..y * stride + w * 3];
            let mut x = 0;
            while x + 8 <= w {
                let px = &row[x * 3..x * 3 + 24];
                // SAFETY: `px` is 24 bytes: 16 read at 0 and 8 at 16.
                let (a, b) = unsafe {
                    (
                        _mm_loadu_si128(px.as_ptr().cast()),
                        _mm_loadl_epi64(px.as_ptr().add(16).cast()),
                    )
                };
                for c in 0..3 {
                    let bytes =
                        _mm_or_si128(_mm_shuffle_epi8(a, first[c]), _mm_shuffle_epi8(b, next[c]));
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    let f = _mm256_fmadd_ps(v, scale[c], bias[c]);
                    let dst = &mut planes[c][y * w + x..y * w + x + 8];
                    // SAFETY: `dst` is 8 floats.
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), f) };
                }
                x += 8;
            }
            for x in x..w {
                for c in 0..3 {
                    planes[c][y * w + x] = lut[c][usize::from(row[x * 3 + c])];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Size;
    use crate::layout::{HostLayout, IMAGENET_MEAN, IMAGENET_STD};
    use crate::transform::Transforms;

    #[test]
    fn f32_rows_match_the_table() {
        // 13 wide: one 8-pixel vector step and a 5-pixel tail per row.
        let t = ImageTransform::new(
            Transforms::eval(13),
            HostLayout::imagenet(),
            Size::new(13, 4),
            0,
        )
        .unwrap();
        let stride = 13 * 3 + 5;
        let src: Vec<u8> = (0..stride * 4).map(|i| (i * 89 % 256) as u8).collect();
        let mut got = vec![0f32; t.slot_len()];
        t.write(&src, stride, false, Slot::F32(&mut got));
        for c in 0..3 {
            for y in 0..4 {
                for x in 0..13 {
                    let v = src[y * stride + x * 3 + c];
                    let want = (f32::from(v) / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
                    let got = got[c * 52 + y * 13 + x];
                    assert_eq!(got, t.lut[c][usize::from(v)], "c {c} y {y} x {x}");
                    assert!((got - want).abs() < 1e-6, "{got} vs {want}");
                }
            }
        }
    }
}
