//! The 8x8 inverse DCT: the AAN factorisation in `f32` (libjpeg's
//! `jidctflt.c` algorithm), written on rows of eight lanes so the compiler
//! vectorises both passes.

use super::huffman::ZIGZAG;

/// AAN scale factors: `cos(k * pi / 16) * sqrt(2)` for `k > 0`, 1 for 0.
const AAN: [f32; 8] = [
    1.0,
    1.387_039_8,
    1.306_563,
    1.175_875_6,
    1.0,
    0.785_694_96,
    0.541_196_1,
    0.275_899_38,
];

/// A DQT table in zigzag order turned into the AAN multipliers, in natural
/// order, with the final division by 8 folded in.
pub(super) fn multipliers(zigzag: &[u16; 64]) -> [f32; 64] {
    let mut out = [0f32; 64];
    for (k, &q) in zigzag.iter().enumerate() {
        let n = ZIGZAG[k] as usize;
        out[n] = q as f32 * AAN[n / 8] * AAN[n % 8] / 8.0;
    }
    out
}

type Lanes = [f32; 8];

#[inline(always)]
fn add(a: Lanes, b: Lanes) -> Lanes {
    let mut o = a;
    for i in 0..8 {
        o[i] += b[i];
    }
    o
}

#[inline(always)]
fn sub(a: Lanes, b: Lanes) -> Lanes {
    let mut o = a;
    for i in 0..8 {
        o[i] -= b[i];
    }
    o
}

#[inline(always)]
fn mul(a: Lanes, k: f32) -> Lanes {
    let mut o = a;
    for v in &mut o {
        *v *= k;
    }
    o
}

/// One 1-D inverse DCT on each of eight lanes: `v[k]` holds coefficient `k`
/// of every lane, and so does the result for sample `k`.
#[inline(always)]
fn idct8(v: &[Lanes; 8]) -> [Lanes; 8] {
    // Even part.
    let tmp10 = add(v[0], v[4]);
    let tmp11 = sub(v[0], v[4]);
    let tmp13 = add(v[2], v[6]);
    let tmp12 = sub(mul(sub(v[2], v[6]), std::f32::consts::SQRT_2), tmp13);
    let e0 = add(tmp10, tmp13);
    let e3 = sub(tmp10, tmp13);
    let e1 = add(tmp11, tmp12);
    let e2 = sub(tmp11, tmp12);
    // Odd part.
    let z13 = add(v[5], v[3]);
    let z10 = sub(v[5], v[3]);
    let z11 = add(v[1], v[7]);
    let z12 = sub(v[1], v[7]);
    let o7 = add(z11, z13);
    let t11 = mul(sub(z11, z13), std::f32::consts::SQRT_2);
    let z5 = mul(add(z10, z12), 1.847_759);
    let t10 = sub(mul(z12, 1.082_392_2), z5);
    let t12 = add(mul(z10, -2.613_126), z5);
    let o6 = sub(t12, o7);
    let o5 = sub(t11, o6);
    let o4 = add(t10, o5);
    [
        add(e0, o7),
        add(e1, o6),
        add(e2, o5),
        sub(e3, o4),
        add(e3, o4),
        sub(e2, o5),
        sub(e1, o6),
        sub(e0, o7),
    ]
}

#[inline(always)]
fn transpose(m: &[Lanes; 8]) -> [Lanes; 8] {
    let mut t = [[0f32; 8]; 8];
    for r in 0..8 {
        for c in 0..8 {
            t[c][r] = m[r][c];
        }
    }
    t
}

#[inline(always)]
fn to_u8(v: f32) -> u8 {
    // +128 level shift and clamp; adding 1.5 * 2^23 rounds to an integer
    // held in the low mantissa bits, which (unlike `as u8`, a scalar
    // saturating cast) vectorises.
    ((v + 128.0).clamp(0.0, 255.0) + 12_582_912.0).to_bits() as u8
}

/// Inverse-transforms the quantized coefficients `coef` (natural order)
/// with multipliers `q` into eight rows of eight samples at `out[0..]`,
/// `stride` apart, then zeroes `coef` for the next block. `any_ac`: some
/// coefficient other than DC is non-zero.
#[inline(always)]
pub(super) fn block(
    coef: &mut [i16; 64],
    q: &[f32; 64],
    any_ac: bool,
    out: &mut [u8],
    stride: usize,
) {
    if !any_ac {
        let v = to_u8(coef[0] as f32 * q[0]);
        for row in out.chunks_mut(stride).take(8) {
            row[..8].fill(v);
        }
        coef[0] = 0;
        return;
    }
    let mut rows = [[0f32; 8]; 8];
    for r in 0..8 {
        for c in 0..8 {
            rows[r][c] = coef[r * 8 + c] as f32 * q[r * 8 + c];
        }
    }
    // Columns first (lanes = columns), then rows (lanes = rows).
    let cols = idct8(&rows);
    let out_cols = idct8(&transpose(&cols));
    let px = transpose(&out_cols);
    for (row, v) in out.chunks_mut(stride).zip(px.iter()) {
        let mut bytes = [0u8; 8];
        for i in 0..8 {
            bytes[i] = to_u8(v[i]);
        }
        row[..8].copy_from_slice(&bytes);
    }
    *coef = [0; 64];
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inverse DCT by its definition, in f64.
    fn reference(coef: &[f64; 64]) -> [f64; 64] {
        let c = |k: usize| if k == 0 { 1.0 / 2f64.sqrt() } else { 1.0 };
        let mut out = [0f64; 64];
        for y in 0..8 {
            for x in 0..8 {
                let mut s = 0.0;
                for v in 0..8 {
                    for u in 0..8 {
                        s += c(u)
                            * c(v)
                            * coef[v * 8 + u]
                            * (((2 * x + 1) as f64 * u as f64 * std::f64::consts::PI) / 16.0).cos()
                            * (((2 * y + 1) as f64 * v as f64 * std::f64::consts::PI) / 16.0).cos();
                    }
                }
                out[y * 8 + x] = s / 4.0 + 128.0;
            }
        }
        out
    }

    #[test]
    fn matches_the_definition() {
        let mut state = 12345u32;
        let mut rand = move || {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((state >> 16) % 61) as i16 - 30
        };
        let quant: [u16; 64] = std::array::from_fn(|k| 1 + (k as u16 % 7));
        let q = multipliers(&quant);
        for trial in 0..50 {
            let mut coef = [0i16; 64];
            let mut exact = [0f64; 64];
            for k in 0..64 {
                // Decaying coefficients, like a photograph's.
                let v = if k < 20 || trial % 5 == 0 { rand() } else { 0 };
                let n = ZIGZAG[k] as usize;
                coef[n] = v;
                exact[n] = v as f64 * quant[k] as f64;
            }
            let want = reference(&exact);
            let mut out = [0u8; 8 * 11];
            block(&mut coef, &q, true, &mut out, 11);
            assert_eq!(coef, [0; 64], "coefficients are cleared");
            for y in 0..8 {
                for x in 0..8 {
                    let w = want[y * 8 + x].round().clamp(0.0, 255.0);
                    let g = out[y * 11 + x] as f64;
                    assert!((g - w).abs() <= 1.0, "trial {trial} ({x},{y}): {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn dc_only_blocks_fill_flat() {
        let q = multipliers(&[2; 64]);
        let mut coef = [0i16; 64];
        coef[0] = 40; // 40 * 2 / 8 = +10
        let mut out = [0u8; 64];
        block(&mut coef, &q, false, &mut out, 8);
        assert!(out.iter().all(|&v| v == 138));
    }
}
