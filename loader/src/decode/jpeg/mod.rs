//! A pure-Rust baseline JPEG decoder that decodes only a window of the
//! image, for crops (tf.image.decode_and_crop_jpeg's idea).
//!
//! The entropy-coded data is sequential, so every block above and beside
//! the window is still Huffman-decoded, but only blocks inside it are
//! inverse-transformed and colour-converted, and decoding stops after the
//! last block row the window needs. All buffers live in a per-thread
//! [`Scratch`], so a steady stream of images allocates nothing.
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

mod color;
mod huffman;
mod idct;
mod markers;
mod progressive;

use crate::decode::limits::MAX_ALLOC;
use huffman::{Bits, Table};
use markers::{Header, Scan};

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
    /// Upsampled rows of each component, and the upsampler's sums.
    rows: [Vec<u8>; 3],
    sums: Vec<u16>,
    wide: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            tables: Box::new(std::array::from_fn(|_| Table::empty())),
            planes: Default::default(),
            coefs: Default::default(),
            rows: Default::default(),
            sums: Vec::new(),
            wide: Vec::new(),
        }
    }
}

impl Scratch {
    /// Bytes held, for the RAM budget.
    pub(crate) fn bytes(&self) -> usize {
        self.planes
            .iter()
            .chain(&self.rows)
            .map(Vec::capacity)
            .sum::<usize>()
            + self.sums.capacity() * 2
            + self.wide.capacity()
            + std::mem::size_of::<[Table; 8]>()
    }
}

/// Which MCUs and component samples a window needs.
struct Geometry {
    mcus_x: usize,
    mcu_x0: usize,
    mcu_x1: usize,
    mcu_y0: usize,
    mcu_y1: usize,
    /// Width and height of each component's plane.
    planes: [(usize, usize); 3],
}

impl Geometry {
    fn new(h: &Header, win: Window) -> Self {
        let (mcu_w, mcu_h) = (8 * h.hmax, 8 * h.vmax);
        let mcus_x = h.width.div_ceil(mcu_w);
        // One MCU of margin where chroma is subsampled, for the upsampler's
        // neighbours.
        let mx = usize::from(h.hmax > 1);
        let my = usize::from(h.vmax > 1);
        let mcu_x0 = (win.x0 / mcu_w).saturating_sub(mx);
        let mcu_x1 = (win.x1.div_ceil(mcu_w) + mx).min(mcus_x);
        let mcu_y0 = (win.y0 / mcu_h).saturating_sub(my);
        let mcu_y1 = (win.y1.div_ceil(mcu_h) + my).min(h.height.div_ceil(mcu_h));
        let mut planes = [(0, 0); 3];
        for (p, c) in planes.iter_mut().zip(&h.comps[..h.ncomp]) {
            *p = ((mcu_x1 - mcu_x0) * c.h * 8, (mcu_y1 - mcu_y0) * c.v * 8);
        }
        Geometry {
            mcus_x,
            mcu_x0,
            mcu_x1,
            mcu_y0,
            mcu_y1,
            planes,
        }
    }
}

/// Decodes the window of `bytes` that `choose(width, height)` picks into
/// `out` as packed RGB8 (`window.width() * window.height() * 3` bytes at
/// the start; `out` only grows) and returns the window, or `None` when this
/// decoder does not take the file (see the module docs).
pub(crate) fn decode_window(
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    choose: impl FnOnce(usize, usize) -> Window,
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
    choose: impl FnOnce(usize, usize) -> Window,
) -> Option<Window> {
    decode::<idct::Fused>(bytes, scratch, out, choose)
}

#[inline(always)]
fn decode<M: idct::Madd>(
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    choose: impl FnOnce(usize, usize) -> Window,
) -> Option<Window> {
    let mut h = Header::new(bytes, &mut scratch.tables)?;
    let mut pos = 2;
    let first = h.next_scan(bytes, &mut pos, &mut scratch.tables)??;
    let win = choose(h.width, h.height);
    if win.x0 >= win.x1 || win.y0 >= win.y1 || win.x1 > h.width || win.y1 > h.height {
        return None;
    }
    let g = Geometry::new(&h, win);
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
        progressive::<M>(bytes, pos, first, &mut h, scratch, &g)?;
    } else {
        baseline::<M>(bytes.get(pos..)?, &first, &h, scratch, &g)?;
    }
    colour(&h, &g, win, scratch, out);
    Some(win)
}

