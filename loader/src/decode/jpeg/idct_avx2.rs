//! The 8x8 inverse DCT with AVX2 and FMA (x86-64, checked at run time) for
//! blocks with many coefficients: the AAN factorisation (libjpeg's
//! `jidctflt.c`: 5 multiplies and 29 additions a row) on eight lanes,
//! down the columns, one 8x8 transpose of floats, along the rows, then all
//! 64 samples rounded and packed to bytes together and put back in row
//! order with a byte shuffle (cheaper than a second transpose of floats:
//! 16% less time a block, measured on random dense blocks). Sparse blocks
//! stay with the matrix form in `idct.rs`, which skips their zero rows and
//! columns.

use std::arch::x86_64::*;

/// AAN's scale factors: 1, then `cos(k pi / 16) * sqrt(2)`.
fn aan(k: usize) -> f64 {
    if k == 0 {
        1.0
    } else {
        (k as f64 * std::f64::consts::PI / 16.0).cos() * std::f64::consts::SQRT_2
    }
}

/// The multipliers [`block`] takes: `q` (natural order, from
/// `idct::multipliers`) times the AAN scale factors of its row and column,
/// over 8 (the transform's final descaling).
pub(super) fn multipliers(q: &[f32; 64]) -> [f32; 64] {
    std::array::from_fn(|i| (q[i] as f64 * aan(i / 8) * aan(i % 8) / 8.0) as f32)
}

/// Inverse-transforms the quantized coefficients `coef` (natural order)
/// with `q` from [`multipliers`] into eight rows of eight samples at
/// `out[0..]`, `stride` apart.
///
/// # Safety
/// The CPU must have AVX2 and FMA (the caller checks it at run time).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn block(coef: &[i16; 64], q: &[f32; 64], out: &mut [u8], stride: usize) {
    let mut r: [__m256; 8] = std::array::from_fn(|v| {
        // SAFETY: rows `v < 8` of 8 coefficients and 8 multipliers lie
        // inside the arrays; unaligned loads take any address.
        unsafe {
            let c = _mm_loadu_si128(coef.as_ptr().add(8 * v).cast());
            let c = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(c));
            _mm256_mul_ps(c, _mm256_loadu_ps(q.as_ptr().add(8 * v)))
        }
    });
    // Down the columns (lanes are columns), then along the rows; the level
    // shift rides on the DC term of the second pass, which every output
    // takes with weight 1.
    idct8(&mut r);
    transpose(&mut r);
    r[0] = _mm256_add_ps(r[0], _mm256_set1_ps(128.0));
    idct8(&mut r);
    // `r[x]` is now output column `x`, its lanes the rows. Rounded to
    // nearest (ties to even, as `idct::to_u8`) and packed to bytes with
    // saturation, which clamps to 0..=255 as `to_u8` does (the `min` keeps
    // values past `i32` from turning into `i32::MIN`, i.e. 0): each pack
    // interleaves the 128-bit halves, so `a` holds columns 0-3 and `b`
    // columns 4-7, rows 0-3 in the low half and 4-7 in the high one, byte
    // `4 x + y % 4`.
    let max = _mm256_set1_ps(255.0);
    let c: [__m256i; 8] = std::array::from_fn(|x| _mm256_cvtps_epi32(_mm256_min_ps(r[x], max)));
    let a = _mm256_packus_epi16(
        _mm256_packs_epi32(c[0], c[1]),
        _mm256_packs_epi32(c[2], c[3]),
    );
    let b = _mm256_packus_epi16(
        _mm256_packs_epi32(c[4], c[5]),
        _mm256_packs_epi32(c[6], c[7]),
    );
    // Transposed within each half to byte `4 y + x`: four rows of four
    // samples, which the unpacks join with the other four columns' into
    // rows of eight: `lo` holds rows 0, 1 | 4, 5 and `hi` rows 2, 3 | 6, 7.
    let t = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10,
        14, 3, 7, 11, 15,
    );
    let (a, b) = (_mm256_shuffle_epi8(a, t), _mm256_shuffle_epi8(b, t));
    let (lo, hi) = (_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    let rows = [
        _mm256_castsi256_si128(lo),
        _mm256_castsi256_si128(hi),
        _mm256_extracti128_si256::<1>(lo),
        _mm256_extracti128_si256::<1>(hi),
    ];
    // `rows[i]` holds rows `2 i` and `2 i + 1`.
    let out = &mut out[..7 * stride + 8];
    for (i, v) in rows.into_iter().enumerate() {
        let y = 2 * i;
        // SAFETY: rows `y` and `y + 1 <= 7` start at `y * stride` and
        // `(y + 1) * stride`, and their 8 bytes end by `7 * stride + 8`,
        // the length `out` was just cut to (which panics if it is
        // shorter); unaligned 8-byte stores take any address.
        unsafe {
            _mm_storel_epi64(out.as_mut_ptr().add(y * stride).cast(), v);
            _mm_storeh_pd(
                out.as_mut_ptr().add((y + 1) * stride).cast(),
                _mm_castsi128_pd(v),
            );
        }
    }
}

