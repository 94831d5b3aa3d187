//! A pure-Rust baseline JPEG decoder that decodes only a window of the
//! image, for crops (tf.image.decode_and_crop_jpeg's idea).
//!
//! The entropy-coded data is sequential, so every block above and beside
//! the window is still Huffman-decoded (except, in a baseline scan, whole
//! restart intervals the window does not touch, skipped to their marker),
//! but only blocks inside it are inverse-transformed and colour-converted,
//! and decoding stops after the last block row the window needs. All
//! buffers live in a per-thread [`Scratch`], so a steady stream of images
//! allocates nothing.
//!
//! Progressive JPEGs keep every scan's coefficients for the block rows down
//! to the window's last, skip the rest of each scan to its end marker, and
//! inverse-transform only the window's blocks after the last scan.
//!
//! It takes 8-bit Huffman JPEGs, baseline (SOF0/SOF1) or progressive
//! (SOF2), gray or YCbCr, with sampling factors whose ratios to the largest
//! are 1 or 2 (4:4:4, 4:2:2, 4:2:0, 4:4:0), restart markers included.
//! Anything else (arithmetic, lossless, CMYK, RGB-coded, a damaged or
//! truncated file) returns `None` and the caller decodes with zune-jpeg,
//! which decodes or names the error.

mod baseline;
mod color;
mod huffman;
mod idct;
#[cfg(target_arch = "x86_64")]
mod idct_avx2;
mod markers;
mod progressive;
#[cfg(target_arch = "x86_64")]
mod ycc_avx2;

use crate::decode::limits::MAX_ALLOC;
use huffman::Table;
use markers::Header;

pub(crate) use crate::geometry::Window;

/// Per-thread decoder state, reused across images.
pub(crate) struct Scratch {
    /// DC tables 0..4, then AC tables 0..4.
    tables: Box<[Table; 8]>,
    /// Decoded samples of each component inside the window (plus margin).
    planes: [Vec<u8>; 3],
    /// Progressive JPEGs: each component's coefficients (zigzag order),
    /// block rows down to the window's last.
    coefs: [Vec<i16>; 3],
    /// Upsampled rows of each subsampled component, and the upsampler's
    /// sums.
    rows: [Vec<u8>; 3],
    sums: Vec<u16>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            tables: Box::new(std::array::from_fn(|_| Table::empty())),
            planes: Default::default(),
            coefs: Default::default(),
            rows: Default::default(),
            sums: Vec::new(),
        }
    }
}

impl Scratch {
    /// Frees the planes, coefficients and rows when they hold more than
    /// `bytes` (after a decode larger than a worker's share).
    pub(crate) fn shrink_to(&mut self, bytes: usize) {
        if self.bytes() > bytes {
            self.planes = Default::default();
            self.coefs = Default::default();
            self.rows = Default::default();
            self.sums = Vec::new();
        }
    }

    /// Bytes held, for the RAM budget.
    pub(crate) fn bytes(&self) -> usize {
        self.planes
            .iter()
            .chain(&self.rows)
            .map(Vec::capacity)
            .sum::<usize>()
            + self.sums.capacity() * 2
            + std::mem::size_of::<[Table; 8]>()
    }
}

/// Which MCUs and component samples a window needs, at a scale.
struct Geometry {
    mcus_x: usize,
    mcu_x0: usize,
    mcu_x1: usize,
    mcu_y0: usize,
    mcu_y1: usize,
    /// Width and height of each component's plane.
    planes: [(usize, usize); 3],
    /// Samples a side each component's blocks decode to: 8, or 4, 2, 1 at
    /// 1/2, 1/4, 1/8 scale; twice that for a component subsampled 2x in
    /// both axes (4:2:0 chroma), as libjpeg-turbo does, so it comes out at
    /// the image's scale and needs no upsampling.
    block: [usize; 3],
    /// The reduced inverse DCT of each component (`block` < 8).
    reduced: [Option<idct::Reduced>; 3],
    /// The image's size at the scale.
    width: usize,
    height: usize,
}

impl Geometry {
    /// `win` is in the image scaled by `1 / scale` (1, 2, 4 or 8).
    fn new(h: &Header, win: Window, scale: usize) -> Self {
        let luma = 8 / scale;
        let mut block = [luma; 3];
        for (b, c) in block.iter_mut().zip(&h.comps[..h.ncomp]) {
            if luma < 8 && h.hmax == 2 * c.h && h.vmax == 2 * c.v {
                *b = 2 * luma;
            }
        }
        let mcus_x = h.width.div_ceil(8 * h.hmax);
        let (mcu_w, mcu_h) = (luma * h.hmax, luma * h.vmax);
        // One MCU of margin where chroma is subsampled, for the upsampler's
        // neighbours.
        let mx = usize::from(h.hmax > 1);
        let my = usize::from(h.vmax > 1);
        let mcu_x0 = (win.x0 / mcu_w).saturating_sub(mx);
        let mcu_x1 = (win.x1.div_ceil(mcu_w) + mx).min(mcus_x);
        let mcu_y0 = (win.y0 / mcu_h).saturating_sub(my);
        let mcu_y1 = (win.y1.div_ceil(mcu_h) + my).min(h.height.div_ceil(8 * h.vmax));
        let mut planes = [(0, 0); 3];
        for ((p, c), &b) in planes.iter_mut().zip(&h.comps[..h.ncomp]).zip(&block) {
            *p = ((mcu_x1 - mcu_x0) * c.h * b, (mcu_y1 - mcu_y0) * c.v * b);
        }
        Geometry {
            mcus_x,
            mcu_x0,
            mcu_x1,
            mcu_y0,
            mcu_y1,
            planes,
            block,
            reduced: block.map(|b| (b < 8).then(|| idct::Reduced::new(b))),
            width: h.width.div_ceil(scale),
            height: h.height.div_ceil(scale),
        }
    }