/// The one scan of a baseline JPEG, down to the window's last MCU row;
/// only blocks inside the window are inverse-transformed.
#[inline(always)]
fn baseline<M: idct::Madd>(
    data: &[u8],
    scan: &Scan,
    h: &Header,
    s: &mut Scratch,
    g: &Geometry,
) -> Option<()> {
    let quant: [[f32; 64]; 4] = std::array::from_fn(|i| idct::multipliers(&h.quant[i]));
    let tables = &s.tables;
    let mut bits = Bits::new(data);
    let mut pred = [0i32; 3];
    let mut coef = [0i16; 64];
    let mut left = h.restart;
    for mcu_y in 0..g.mcu_y1 {
        for mcu_x in 0..g.mcus_x {
            if h.restart > 0 {
                if left == 0 {
                    if !bits.restart() {
                        return None;
                    }
                    pred = [0; 3];
                    left = h.restart;
                }
                left -= 1;
            }
            let inside = mcu_y >= g.mcu_y0 && mcu_x >= g.mcu_x0 && mcu_x < g.mcu_x1;
            for (si, &ci) in scan.order[..scan.ns].iter().enumerate() {
                let c = &h.comps[ci];
                let (dc, ac) = (&tables[c.td], &tables[4 + c.ta]);
                let stride = g.planes[ci].0;
                for by in 0..c.v {
                    for bx in 0..c.h {
                        let last = bits.block(dc, ac, &mut pred[si], &mut coef, inside)?;
                        if inside {
                            let x = ((mcu_x - g.mcu_x0) * c.h + bx) * 8;
                            let y = ((mcu_y - g.mcu_y0) * c.v + by) * 8;
                            let plane = &mut s.planes[ci][y * stride + x..];
                            let (rows, cols) = idct::extent(last);
                            idct::block::<M>(&coef, &quant[c.tq], rows, cols, plane, stride);
                            coef[..rows * 8].fill(0);
                        }
                    }
                }
            }
        }
    }
    bits.intact().then_some(())
}

/// Every scan of a progressive JPEG, each down to the window's last MCU
/// row, then the inverse transform of the window's blocks.
#[inline(always)]
fn progressive<M: idct::Madd>(
    bytes: &[u8],
    mut pos: usize,
    first: Scan,
    h: &mut Header,
    s: &mut Scratch,
    g: &Geometry,
) -> Option<()> {
    for (coefs, c) in s.coefs.iter_mut().zip(&h.comps[..h.ncomp]) {
        coefs.clear();
        coefs.resize(g.mcus_x * c.h * g.mcu_y1 * c.v * 64, 0);
    }
    let mut scan = first;
    loop {
        let mut bits = Bits::new(bytes.get(pos..)?);
        progressive_scan(&mut bits, &scan, h, s, g)?;
        pos = markers::skip_to_marker(bytes, pos + bits.position())?;
        match h.next_scan(bytes, &mut pos, &mut s.tables)? {
            Some(next) => scan = next,
            None => break,
        }
    }
    let quant: [[f32; 64]; 4] = std::array::from_fn(|i| idct::multipliers(&h.quant[i]));
    for (ci, c) in h.comps[..h.ncomp].iter().enumerate() {
        let blocks_x = g.mcus_x * c.h;
        let stride = g.planes[ci].0;
        for by in g.mcu_y0 * c.v..g.mcu_y1 * c.v {
            for bx in g.mcu_x0 * c.h..g.mcu_x1 * c.h {
                let at = (by * blocks_x + bx) * 64;
                let zigzag = s.coefs[ci].get(at..at + 64)?;
                let last = zigzag.iter().rposition(|&v| v != 0).unwrap_or(0);
                let mut coef = [0i16; 64];
                for (&n, &v) in huffman::ZIGZAG.iter().zip(&zigzag[..=last]) {
                    coef[n as usize] = v;
                }
                let (rows, cols) = idct::extent(last);
                let x = (bx - g.mcu_x0 * c.h) * 8;
                let y = (by - g.mcu_y0 * c.v) * 8;
                let plane = &mut s.planes[ci][y * stride + x..];
                idct::block::<M>(&coef, &quant[c.tq], rows, cols, plane, stride);
            }
        }
    }
    Some(())
}

