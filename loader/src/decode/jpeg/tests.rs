//! The window decoder against zune-jpeg and libjpeg-turbo, on generated
//! images of every size and subsampling and on fixtures.

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
    let got = decode_window(jpeg, &mut Scratch::default(), &mut ours, |_, _| (win, 1)).unwrap();
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
                    let win = |_, _| (full(w, h), 1);
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
                    let all = |_, _| (crate::geometry::Crop::whole(w, h), false);
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
    decode_window(&jpeg, &mut scratch, &mut all, |_, _| (full(w, h), 1)).unwrap();
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
    decode_window(jpeg, scratch, &mut part, |_, _| (win, 1)).unwrap();
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
    let any = |w, h| (full(w, h), 1);
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
        let got = decode_window(&jpeg, &mut scratch, &mut all, |_, _| (full(w, h), 1));
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
        // Scaled, where coefficients the reduced transform does not read
        // are skipped (libjpeg's progressive script refines bands that
        // span them): close to the box averages of the full decode.
        let rgb = &all[..w * h * 3];
        for k in [2usize, 4, 8] {
            let (sw, sh) = (w.div_ceil(k), h.div_ceil(k));
            let mut scaled = Vec::new();
            let got = decode_window(&jpeg, &mut scratch, &mut scaled, |_, _| (full(sw, sh), k));
            assert_eq!(got, Some(full(sw, sh)), "{name} 1/{k}");
            let want = box_average(rgb, w, h, k);
            let n = sw * sh * 3;
            let sum: f64 = scaled[..n]
                .iter()
                .zip(&want)
                .map(|(a, b)| a.abs_diff(*b) as f64)
                .sum();
            let mean = sum / n as f64;
            assert!(
                mean <= 3.0,
                "{name} 1/{k}: mean difference {mean} from the box average"
            );
        }
    }
}

/// A smooth photo-like image: its detail is below the frequencies a 1/8
/// scale keeps, so every scale should reproduce its box averages.
fn smooth(w: usize, h: usize) -> Vec<u8> {
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let (x, y) = (x as f32, y as f32);
            px.push((128.0 + 60.0 * (x / 23.0).sin() + 40.0 * (y / 17.0).cos()) as u8);
            px.push((128.0 + 50.0 * (x / 31.0 + y / 29.0).sin()) as u8);
            px.push((128.0 + 70.0 * (y / 19.0 - x / 41.0).cos()) as u8);
        }
    }
    px
}

/// `k x k` box averages of a `w x h` RGB image (edge boxes over the pixels
/// they hold), `ceil(w / k) x ceil(h / k)`.
fn box_average(px: &[u8], w: usize, h: usize, k: usize) -> Vec<u8> {
    let (sw, sh) = (w.div_ceil(k), h.div_ceil(k));
    let mut out = vec![0u8; sw * sh * 3];
    for y in 0..sh {
        for x in 0..sw {
            for c in 0..3 {
                let (mut sum, mut n) = (0u32, 0u32);
                for yy in y * k..((y + 1) * k).min(h) {
                    for xx in x * k..((x + 1) * k).min(w) {
                        sum += px[(yy * w + xx) * 3 + c] as u32;
                        n += 1;
                    }
                }
                out[(y * sw + x) * 3 + c] = ((sum + n / 2) / n) as u8;
            }
        }
    }
    out
}

