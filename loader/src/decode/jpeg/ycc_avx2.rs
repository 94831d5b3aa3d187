//! YCbCr to RGB with AVX2 (x86-64, checked at run time), 16 pixels at a
//! time; the same bytes as the portable code in `color.rs` (libjpeg's
//! `jdcolor.c` arithmetic, exactly).
//!
//! Each colour term is libjpeg's `(c * FIX(k) + ONE_HALF) >> 16` with the
//! constant split into a multiple of 2^16 (added as whole `c`s) and a rest
//! that fits 16 bits, so one 16x16-bit multiply-add per pair of lanes
//! (`vpmaddwd`: the chroma value and a constant 2 or the other chroma
//! value) gives the exact 32-bit sum before the shift. The three 16-byte
//! channels are then interleaved into 48 RGB bytes with byte shuffles.

use std::arch::x86_64::*;

/// For output byte `16 * j + t` of 48 (pixel `p = (16 * j + t) / 3`,
/// channel `(16 * j + t) % 3`): `MASKS[j][c][t]` is `p` where the byte is
/// channel `c`'s, else -1 (a shuffle writes 0 there).
const MASKS: [[[i8; 16]; 3]; 3] = {
    let mut m = [[[-1i8; 16]; 3]; 3];
    let mut i = 0;
    while i < 48 {
        m[i / 16][i % 3][i % 16] = (i / 3) as i8;
        i += 1;
    }
    m
};

/// Converts the longest whole number of 16-pixel groups of `y`, `cb` and
/// `cr` into packed RGB at the start of `out`; returns how many pixels it
/// converted (the caller converts the rest).
///
/// # Safety
/// The CPU must have AVX2 (the caller checks it at run time).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn ycbcr_to_rgb(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) -> usize {
    let groups = y.len().min(cb.len()).min(cr.len()).min(out.len() / 3) / 16;
    // R = Y + Cr + (26345 Cr + 32768) >> 16      (1.402 = 1 + 26345 / 2^16)
    // B = Y + 2 Cb + (-14942 Cb + 32768) >> 16   (1.772 = 2 - 14942 / 2^16)
    // G = Y - Cr + (-22554 Cb + 18734 Cr + 32768) >> 16
    //                                (0.71414 = 1 - 18734 / 2^16)
    let r_k = _mm256_set1_epi32(pair(26_345, 16_384));
    let b_k = _mm256_set1_epi32(pair(-14_942, 16_384));
    let g_k = _mm256_set1_epi32(pair(-22_554, 18_734));
    let half = _mm256_set1_epi32(32_768);
    let zero = _mm256_setzero_si256();
    let two = _mm256_set1_epi16(2);
    let center = _mm256_set1_epi16(128);
    let masks: [[__m128i; 3]; 3] = std::array::from_fn(|j| {
        std::array::from_fn(|c| {
            // SAFETY: each of `MASKS`' rows is 16 bytes; unaligned loads
            // take any address.
            unsafe { _mm_loadu_si128(MASKS[j][c].as_ptr().cast()) }
        })
    });
    for i in 0..groups {
        // SAFETY: `16 * i + 16` is at most the length of `y`, `cb` and
        // `cr`, and `48 * i + 48` at most `out`'s (`groups` above);
        // unaligned loads and stores take any address.
        unsafe {
            let yy = load16(y.as_ptr().add(16 * i));
            let cb = _mm256_sub_epi16(load16(cb.as_ptr().add(16 * i)), center);
            let cr = _mm256_sub_epi16(load16(cr.as_ptr().add(16 * i)), center);
            let r = _mm256_add_epi16(_mm256_add_epi16(yy, cr), term(cr, two, r_k, zero));
            let b = _mm256_add_epi16(
                _mm256_add_epi16(yy, _mm256_add_epi16(cb, cb)),
                term(cb, two, b_k, zero),
            );
            let g = _mm256_add_epi16(_mm256_sub_epi16(yy, cr), term(cb, cr, g_k, half));
            // Saturated to bytes: (r 0-7, g 0-7 | r 8-15, g 8-15), reordered
            // to (r 0-15 | g 0-15); b likewise with itself.
            let rg = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(r, g));
            let bb = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(b, b));
            let channels = [
                _mm256_castsi256_si128(rg),
                _mm256_extracti128_si256::<1>(rg),
                _mm256_castsi256_si128(bb),
            ];
            let dst = out.as_mut_ptr().add(48 * i);
            for (j, m) in masks.iter().enumerate() {
                let v = _mm_or_si128(
                    _mm_or_si128(
                        _mm_shuffle_epi8(channels[0], m[0]),
                        _mm_shuffle_epi8(channels[1], m[1]),
                    ),
                    _mm_shuffle_epi8(channels[2], m[2]),
                );
                _mm_storeu_si128(dst.add(16 * j).cast(), v);
            }
        }
    }
    groups * 16
}

/// Two 16-bit constants as the (low, high) halves of a 32-bit lane.
const fn pair(low: i16, high: i16) -> i32 {
    (high as u16 as i32) << 16 | low as u16 as i32
}

/// 16 bytes at `p`, zero-extended to 16-bit lanes.
///
/// # Safety
/// AVX2, and 16 readable bytes at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load16(p: *const u8) -> __m256i {
    // SAFETY: the caller's.
    _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p.cast()) })
}

/// The 16 lanes of `(a, b)` pairs multiply-added with `k`, plus `add`,
/// shifted right by 16 and packed back to 16 bits, in order (the unpacks
/// and the pack both work within 128-bit halves).
#[target_feature(enable = "avx2")]
#[inline]
fn term(a: __m256i, b: __m256i, k: __m256i, add: __m256i) -> __m256i {
    let lo = _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), k);
    let hi = _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), k);
    let lo = _mm256_srai_epi32::<16>(_mm256_add_epi32(lo, add));
    let hi = _mm256_srai_epi32::<16>(_mm256_add_epi32(hi, add));
    _mm256_packs_epi32(lo, hi)
}