/// One progressive scan, down to the window's last MCU row.
#[inline(always)]
fn progressive_scan(
    bits: &mut Bits,
    scan: &Scan,
    h: &Header,
    s: &mut Scratch,
    g: &Geometry,
) -> Option<()> {
    let tables = &s.tables;
    let mut state = progressive::State::default();
    let mut left = h.restart;
    let mut restart = |bits: &mut Bits, state: &mut progressive::State| {
        if h.restart > 0 {
            if left == 0 {
                if !bits.restart() {
                    return None;
                }
                *state = progressive::State::default();
                left = h.restart;
            }
            left -= 1;
        }
        Some(())
    };
    if scan.ns > 1 {
        // Interleaved (DC only): MCUs as in a baseline scan.
        for mcu_y in 0..g.mcu_y1 {
            for mcu_x in 0..g.mcus_x {
                restart(bits, &mut state)?;
                for si in 0..scan.ns {
                    let ci = scan.order[si];
                    let c = &h.comps[ci];
                    for by in 0..c.v {
                        for bx in 0..c.h {
                            let (x, y) = (mcu_x * c.h + bx, mcu_y * c.v + by);
                            let coef = block(&mut s.coefs[ci], g.mcus_x * c.h, x, y)?;
                            scan_block(bits, scan, h, tables, &mut state, si, coef)?;
                        }
                    }
                }
            }
        }
    } else {
        // One component: its own block grid, one block per MCU.
        let ci = scan.order[0];
        let c = &h.comps[ci];
        let cols = (h.width * c.h).div_ceil(h.hmax).div_ceil(8);
        let rows = (h.height * c.v)
            .div_ceil(h.vmax)
            .div_ceil(8)
            .min(g.mcu_y1 * c.v);
        for y in 0..rows {
            for x in 0..cols {
                restart(bits, &mut state)?;
                let coef = block(&mut s.coefs[ci], g.mcus_x * c.h, x, y)?;
                scan_block(bits, scan, h, tables, &mut state, 0, coef)?;
            }
        }
    }
    bits.intact().then_some(())
}

/// One block's part of a progressive scan; `si`: the component's place in
/// the scan.
#[inline(always)]
fn scan_block(
    bits: &mut Bits,
    scan: &Scan,
    h: &Header,
    tables: &[Table; 8],
    state: &mut progressive::State,
    si: usize,
    coef: &mut [i16; 64],
) -> Option<()> {
    let (ss, se, al) = (scan.ss, scan.se, scan.al);
    let c = &h.comps[scan.order[si]];
    let (dc, ac) = (&tables[c.td], &tables[4 + c.ta]);
    match (ss == 0, scan.ah == 0) {
        (true, true) => bits.dc_first(dc, &mut state.pred[si], &mut coef[0], al),
        (true, false) => {
            bits.dc_refine(&mut coef[0], al);
            Some(())
        }
        (false, true) => bits.ac_first(ac, coef, (ss, se, al), &mut state.eobrun),
        (false, false) => bits.ac_refine(ac, coef, (ss, se, al), &mut state.eobrun),
    }
}

/// Block `(bx, by)` of a component whose block rows are `blocks_x` long.
#[inline(always)]
fn block(coefs: &mut [i16], blocks_x: usize, bx: usize, by: usize) -> Option<&mut [i16; 64]> {
    let at = (by * blocks_x + bx) * 64;
    coefs.get_mut(at..at + 64)?.try_into().ok()
}

