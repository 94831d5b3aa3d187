//! The 8x8 inverse DCT as two passes of an 8x8 matrix product in `f32`,
//! written on rows of eight lanes so the compiler vectorises them, with no
//! transposes. Rows and columns of coefficients that are all zero (most of
//! them in a photograph's block) are skipped.

use super::huffman::ZIGZAG;

/// `BASIS[k][y] = c(k) / 2 * cos((2y + 1) k pi / 16)`, `c(0) = 1 / sqrt(2)`,
/// else 1: one 1-D inverse DCT is `x[y] = sum over k of BASIS[k][y] * X[k]`.
#[allow(clippy::excessive_precision)]
const BASIS: [[f32; 8]; 8] = [
    [
        0.353553391,
        0.353553391,
        0.353553391,
        0.353553391,
        0.353553391,
        0.353553391,
        0.353553391,
        0.353553391,
    ],
    [
        0.490392640,
        0.415734806,
        0.277785117,
        0.097545161,
        -0.097545161,
        -0.277785117,
        -0.415734806,
        -0.490392640,
    ],
    [
        0.461939766,
        0.191341716,
        -0.191341716,
        -0.461939766,
        -0.461939766,
        -0.191341716,
        0.191341716,
        0.461939766,
    ],
    [
        0.415734806,
        -0.097545161,
        -0.490392640,
        -0.277785117,
        0.277785117,
        0.490392640,
        0.097545161,
        -0.415734806,
    ],
    [
        0.353553391,
        -0.353553391,
        -0.353553391,
        0.353553391,
        0.353553391,
        -0.353553391,
        -0.353553391,
        0.353553391,
    ],
    [
        0.277785117,
        -0.490392640,
        0.097545161,
        0.415734806,
        -0.415734806,
        -0.097545161,
        0.490392640,
        -0.277785117,
    ],
    [
        0.191341716,
        -0.461939766,
        0.461939766,
        -0.191341716,
        -0.191341716,
        0.461939766,
        -0.461939766,
        0.191341716,
    ],
    [
        0.097545161,
        -0.277785117,
        0.415734806,
        -0.490392640,
        0.490392640,
        -0.415734806,
        0.277785117,
        -0.097545161,
    ],
];

/// For the last non-zero zigzag position `k`: how many leading rows and
/// columns of the block can hold non-zero coefficients.
const EXTENT: [(u8, u8); 64] = {
    let mut out = [(0u8, 0u8); 64];
    let (mut rows, mut cols) = (0u8, 0u8);
    let mut k = 0;
    while k < 64 {
        let n = ZIGZAG[k];
        if n / 8 + 1 > rows {
            rows = n / 8 + 1;
        }
        if n % 8 + 1 > cols {
            cols = n % 8 + 1;
        }
        out[k] = (rows, cols);
        k += 1;
    }
    out
};

/// A DQT table in zigzag order as multipliers in natural order.
pub(super) fn multipliers(zigzag: &[u16; 64]) -> [f32; 64] {
    let mut out = [0f32; 64];
    for (k, &q) in zigzag.iter().enumerate() {
        out[ZIGZAG[k] as usize] = q as f32;
    }
    out
}

/// How the transform multiplies and adds: fused where the CPU has FMA (one
/// instruction, one rounding), separately elsewhere (where `mul_add` would
/// be a slow library call).
pub(super) trait Madd {
    /// Dense 8x8 blocks take the AVX2 transform (`idct_avx2`).
    const AVX2: bool = false;
    /// `a * b + c`.
    fn madd(a: f32, b: f32, c: f32) -> f32;
}

/// `a * b + c` as two operations.
pub(super) struct Separate;

