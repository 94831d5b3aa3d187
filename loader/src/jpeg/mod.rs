//! A pure-Rust baseline JPEG decoder that decodes only a window of the
//! image, for crops (tf.image.decode_and_crop_jpeg's idea).
//!
//! The entropy-coded data is sequential, so every block above and beside
//! the window is still Huffman-decoded, but only blocks inside it are
//! inverse-transformed and colour-converted, and decoding stops after the
//! last block row the window needs. All buffers live in a per-thread
//! [`Scratch`], so a steady stream of images allocates nothing.
//!
//! It takes 8-bit baseline (SOF0/SOF1) Huffman JPEGs, gray or YCbCr, with
//! sampling factors whose ratios to the largest are 1 or 2 (4:4:4, 4:2:2,
//! 4:2:0, 4:4:0), restart markers included. Anything else (progressive,
//! arithmetic, CMYK, RGB-coded, a damaged or truncated file) returns `None`
//! and the caller decodes with zune-jpeg, which decodes or names the error.

mod color;
mod huffman;
mod idct;

use crate::decode::{MAX_ALLOC, MAX_SIDE};
use huffman::{Bits, Table};

/// A window of image pixels: columns `x0..x1`, rows `y0..y1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) x0: usize,
    pub(crate) y0: usize,
    pub(crate) x1: usize,
    pub(crate) y1: usize,
}

impl Window {
    pub(crate) fn width(&self) -> usize {
        self.x1 - self.x0
    }
    pub(crate) fn height(&self) -> usize {
        self.y1 - self.y0
    }
}

/// Per-thread decoder state, reused across images.
pub(crate) struct Scratch {
    /// DC tables 0..4, then AC tables 0..4.
    tables: Box<[Table; 8]>,
    /// Decoded samples of each component inside the window (plus margin).
    planes: [Vec<u8>; 3],
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

#[derive(Clone, Copy, Default)]
struct Component {
    id: u8,
    /// Sampling factors.
    h: usize,
    v: usize,
    /// Quantization table.
    tq: usize,
    /// Huffman tables of the scan.
    td: usize,
    ta: usize,
}

struct Header {
    width: usize,
    height: usize,
    comps: [Component; 3],
    ncomp: usize,
    /// Frame component index of each scan component, in scan order.
    order: [usize; 3],
    hmax: usize,
    vmax: usize,
    restart: usize,
    quant: [[u16; 64]; 4],
    scan_start: usize,
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]) as usize)
}