    /// Whether MCUs `start..end` (in raster order, `start < end`) hold any
    /// the window needs: rows `mcu_y0..mcu_y1`, columns `mcu_x0..mcu_x1`.
    fn meets(&self, start: usize, end: usize) -> bool {
        let (ya, xa) = (start / self.mcus_x, start % self.mcus_x);
        let (yb, xb) = ((end - 1) / self.mcus_x, (end - 1) % self.mcus_x);
        // Row `y`'s MCUs `x0..=x1`.
        let row = |y: usize, x0: usize, x1: usize| {
            (self.mcu_y0..self.mcu_y1).contains(&y) && x0 < self.mcu_x1 && x1 >= self.mcu_x0
        };
        if ya == yb {
            return row(ya, xa, xb);
        }
        // The rows strictly between the first and the last are whole.
        row(ya, xa, self.mcus_x - 1)
            || row(yb, 0, xb)
            || (ya + 1).max(self.mcu_y0) < yb.min(self.mcu_y1)
    }
}

/// The scales the decoder decodes at: 1 (full), 1/2, 1/4 and 1/8.
pub(crate) const SCALES: [usize; 4] = [1, 2, 4, 8];

/// Decodes the window of `bytes` that `choose(width, height)` picks, with
/// the scale it picks (1, 2, 4 or 8: the image decoded at `1 / scale` of
/// its size, `ceil(width / scale) x ceil(height / scale)`, in the DCT
/// domain, and the window in that image's pixels), into `out` as packed
/// RGB8 (`window.width() * window.height() * 3` bytes at the start; `out`
/// only grows) and returns the window, or `None` when this decoder does
/// not take the file (see the module docs).
pub(crate) fn decode_window(
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    choose: impl FnOnce(usize, usize) -> (Window, usize),
) -> Option<Window> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("bmi2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: `decode_avx2` needs AVX2, BMI2 and FMA, and this CPU has
        // all three (detected just above).
        return unsafe { decode_avx2(bytes, scratch, out, choose) };
    }
    // Every aarch64 CPU has FMA.
    #[cfg(target_arch = "aarch64")]
    return decode::<idct::Fused>(bytes, scratch, out, choose);
    #[cfg(not(target_arch = "aarch64"))]
    decode::<idct::Separate>(bytes, scratch, out, choose)
}

/// [`decode`] compiled for AVX2 (wider IDCT, colour conversion and
/// upsampling), FMA (the IDCT's multiply-adds) and BMI2 (cheaper variable
/// shifts in the bit reader).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi2,fma")]
fn decode_avx2(
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    choose: impl FnOnce(usize, usize) -> (Window, usize),
) -> Option<Window> {
    decode::<idct::Avx2>(bytes, scratch, out, choose)
}

#[inline(always)]
fn decode<M: idct::Madd>(
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    choose: impl FnOnce(usize, usize) -> (Window, usize),
) -> Option<Window> {
    let mut h = Header::new(bytes, &mut scratch.tables)?;
    let mut pos = 2;
    let first = h.next_scan(bytes, &mut pos, &mut scratch.tables)??;
    let (win, scale) = choose(h.width, h.height);
    if !SCALES.contains(&scale) {
        return None;
    }
    let (sw, sh) = (h.width.div_ceil(scale), h.height.div_ceil(scale));
    if win.x0 >= win.x1 || win.y0 >= win.y1 || win.x1 > sw || win.y1 > sh {
        return None;
    }
    let g = Geometry::new(&h, win, scale);
    let mut bytes_needed = win.width() as u64 * win.height() as u64 * 3;
    for (c, &(pw, ph)) in h.comps[..h.ncomp].iter().zip(&g.planes) {
        bytes_needed += (pw * ph) as u64;
        if h.progressive {
            bytes_needed += (g.mcus_x * c.h * g.mcu_y1 * c.v * 64 * 2) as u64;
        }
    }
    if bytes_needed > MAX_ALLOC {
        return None;
    }
    for (plane, &(pw, ph)) in scratch.planes.iter_mut().zip(&g.planes[..h.ncomp]) {
        if plane.len() < pw * ph {
            plane.resize(pw * ph, 0);
        }
    }
    if h.progressive {
        progressive::progressive::<M>(bytes, pos, first, &mut h, scratch, &g)?;
    } else {
        baseline::baseline::<M>(bytes.get(pos..)?, &first, &h, scratch, &g)?;
    }
    color::convert(&h, &g, win, scratch, out);
    Some(win)
}

#[cfg(test)]
mod tests;