/// Upsampling and colour conversion of the window's rows into `out`.
#[inline(always)]
fn colour(h: &Header, g: &Geometry, win: Window, s: &mut Scratch, out: &mut Vec<u8>) {
    let (ww, wh) = (win.width(), win.height());
    if out.len() < ww * wh * 3 {
        out.resize(ww * wh * 3, 0);
    }
    let planes: [color::Plane; 3] = std::array::from_fn(|i| {
        let i = i.min(h.ncomp - 1);
        let c = &h.comps[i];
        let (x0, y0) = (g.mcu_x0 * c.h * 8, g.mcu_y0 * c.v * 8);
        let (pw, ph) = g.planes[i];
        color::Plane {
            samples: &s.planes[i],
            stride: pw,
            x0,
            y0,
            x_end: (x0 + pw).min((h.width * c.h).div_ceil(h.hmax)),
            y_end: (y0 + ph).min((h.height * c.v).div_ceil(h.vmax)),
            fx: h.hmax / c.h,
            fy: h.vmax / c.v,
            fancy: (h.width * c.h).div_ceil(h.hmax) > 2,
        }
    });
    for row in s.rows.iter_mut() {
        if row.len() < ww {
            row.resize(ww, 0);
        }
    }
    let [r0, r1, r2] = &mut s.rows;
    for (y, dst) in (win.y0..win.y1).zip(out.chunks_exact_mut(ww * 3)) {
        planes[0].upsample_row(y, win.x0, &mut r0[..ww], &mut s.sums, &mut s.wide);
        if h.ncomp == 1 {
            color::gray_to_rgb(&r0[..ww], dst);
        } else {
            planes[1].upsample_row(y, win.x0, &mut r1[..ww], &mut s.sums, &mut s.wide);
            planes[2].upsample_row(y, win.x0, &mut r2[..ww], &mut s.sums, &mut s.wide);
            color::ycbcr_to_rgb(&r0[..ww], &r1[..ww], &r2[..ww], dst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::codecs::jpeg::JpegEncoder;
    use image::{ExtendedColorType, ImageEncoder};

    fn photo(w: usize, h: usize) -> Vec<u8> {
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
                px.push((255.0 * fx) as u8);
                px.push((128.0 + 100.0 * (fx * 9.0 + fy * 4.0).sin()) as u8);
                px.push(((x * 7 + y * 13) % 256) as u8);
            }
        }
        px
    }

    fn encode(px: &[u8], w: usize, h: usize, color: ExtendedColorType, q: u8) -> Vec<u8> {
        let mut out = Vec::new();
        JpegEncoder::new_with_quality(&mut out, q)
            .write_image(px, w as u32, h as u32, color)
            .unwrap();
        out
    }

    fn full(w: usize, h: usize) -> Window {
        Window {
            x0: 0,
            y0: 0,
            x1: w,
            y1: h,
        }
    }

    /// Max and mean absolute difference of `win` against zune-jpeg's full decode.
    fn against_zune(jpeg: &[u8], win: Window) -> (u8, f64) {
        let mut zune = Vec::new();
        let (w, _) = crate::decode::zune("t", jpeg, &mut zune).unwrap();
        let mut ours = Vec::new();
        let got = decode_window(jpeg, &mut Scratch::default(), &mut ours, |_, _| win).unwrap();
        assert_eq!(got, win);
        let (mut max, mut sum) = (0u8, 0u64);
        for y in 0..win.height() {
            for x in 0..win.width() * 3 {
                let a = ours[y * win.width() * 3 + x];
                let b = zune[(win.y0 + y) * w * 3 + win.x0 * 3 + x];
                max = max.max(a.abs_diff(b));
                sum += a.abs_diff(b) as u64;
            }
        }
        (max, sum as f64 / (win.width() * win.height() * 3) as f64)
    }

    /// Every size from 1 to 17 pixels in each axis, for each chroma
    /// subsampling wick decodes (4:4:4, 4:2:2, 4:4:0, 4:2:0), baseline and
    /// progressive: decoded, not declined or panicking (1x1 and 2x1 4:2:0
    /// panicked in the upsampler), and with libjpeg's pixels, which PIL and
    /// torchvision give: within 3 levels of libjpeg-turbo (with the
    /// `turbojpeg` feature, as CI runs it). A component at most 2 samples
    /// wide is replicated, as libjpeg does (it was triangle-filtered: up to
    /// 60 levels off). zune-jpeg upsamples such tiny images otherwise (up
    /// to 60 levels from libjpeg), so it is the reference only for 4:4:4.
    #[test]
    fn tiny_images_of_every_size_and_subsampling_decode_as_libjpeg() {
        use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
        let mut worst = (0u8, String::new());
        for sampling in [
            SamplingFactor::F_1_1,
            SamplingFactor::F_2_1,
            SamplingFactor::F_1_2,
            SamplingFactor::F_2_2,
        ] {
            for progressive in [false, true] {
                for (w, h) in (1..=17).flat_map(|w| (1..=17).map(move |h| (w, h))) {
                    let rgb = photo(w, h);
                    let mut jpeg = Vec::new();
                    let mut enc = Encoder::new(&mut jpeg, 90);
                    enc.set_sampling_factor(sampling);
                    enc.set_progressive(progressive);
                    enc.encode(&rgb, w as u16, h as u16, ColorType::Rgb)
                        .unwrap();
                    let label = format!("{w}x{h} {sampling:?} progressive {progressive}");
                    let got = std::panic::catch_unwind(|| {
                        let mut out = Vec::new();
                        let win = |_, _| full(w, h);
                        (
                            decode_window(&jpeg, &mut Scratch::default(), &mut out, win),
                            out,
                        )
                    });
                    let (got, ours) = got.unwrap_or_else(|_| panic!("{label}: panicked"));
                    assert_eq!(got, Some(full(w, h)), "{label}: declined");
                    assert!(ours.len() >= w * h * 3, "{label}");
                    let mut max = 0;
                    if matches!(sampling, SamplingFactor::F_1_1) {
                        max = against_zune(&jpeg, full(w, h)).0;
                    }
                    #[cfg(feature = "turbojpeg")]
                    {
                        let mut turbo = Vec::new();
                        let crop = crate::geometry::Crop {
                            left: 0.0,
                            top: 0.0,
                            width: w as f64,
                            height: h as f64,
                        };
                        let all = |_, _| (crop, false);
                        let r = crate::decode::turbo::decode_region(&jpeg, &mut turbo, (w, h), all);
                        assert_eq!(r.map(|r| (r.width, r.height)), Some((w, h)), "{label}");
                        let n = w * h * 3;
                        let d = ours[..n]
                            .iter()
                            .zip(&turbo[..n])
                            .map(|(a, b)| a.abs_diff(*b));
                        max = max.max(d.max().unwrap());
                    }
                    if max > worst.0 {
                        worst = (max, label);
                    }
                }
            }
        }
        assert!(worst.0 <= 3, "worst against the reference: {worst:?}");
    }

    #[test]
    fn full_images_match_zune() {
        // image's encoder writes 4:2:0 colour and gray, both baseline.
        let (w, h) = (67, 45);
        let rgb = photo(w, h);
        let jpeg = encode(&rgb, w, h, ExtendedColorType::Rgb8, 90);
        let (max, mean) = against_zune(&jpeg, full(w, h));
        assert!(max <= 3 && mean < 0.6, "max {max} mean {mean}");
        let gray: Vec<u8> = rgb.chunks(3).map(|p| p[1]).collect();
        let jpeg = encode(&gray, w, h, ExtendedColorType::L8, 75);
        let (max, mean) = against_zune(&jpeg, full(w, h));
        assert!(max <= 2 && mean < 0.6, "max {max} mean {mean}");
    }

    #[test]
    fn windows_equal_the_same_pixels_of_the_full_decode() {
        let (w, h) = (203, 157);
        let jpeg = encode(&photo(w, h), w, h, ExtendedColorType::Rgb8, 85);
        let mut scratch = Scratch::default();
        let mut all = Vec::new();
        decode_window(&jpeg, &mut scratch, &mut all, |_, _| full(w, h)).unwrap();
        for (i, win) in [
            (0, 0, 5, 3),
            (17, 33, 120, 34),
            (150, 100, 203, 157),
            (1, 1, 202, 156),
        ]
        .into_iter()
        .enumerate()
        {
            let label = format!("window {i}");
            assert_window_is_part_of(&jpeg, &mut scratch, &all, w, win, &label);
        }
    }

    /// Decodes window `(x0, y0, x1, y1)` of `jpeg` and checks each row
    /// against the same pixels of `all`, the full decode (`w` wide).
    fn assert_window_is_part_of(
        jpeg: &[u8],
        scratch: &mut Scratch,
        all: &[u8],
        w: usize,
        (x0, y0, x1, y1): (usize, usize, usize, usize),
        label: &str,
    ) {
        let win = Window { x0, y0, x1, y1 };
        let mut part = vec![7u8; 3];
        decode_window(jpeg, scratch, &mut part, |_, _| win).unwrap();
        for y in 0..win.height() {
            let got = &part[y * win.width() * 3..(y + 1) * win.width() * 3];
            let start = ((win.y0 + y) * w + win.x0) * 3;
            assert_eq!(got, &all[start..start + got.len()], "{label}, row {y}");
        }
    }

    #[test]
    fn unsupported_and_damaged_files_are_declined() {
        let (w, h) = (40, 24);
        let jpeg = encode(&photo(w, h), w, h, ExtendedColorType::Rgb8, 80);
        let mut scratch = Scratch::default();
        let mut out = Vec::new();
        let any = |w, h| full(w, h);
        assert!(decode_window(&jpeg, &mut scratch, &mut out, any).is_some());
        // Truncated inside the entropy-coded data.
        let cut = &jpeg[..jpeg.len() * 2 / 3];
        assert!(decode_window(cut, &mut scratch, &mut out, any).is_none());
        // Every truncation and byte flip: never a panic.
        for n in 0..jpeg.len() {
            let _ = decode_window(&jpeg[..n], &mut scratch, &mut out, any);
            let mut bad = jpeg.clone();
            bad[n] ^= 0x5A;
            let _ = decode_window(&bad, &mut scratch, &mut out, any);
        }
        // Arithmetic coding is left to zune-jpeg.
        let mut sof9 = jpeg.clone();
        let at = sof9.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        sof9[at + 1] = 0xC9;
        assert!(decode_window(&sof9, &mut scratch, &mut out, any).is_none());
    }

    /// Pillow-written codings (tests/fixtures/make_fixtures.py) against
    /// Pillow's own decode, whole and by windows.
    #[test]
    fn progressive_and_restart_fixtures_match_libjpeg() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/jpeg");
        let mut scratch = Scratch::default();
        for name in ["prog420", "prog444", "prog_gray", "prog_rst", "base422_rst"] {
            let jpeg = std::fs::read(dir.join(format!("{name}.jpg"))).unwrap();
            let want = image::open(dir.join(format!("{name}.png")))
                .unwrap()
                .to_rgb8();
            let (w, h) = (want.width() as usize, want.height() as usize);
            let mut all = Vec::new();
            let got = decode_window(&jpeg, &mut scratch, &mut all, |_, _| full(w, h));
            assert_eq!(got, Some(full(w, h)), "{name} is decoded, not declined");
            let diffs: Vec<u8> = all[..w * h * 3]
                .iter()
                .zip(want.as_raw())
                .map(|(a, b)| a.abs_diff(*b))
                .collect();
            let max = *diffs.iter().max().unwrap();
            let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / diffs.len() as f64;
            assert!(max <= 4 && mean < 0.6, "{name}: max {max} mean {mean}");
            for win in [(0, 0, 9, 7), (13, 9, 40, 30), (30, 20, 61, 43)] {
                let label = format!("{name} {win:?}");
                assert_window_is_part_of(&jpeg, &mut scratch, &all, w, win, &label);
            }
        }
    }
}