/// Reads the markers up to the first scan, filling the Huffman tables.
fn parse(bytes: &[u8], tables: &mut [Table; 8]) -> Option<Header> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    for t in tables.iter_mut() {
        t.defined = false;
    }
    let mut h = Header {
        width: 0,
        height: 0,
        comps: [Component::default(); 3],
        ncomp: 0,
        order: [0; 3],
        hmax: 1,
        vmax: 1,
        restart: 0,
        quant: [[0; 64]; 4],
        scan_start: 0,
    };
    let mut quant_defined = [false; 4];
    let mut adobe_transform = None;
    let mut pos = 2;
    loop {
        if *bytes.get(pos)? != 0xFF {
            return None;
        }
        while *bytes.get(pos)? == 0xFF {
            pos += 1;
        }
        let marker = bytes[pos];
        pos += 1;
        if matches!(marker, 0x01 | 0xD0..=0xD7) {
            continue;
        }
        let len = be16(bytes, pos)?;
        let seg = bytes.get(pos + 2..pos.checked_add(len)?)?;
        pos += len;
        match marker {
            0xC0 | 0xC1 => {
                if h.ncomp != 0 || *seg.first()? != 8 {
                    return None;
                }
                h.height = be16(seg, 1)?;
                h.width = be16(seg, 3)?;
                h.ncomp = *seg.get(5)? as usize;
                if h.width == 0 || h.height == 0 || !(h.ncomp == 1 || h.ncomp == 3) {
                    return None;
                }
                if h.width > MAX_SIDE as usize || h.height > MAX_SIDE as usize {
                    return None;
                }
                for i in 0..h.ncomp {
                    let c = seg.get(6 + 3 * i..9 + 3 * i)?;
                    let (hf, vf, tq) = ((c[1] >> 4) as usize, (c[1] & 15) as usize, c[2] as usize);
                    if !(1..=4).contains(&hf) || !(1..=4).contains(&vf) || tq > 3 {
                        return None;
                    }
                    h.comps[i] = Component {
                        id: c[0],
                        h: hf,
                        v: vf,
                        tq,
                        ..Component::default()
                    };
                }
                if h.ncomp == 1 {
                    // A single-component scan is never interleaved: its MCU
                    // is one block whatever the declared factors.
                    h.comps[0].h = 1;
                    h.comps[0].v = 1;
                }
                h.hmax = h.comps[..h.ncomp].iter().map(|c| c.h).max()?;
                h.vmax = h.comps[..h.ncomp].iter().map(|c| c.v).max()?;
                let ratio_ok = |max: usize, f: usize| max % f == 0 && max / f <= 2;
                if !h.comps[..h.ncomp]
                    .iter()
                    .all(|c| ratio_ok(h.hmax, c.h) && ratio_ok(h.vmax, c.v))
                {
                    return None;
                }
            }
            0xC4 => {
                let mut s = seg;
                while !s.is_empty() {
                    let class = (s[0] >> 4) as usize;
                    let id = (s[0] & 15) as usize;
                    if class > 1 || id > 3 {
                        return None;
                    }
                    let counts = s.get(1..17)?;
                    let total: usize = counts.iter().map(|&c| c as usize).sum();
                    let symbols = s.get(17..17 + total)?;
                    tables[class * 4 + id].build(counts, symbols)?;
                    s = &s[17 + total..];
                }
            }
            0xDB => {
                let mut s = seg;
                while !s.is_empty() {
                    let (precision, id) = ((s[0] >> 4) as usize, (s[0] & 15) as usize);
                    if precision > 1 || id > 3 {
                        return None;
                    }
                    let size = 64 * (precision + 1);
                    let values = s.get(1..1 + size)?;
                    for k in 0..64 {
                        h.quant[id][k] = if precision == 0 {
                            values[k] as u16
                        } else {
                            u16::from_be_bytes([values[2 * k], values[2 * k + 1]])
                        };
                    }
                    quant_defined[id] = true;
                    s = &s[1 + size..];
                }
            }
            0xDD => h.restart = be16(seg, 0)?,
            0xEE => {
                if seg.starts_with(b"Adobe") {
                    adobe_transform = Some(*seg.get(11)?);
                }
            }
            0xE0..=0xEF | 0xFE => {}
            0xDA => {
                if h.ncomp == 0 {
                    return None;
                }
                let ns = *seg.first()? as usize;
                if ns != h.ncomp || seg.len() != 4 + 2 * ns {
                    return None;
                }
                let mut seen = [false; 3];
                for i in 0..ns {
                    let (id, tables) = (seg[1 + 2 * i], seg[2 + 2 * i]);
                    let ci = h.comps[..h.ncomp].iter().position(|c| c.id == id)?;
                    if seen[ci] {
                        return None;
                    }
                    seen[ci] = true;
                    let c = &mut h.comps[ci];
                    c.td = (tables >> 4) as usize;
                    c.ta = (tables & 15) as usize;
                    if c.td > 3 || c.ta > 3 || !quant_defined[c.tq] {
                        return None;
                    }
                    h.order[i] = ci;
                }
                if seg[1 + 2 * ns..] != [0, 63, 0] {
                    return None;
                }
                let rgb_ids = h.ncomp == 3
                    && h.comps[0].id == b'R'
                    && h.comps[1].id == b'G'
                    && h.comps[2].id == b'B';
                if h.ncomp == 3 && (adobe_transform == Some(0) || rgb_ids) {
                    return None;
                }
                h.scan_start = pos;
                return Some(h);
            }
            // Progressive, lossless, arithmetic, hierarchical, DNL, EOI...
            _ => return None,
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
    decode(bytes, scratch, out, choose)
}

/// [`decode`] compiled for AVX2 (wider IDCT, colour conversion and
/// upsampling) and BMI2 (cheaper variable shifts in the bit reader).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi2,fma")]
fn decode_avx2(
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    choose: impl FnOnce(usize, usize) -> Window,
) -> Option<Window> {
    decode(bytes, scratch, out, choose)
}

#[inline(always)]
fn decode(
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
    choose: impl FnOnce(usize, usize) -> Window,
) -> Option<Window> {
    let h = parse(bytes, &mut scratch.tables)?;
    let win = choose(h.width, h.height);
    if win.x0 >= win.x1 || win.y0 >= win.y1 || win.x1 > h.width || win.y1 > h.height {
        return None;
    }
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

    let mut bytes_needed = win.width() as u64 * win.height() as u64 * 3;
    let mut geometry = [(0usize, 0usize); 3];
    for (i, c) in h.comps[..h.ncomp].iter().enumerate() {
        let pw = (mcu_x1 - mcu_x0) * c.h * 8;
        let ph = (mcu_y1 - mcu_y0) * c.v * 8;
        geometry[i] = (pw, ph);
        bytes_needed += (pw * ph) as u64;
    }
    if bytes_needed > MAX_ALLOC {
        return None;
    }
    for (plane, &(pw, ph)) in scratch.planes.iter_mut().zip(&geometry[..h.ncomp]) {
        if plane.len() < pw * ph {
            plane.resize(pw * ph, 0);
        }
    }
    let quant: [[f32; 64]; 4] = std::array::from_fn(|i| idct::multipliers(&h.quant[i]));

    // Entropy decoding, up to the last MCU row the window needs.
    let tables = &scratch.tables;
    for &ci in &h.order[..h.ncomp] {
        let c = &h.comps[ci];
        if !tables[c.td].defined || !tables[4 + c.ta].defined {
            return None;
        }
    }
    let mut bits = Bits::new(bytes.get(h.scan_start..)?);
    let mut pred = [0i32; 3];
    let mut coef = [0i16; 64];
    let mut left = h.restart;
    for mcu_y in 0..mcu_y1 {
        for mcu_x in 0..mcus_x {
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
            let inside = mcu_y >= mcu_y0 && mcu_x >= mcu_x0 && mcu_x < mcu_x1;
            for (si, &ci) in h.order[..h.ncomp].iter().enumerate() {
                let c = &h.comps[ci];
                let (dc, ac) = (&tables[c.td], &tables[4 + c.ta]);
                let stride = geometry[ci].0;
                for by in 0..c.v {
                    for bx in 0..c.h {
                        let last = bits.block(dc, ac, &mut pred[si], &mut coef, inside)?;
                        if inside {
                            let x = ((mcu_x - mcu_x0) * c.h + bx) * 8;
                            let y = ((mcu_y - mcu_y0) * c.v + by) * 8;
                            let plane = &mut scratch.planes[ci][y * stride + x..];
                            idct::block(&mut coef, &quant[c.tq], last, plane, stride);
                        }
                    }
                }
            }
        }
    }
    if !bits.intact() {
        return None;
    }

    // Upsampling and colour conversion of the window's rows.
    let (ww, wh) = (win.width(), win.height());
    if out.len() < ww * wh * 3 {
        out.resize(ww * wh * 3, 0);
    }
    let planes: [color::Plane; 3] = std::array::from_fn(|i| {
        let c = &h.comps[i.min(h.ncomp - 1)];
        let (x0, y0) = (mcu_x0 * c.h * 8, mcu_y0 * c.v * 8);
        let (pw, ph) = geometry[i.min(h.ncomp - 1)];
        color::Plane {
            samples: &scratch.planes[i.min(h.ncomp - 1)],
            stride: pw,
            x0,
            y0,
            x_end: (x0 + pw).min((h.width * c.h).div_ceil(h.hmax)),
            y_end: (y0 + ph).min((h.height * c.v).div_ceil(h.vmax)),
            fx: h.hmax / c.h,
            fy: h.vmax / c.v,
        }
    });
    for row in scratch.rows.iter_mut() {
        if row.len() < ww {
            row.resize(ww, 0);
        }
    }
    let [r0, r1, r2] = &mut scratch.rows;
    for (y, dst) in (win.y0..win.y1).zip(out.chunks_exact_mut(ww * 3)) {
        planes[0].upsample_row(
            y,
            win.x0,
            &mut r0[..ww],
            &mut scratch.sums,
            &mut scratch.wide,
        );
        if h.ncomp == 1 {
            color::gray_to_rgb(&r0[..ww], dst);
        } else {
            planes[1].upsample_row(
                y,
                win.x0,
                &mut r1[..ww],
                &mut scratch.sums,
                &mut scratch.wide,
            );
            planes[2].upsample_row(
                y,
                win.x0,
                &mut r2[..ww],
                &mut scratch.sums,
                &mut scratch.wide,
            );
            color::ycbcr_to_rgb(&r0[..ww], &r1[..ww], &r2[..ww], dst);
        }
    }
    Some(win)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_rgb_into;
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
        let (w, _) = decode_rgb_into("t", jpeg, &mut zune).unwrap();
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
            let win = Window {
                x0: win.0,
                y0: win.1,
                x1: win.2,
                y1: win.3,
            };
            let mut part = vec![7u8; 3];
            decode_window(&jpeg, &mut scratch, &mut part, |_, _| win).unwrap();
            for y in 0..win.height() {
                let got = &part[y * win.width() * 3..(y + 1) * win.width() * 3];
                let start = ((win.y0 + y) * w + win.x0) * 3;
                assert_eq!(got, &all[start..start + got.len()], "window {i}, row {y}");
            }
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
        // Progressive is left to zune-jpeg.
        let mut sof2 = jpeg.clone();
        let at = sof2.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        sof2[at + 1] = 0xC2;
        assert!(decode_window(&sof2, &mut scratch, &mut out, any).is_none());
    }
}