/// One 8-point AAN inverse DCT across the eight vectors (`jidctflt.c`'s
/// pass, inputs already scaled by [`multipliers`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn idct8(r: &mut [__m256; 8]) {
    let k = _mm256_set1_ps;
    // Even part.
    let tmp10 = _mm256_add_ps(r[0], r[4]);
    let tmp11 = _mm256_sub_ps(r[0], r[4]);
    let tmp13 = _mm256_add_ps(r[2], r[6]);
    let tmp12 = _mm256_fmsub_ps(
        _mm256_sub_ps(r[2], r[6]),
        k(std::f32::consts::SQRT_2),
        tmp13,
    );
    let e0 = _mm256_add_ps(tmp10, tmp13);
    let e3 = _mm256_sub_ps(tmp10, tmp13);
    let e1 = _mm256_add_ps(tmp11, tmp12);
    let e2 = _mm256_sub_ps(tmp11, tmp12);
    // Odd part.
    let z13 = _mm256_add_ps(r[5], r[3]);
    let z10 = _mm256_sub_ps(r[5], r[3]);
    let z11 = _mm256_add_ps(r[1], r[7]);
    let z12 = _mm256_sub_ps(r[1], r[7]);
    let o7 = _mm256_add_ps(z11, z13);
    let tmp11 = _mm256_mul_ps(_mm256_sub_ps(z11, z13), k(std::f32::consts::SQRT_2));
    let z5 = _mm256_mul_ps(_mm256_add_ps(z10, z12), k(1.847_759));
    let tmp10 = _mm256_fmsub_ps(z12, k(1.082_392_2), z5);
    let tmp12 = _mm256_fmadd_ps(z10, k(-2.613_126), z5);
    let o6 = _mm256_sub_ps(tmp12, o7);
    let o5 = _mm256_sub_ps(tmp11, o6);
    let o4 = _mm256_add_ps(tmp10, o5);
    r[0] = _mm256_add_ps(e0, o7);
    r[7] = _mm256_sub_ps(e0, o7);
    r[1] = _mm256_add_ps(e1, o6);
    r[6] = _mm256_sub_ps(e1, o6);
    r[2] = _mm256_add_ps(e2, o5);
    r[5] = _mm256_sub_ps(e2, o5);
    r[4] = _mm256_add_ps(e3, o4);
    r[3] = _mm256_sub_ps(e3, o4);
}

/// Transposes the 8x8 matrix of the vectors' lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn transpose(r: &mut [__m256; 8]) {
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    let s = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    for i in 0..4 {
        r[i] = _mm256_permute2f128_ps::<0x20>(s[i], s[i + 4]);
        r[i + 4] = _mm256_permute2f128_ps::<0x31>(s[i], s[i + 4]);
    }
}