impl Madd for Separate {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// `a * b + c` as one fused multiply-add.
#[cfg(any(target_arch = "aarch64", test))]
pub(super) struct Fused;

#[cfg(any(target_arch = "aarch64", test))]
impl Madd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// [`Fused`], with dense 8x8 blocks on the AVX2 transform: only for code
/// that runs after checking the CPU has AVX2 and FMA (`decode_avx2`).
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Madd for Avx2 {
    const AVX2: bool = true;
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

#[inline(always)]
fn to_u8(v: f32) -> u8 {
    // Clamp, then adding 1.5 * 2^23 rounds to an integer held in the low
    // mantissa bits, which (unlike `as u8`, a scalar saturating cast)
    // vectorises.
    (v.clamp(0.0, 255.0) + 12_582_912.0).to_bits() as u8
}

/// How many leading rows and columns of a block can be non-zero when the
/// last non-zero coefficient is at zigzag position `last`.
#[inline(always)]
pub(super) fn extent(last: usize) -> (usize, usize) {
    let (rows, cols) = EXTENT[last.min(63)];
    (rows as usize, cols as usize)
}

/// Blocks with more leading non-zero rows and columns than this together
/// take the AAN transform where there is one (its cost does not depend on
/// them; the matrix form's grows with both).
#[cfg(target_arch = "x86_64")]
const DENSE: usize = 4;

/// A block whose only coefficient is the DC term, at any size: `size` rows
/// of `size` samples of its mean (`BASIS[0][0]^2 = 1/8` of it), `stride`
/// apart.
#[inline(always)]
fn dc_only(coef: &[i16; 64], q: &[f32; 64], size: usize, out: &mut [u8], stride: usize) {
    let v = to_u8(coef[0] as f32 * q[0] * 0.125 + 128.0);
    for row in out.chunks_mut(stride).take(size) {
        row[..size].fill(v);
    }
}

/// A quantization table's multipliers for each form of the transform.
pub(super) struct Quant {
    /// For the matrix form: the table in natural order.
    pub(super) plain: [f32; 64],
    /// For the AVX2 AAN form (x86-64).
    #[cfg(target_arch = "x86_64")]
    aan: [f32; 64],
}

impl Quant {
    /// A DQT table in zigzag order.
    pub(super) fn new(zigzag: &[u16; 64]) -> Self {
        let plain = multipliers(zigzag);
        Quant {
            #[cfg(target_arch = "x86_64")]
            aan: super::idct_avx2::multipliers(&plain),
            plain,
        }
    }
}

/// Inverse-transforms the quantized coefficients `coef` (natural order)
/// with multipliers `q` into eight rows of eight samples at `out[0..]`,
/// `stride` apart. Only the first `rows` rows and `cols` columns of `coef`
/// may be non-zero.
#[inline(always)]
pub(super) fn block<M: Madd>(
    coef: &[i16; 64],
    q: &Quant,
    rows: usize,
    cols: usize,
    out: &mut [u8],
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if M::AVX2 && rows + cols > DENSE {
        // SAFETY: only `Avx2` sets `M::AVX2`, and only `decode_avx2` uses
        // it, called after checking that the CPU has AVX2 and FMA.
        return unsafe { super::idct_avx2::block(coef, &q.aan, out, stride) };
    }
    let q = &q.plain;
    if rows == 1 && cols == 1 {
        return dc_only(coef, q, 8, out, stride);
    }
    // Columns: work[y][u] = sum over v of BASIS[v][y] * X[v][u].
    let mut work = [[0f32; 8]; 8];
    for v in 0..rows {
        let mut x = [0f32; 8];
        for u in 0..8 {
            x[u] = coef[v * 8 + u] as f32 * q[v * 8 + u];
        }
        for (y, w) in work.iter_mut().enumerate() {
            let b = BASIS[v][y];
            for u in 0..8 {
                w[u] = M::madd(b, x[u], w[u]);
            }
        }
    }
    // Rows: out[y][x] = 128 + sum over u of work[y][u] * BASIS[u][x].
    for (w, row) in work.iter().zip(out.chunks_mut(stride)) {
        let mut acc = [128f32; 8];
        for u in 0..cols {
            for x in 0..8 {
                acc[x] = M::madd(w[u], BASIS[u][x], acc[x]);
            }
        }
        let mut bytes = [0u8; 8];
        for x in 0..8 {
            bytes[x] = to_u8(acc[x]);
        }
        row[..8].copy_from_slice(&bytes);
    }
}

/// The inverse DCT of a block at 1/2, 1/4 or 1/8 scale (`size` 4, 2 or 1
/// samples a side), from its lowest `size x size` coefficients, as
/// libjpeg's scaled IDCTs (`jidctred.c`) do: a `size`-point transform of
/// them, level-shifted as the full one. Each basis function is also
/// multiplied by its mean over the `8 / size` full-scale samples an output
/// sample stands for (`sin(s k pi / 16) / (s sin(k pi / 16))`, `s = 8 /
/// size`), so a block comes out as the exact box average of its full-scale
/// decode, less the frequencies above the reduced block's (which a box
/// average would alias).
pub(super) struct Reduced {
    size: usize,
    /// The last zigzag position of the coefficients it reads.
    pub(super) kmax: usize,
    /// `basis[k][y]`, for `k, y < size`.
    basis: [[f32; 4]; 4],
}

impl Reduced {
    /// The transform to `size` samples a side: 1, 2 or 4.
    pub(super) fn new(size: usize) -> Self {
        debug_assert!(matches!(size, 1 | 2 | 4));
        let s = (8 / size) as f64;
        let mut basis = [[0f32; 4]; 4];
        for (k, row) in basis.iter_mut().enumerate().take(size) {
            let c = if k == 0 { 0.5f64.sqrt() } else { 1.0 };
            let theta = k as f64 * std::f64::consts::PI / 16.0;
            let mean = if k == 0 {
                1.0
            } else {
                (s * theta).sin() / (s * theta.sin())
            };
            for (y, b) in row.iter_mut().enumerate().take(size) {
                let phase =
                    (2 * y + 1) as f64 * k as f64 * std::f64::consts::PI / (2 * size) as f64;
                *b = (c / 2.0 * phase.cos() * mean) as f32;
            }
        }
        let kmax = (0..64)
            .filter(|&k| {
                let n = ZIGZAG[k] as usize;
                n / 8 < size && n % 8 < size
            })
            .max()
            .unwrap_or(0);
        Self { size, kmax, basis }
    }

    /// Inverse-transforms `coef` (as [`block`]) into `size` rows of `size`
    /// samples at `out[0..]`, `stride` apart.
    #[inline(always)]
    pub(super) fn block<M: Madd>(
        &self,
        coef: &[i16; 64],
        q: &[f32; 64],
        rows: usize,
        cols: usize,
        out: &mut [u8],
        stride: usize,
    ) {
        let n = self.size;
        let (rows, cols) = (rows.min(n), cols.min(n));
        if rows == 1 && cols == 1 || n == 1 {
            return dc_only(coef, q, n, out, stride);
        }
        let mut work = [[0f32; 4]; 4];
        for v in 0..rows {
            let mut x = [0f32; 4];
            for u in 0..cols {
                x[u] = coef[v * 8 + u] as f32 * q[v * 8 + u];
            }
            for (y, w) in work.iter_mut().enumerate().take(n) {
                let b = self.basis[v][y];
                for u in 0..4 {
                    w[u] = M::madd(b, x[u], w[u]);
                }
            }
        }
        for (w, row) in work.iter().zip(out.chunks_mut(stride)).take(n) {
            for (xx, o) in row[..n].iter_mut().enumerate() {
                let mut acc = 128f32;
                for (u, &wu) in w.iter().enumerate().take(cols) {
                    acc = M::madd(wu, self.basis[u][xx], acc);
                }
                *o = to_u8(acc);
            }
        }
    }
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
        let q = Quant::new(&quant);
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
            let last = (0..64)
                .rev()
                .find(|&k| coef[ZIGZAG[k] as usize] != 0)
                .unwrap_or(0);
            let (rows, cols) = extent(last);
            assert_eq!(extent(63), (8, 8));
            block::<Separate>(&coef, &q, rows, cols, &mut out, 11);
            let mut fused = [0u8; 8 * 11];
            block::<Fused>(&coef, &q, rows, cols, &mut fused, 11);
            assert!(out.iter().zip(&fused).all(|(a, b)| a.abs_diff(*b) <= 1));
            let mut forms = vec![("matrix", out)];
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                let mut aan = [0u8; 8 * 11];
                // SAFETY: this CPU has AVX2 and FMA (checked just above).
                unsafe { super::super::idct_avx2::block(&coef, &q.aan, &mut aan, 11) };
                forms.push(("AAN", aan));
            }
            for (form, out) in forms {
                for y in 0..8 {
                    for x in 0..8 {
                        let w = want[y * 8 + x].round().clamp(0.0, 255.0);
                        let g = out[y * 11 + x] as f64;
                        assert!(
                            (g - w).abs() <= 1.0,
                            "{form}, trial {trial} ({x},{y}): {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    /// A reduced block is the box average of the full-scale block, less
    /// the frequencies it cannot hold: with only those present, exactly
    /// the average (to rounding).
    #[test]
    fn reduced_blocks_are_box_averages_of_the_full_block() {
        let quant: [u16; 64] = std::array::from_fn(|k| 1 + (k as u16 % 5));
        let q = multipliers(&quant);
        let mut state = 99u32;
        let mut rand = move || {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((state >> 16) % 41) as i16 - 20
        };
        for size in [1usize, 2, 4] {
            let r = Reduced::new(size);
            let s = 8 / size;
            for trial in 0..20 {
                // Coefficients only below the reduced block's frequencies,
                // small enough that nothing clamps.
                let mut coef = [0i16; 64];
                for v in 0..size {
                    for u in 0..size {
                        coef[v * 8 + u] = if u + v == 0 { rand() * 4 } else { rand() / 2 };
                    }
                }
                let mut exact = [0f64; 64];
                for (k, &z) in ZIGZAG.iter().enumerate() {
                    exact[z as usize] = coef[z as usize] as f64 * quant[k] as f64;
                }
                let full = reference(&exact);
                let mut out = [0u8; 4 * 5];
                let (rows, cols) = (size, size);
                r.block::<Separate>(&coef, &q, rows, cols, &mut out, 5);
                for y in 0..size {
                    for x in 0..size {
                        let mut mean = 0.0;
                        for dy in 0..s {
                            for dx in 0..s {
                                mean += full[(y * s + dy) * 8 + x * s + dx];
                            }
                        }
                        let mean = (mean / (s * s) as f64).clamp(0.0, 255.0);
                        let got = out[y * 5 + x] as f64;
                        assert!(
                            (got - mean).abs() <= 1.0,
                            "size {size} trial {trial} ({x},{y}): {got} vs {mean}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn dc_only_blocks_fill_flat() {
        let q = Quant::new(&[2; 64]);
        let mut coef = [0i16; 64];
        coef[0] = 40; // 40 * 2 / 8 = +10
        let mut out = [0u8; 64];
        block::<Separate>(&coef, &q, 1, 1, &mut out, 8);
        assert!(out.iter().all(|&v| v == 138));
    }
}