/// Decoding at 1/2, 1/4 and 1/8 scale, baseline and progressive, gray and
/// every chroma subsampling, sizes that are and are not whole MCUs: the
/// image comes out `ceil(w / k) x ceil(h / k)`, close to the box average
/// of the full-size decode (zune-jpeg's: a mean difference of at most 3
/// levels, worst for 4:4:0 at 1/8, whose chroma is upsampled from a
/// sample per 8 x 16 pixels), and a window of it decodes to exactly the
/// same pixels as the whole scaled image holds there.
#[test]
fn scaled_decodes_are_box_averages_and_windows_agree() {
    use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
    let mut worst_mean = (0f64, String::new());
    for (sampling, gray) in [
        (SamplingFactor::F_1_1, false),
        (SamplingFactor::F_2_1, false),
        (SamplingFactor::F_1_2, false),
        (SamplingFactor::F_2_2, false),
        (SamplingFactor::F_1_1, true),
    ] {
        for progressive in [false, true] {
            for (w, h) in [(250, 190), (97, 61), (64, 48), (33, 17), (9, 8), (5, 3)] {
                let rgb = smooth(w, h);
                let mut jpeg = Vec::new();
                let mut enc = Encoder::new(&mut jpeg, 92);
                enc.set_sampling_factor(sampling);
                enc.set_progressive(progressive);
                if gray {
                    let luma: Vec<u8> = rgb.chunks(3).map(|p| p[1]).collect();
                    enc.encode(&luma, w as u16, h as u16, ColorType::Luma)
                } else {
                    enc.encode(&rgb, w as u16, h as u16, ColorType::Rgb)
                }
                .unwrap();
                let mut zune = Vec::new();
                crate::decode::zune("t", &jpeg, &mut zune).unwrap();
                for k in [2usize, 4, 8] {
                    let label =
                        format!("{w}x{h} {sampling:?} gray {gray} progressive {progressive} 1/{k}");
                    let (sw, sh) = (w.div_ceil(k), h.div_ceil(k));
                    let mut whole = Vec::new();
                    let mut scratch = Scratch::default();
                    let got =
                        decode_window(&jpeg, &mut scratch, &mut whole, |_, _| (full(sw, sh), k));
                    assert_eq!(got, Some(full(sw, sh)), "{label}");
                    let want = box_average(&zune, w, h, k);
                    let n = sw * sh * 3;
                    let diff: Vec<u8> = whole[..n]
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| a.abs_diff(*b))
                        .collect();
                    let mean = diff.iter().map(|&d| d as f64).sum::<f64>() / n as f64;
                    // A tiny image's blocks are mostly the encoder's
                    // padding, which the box average of its pixels leaves
                    // out: only its shape and windows are checked.
                    if w >= 64 && mean > worst_mean.0 {
                        worst_mean = (mean, label.clone());
                    }
                    // Windows of the scaled image: the same pixels.
                    for (x0, y0, x1, y1) in [(0, 0, 1, 1), (1, 2, sw, sh), (sw / 3, sh / 2, sw, sh)]
                    {
                        let win = Window { x0, y0, x1, y1 };
                        if win.x0 >= win.x1 || win.y0 >= win.y1 {
                            continue;
                        }
                        let mut part = Vec::new();
                        let got = decode_window(&jpeg, &mut scratch, &mut part, |_, _| (win, k));
                        assert_eq!(got, Some(win), "{label} {win:?}");
                        for y in 0..win.height() {
                            let row = &part[y * win.width() * 3..][..win.width() * 3];
                            let at = ((win.y0 + y) * sw + win.x0) * 3;
                            assert_eq!(row, &whole[at..at + row.len()], "{label} {win:?} row {y}");
                        }
                    }
                }
            }
        }
    }
    eprintln!("worst mean difference from the box average: {worst_mean:?}");
    assert!(worst_mean.0 <= 3.0, "{worst_mean:?}");
}

/// `Geometry::meets` against a walk over every MCU of the interval, for
/// every interval start and length on a small grid and several windows.
#[test]
fn restart_intervals_meet_the_window_as_their_mcus_do() {
    for (x0, x1, y0, y1) in [(0, 5, 0, 4), (2, 3, 1, 3), (0, 1, 3, 4), (4, 5, 0, 1)] {
        let g = Geometry {
            mcus_x: 5,
            mcu_x0: x0,
            mcu_x1: x1,
            mcu_y0: y0,
            mcu_y1: y1,
            planes: [(0, 0); 3],
            block: [8; 3],
            reduced: [None, None, None],
            width: 40,
            height: 32,
        };
        for start in 0..30 {
            for len in 1..14 {
                let want = (start..start + len)
                    .any(|i| (y0..y1).contains(&(i / 5)) && (x0..x1).contains(&(i % 5)));
                assert_eq!(
                    g.meets(start, start + len),
                    want,
                    "{start}+{len} {x0}..{x1} {y0}..{y1}"
                );
            }
        }
    }
}
