//! Encoded bytes to RGB8 pixels in a reused buffer, with limits against
//! hostile files.
//!
//! JPEG (nearly every training image) goes to wick's own decoder
//! ([`crate::decode::jpeg`], per-thread tables and planes, nothing allocated per
//! image), and what it does not take (arithmetic coding, CMYK, damage) to
//! zune-jpeg, the decoder inside the `image` crate, which decodes or names
//! the error; both write into the caller's buffer. Other formats go
//! through `image` and are converted to RGB.

mod bmp;
pub(crate) mod jpeg;
pub(crate) mod limits;
#[cfg(feature = "turbojpeg")]
pub(crate) mod turbo;

use crate::error::{Error, Result};
use crate::geometry::{relative, Crop, Size, Window};
use image::{DynamicImage, ImageReader};
pub(crate) use limits::Limits;
pub(crate) use limits::DEFAULT_MAX_PIXELS;
use limits::{MAX_ALLOC, MAX_SIDE};
use std::io::Cursor;
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

/// Which decoder takes JPEGs in the fused decode+transform path: wick's own
/// crop-window decoder by default, libjpeg-turbo with the `turbojpeg`
/// feature (zune-jpeg behind either for what they decline).
pub const JPEG_DECODER: &str = if cfg!(feature = "turbojpeg") {
    "libjpeg-turbo (crop window, DCT scaling)"
} else {
    "wick window decoder (pure Rust, crop window)"
};

/// What [`decode_for_crop`] produced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Decoded {
    /// Only the crop's window (a JPEG, at full or reduced scale): the
    /// buffer holds `width x height` pixels, and `crop` is relative to them.
    Window {
        width: usize,
        height: usize,
        crop: Crop,
        flip: bool,
    },
    /// The whole `width x height` image: the caller picks the crop from
    /// the full size, exactly as for pixels that come decoded (a cache).
    Whole { width: usize, height: usize },
}

/// The DCT scale a crop of `crop` resampled to `out` pixels is decoded at:
/// the largest of 1/8, 1/4 and 1/2 at which the crop is still at least the
/// output's size in both axes (so the resampler still only shrinks), else
/// full size. libjpeg-turbo's path picks the same.
pub(crate) fn dct_scale(crop: &Crop, (out_w, out_h): (usize, usize)) -> usize {
    [8usize, 4, 2]
        .into_iter()
        .find(|&k| crop.width / k as f64 >= out_w as f64 && crop.height / k as f64 >= out_h as f64)
        .unwrap_or(1)
}

/// `crop` in the image scaled by `1 / k`.
fn scaled(crop: Crop, k: usize) -> Crop {
    let k = k as f64;
    Crop {
        left: crop.left / k,
        top: crop.top / k,
        width: crop.width / k,
        height: crop.height / k,
    }
}

/// The one decoder dispatch of the decode+transform path: decodes what the
/// crop that `plan` picks for the image's full size needs, into `out`.
/// `plan` gives the crop and the flip, and `window(crop, w, h)` the window
/// of pixels the resampler reads for a crop of a `w x h` image (see
/// `ImageTransform`). JPEGs go to libjpeg-turbo (feature `turbojpeg`: crop
/// window, DCT scaling), then wick's window decoder (crop window, DCT
/// scaling: [`dct_scale`]), then a whole decode ([`decode_rgb_into`]:
/// zune-jpeg for what wick declines); other formats decode whole. Errors
/// name `key`.
pub(crate) fn decode_for_crop(
    key: &str,
    bytes: &[u8],
    (jpeg, limits): (&mut jpeg::Scratch, &Limits),
    out: &mut Vec<u8>,
    out_size: (usize, usize),
    plan: impl Fn(usize, usize) -> (Crop, bool),
    window: impl Fn(Crop, usize, usize) -> Window,
) -> Result<Decoded> {
    limits.check(key, bytes)?;
    if bytes.starts_with(&[0xFF, 0xD8]) {
        #[cfg(feature = "turbojpeg")]
        {
            if let Some(r) = turbo::decode_region(bytes, out, out_size, &plan) {
                return Ok(Decoded::Window {
                    width: r.width,
                    height: r.height,
                    crop: r.crop,
                    flip: r.flip,
                });
            }
        }
        let mut picked = None;
        let choose = |w: usize, h: usize| {
            let (crop, flip) = plan(w, h);
            let k = dct_scale(&crop, out_size);
            let crop = scaled(crop, k);
            picked = Some((crop, flip));
            (window(crop, w.div_ceil(k), h.div_ceil(k)), k)
        };
        if let Some(win) = jpeg::decode_window(bytes, jpeg, out, choose) {
            if let Some((crop, flip)) = picked {
                return Ok(Decoded::Window {
                    width: win.width(),
                    height: win.height(),
                    crop: relative(crop, &win),
                    flip,
                });
            }
        }
    }
    let Size { width, height } = decode_checked(key, bytes, out)?;
    Ok(Decoded::Whole { width, height })
}

/// Decodes `bytes` (JPEG, PNG, WebP, BMP; format sniffed from the bytes)
/// into `out` as packed RGB8 and returns `(width, height)`: the pixels are
/// `out[..width * height * 3]`. `out` grows to fit and can be reused across
/// calls so decoding allocates nothing. Grayscale,
/// palette, CMYK and alpha images become RGB (alpha is dropped, as PIL's
/// `convert("RGB")` does). An image of more than 89,478,485 pixels (Pillow's default limit)
/// is refused from its header ([`Error::ImageTooLarge`]). Errors name
/// `key`.
pub fn decode_rgb_into(key: &str, bytes: &[u8], out: &mut Vec<u8>) -> Result<Size> {
    Limits::default().check(key, bytes)?;
    decode_checked(key, bytes, out)
}

/// [`decode_rgb_into`] once the limits were checked. A decoder that
/// panics (the `tiff` crate 0.11 asserts on some valid tiled planar TIFFs)
/// is this file's error, not the worker's or `wick inspect`'s end.
fn decode_checked(key: &str, bytes: &[u8], out: &mut Vec<u8>) -> Result<Size> {
    if bytes.is_empty() {
        return Err(Error::EmptyFile { key: key.into() });
    }
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if bytes.starts_with(&[0xFF, 0xD8]) {
            decode_jpeg(key, bytes, out)
        } else {
            decode_other(key, bytes, out)
        }
    }));
    let (w, h) = match decoded {
        Ok(d) => d?,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let tiff = bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*");
            let what = if tiff {
                "the TIFF decoder (the tiff crate) failed on this file's layout: some tiled or \
                 planar (one plane a channel) TIFFs are not decoded; re-save it as \
                 contiguous strips"
            } else {
                "the decoder panicked"
            };
            return Err(decode_error(
                key,
                std::io::Error::other(format!("{what} ({message})")),
            ));
        }
    };
    if w == 0 || h == 0 {
        return Err(Error::Transform {
            key: key.into(),
            reason: "image has zero width or height".into(),
            source: None,
        });
    }
    Ok(Size::new(w, h))
}

/// A decoder's error for sample `key`, kept whole as the source.
fn decode_error(key: &str, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Decode {
        key: key.into(),
        source: Box::new(source),
    }
}

thread_local! {
    static JPEG: std::cell::RefCell<jpeg::Scratch> = Default::default();
}

/// The pixels a decoded cache may keep for `bytes`: `Some` with the size
/// when they are what an uncached run decodes (then resamples through the
/// crop window), `None` when the file must stay encoded in the cache so
/// that every epoch decodes it exactly as an uncached run does: a JPEG that
/// wick's own decoder does not decode whole (damaged below a crop window
/// that still decodes, or a kind it leaves to zune-jpeg), every JPEG when
/// libjpeg-turbo decodes crop windows (the `turbojpeg` feature), and a JPEG
/// at least twice `out` (the output its crops are resized to) in both
/// axes, whose larger crops an uncached run decodes at a reduced DCT scale
/// ([`dct_scale`]), which no resampling of full-size pixels reproduces bit
/// for bit.
pub(crate) fn decode_for_cache(
    key: &str,
    bytes: &[u8],
    out: &mut Vec<u8>,
    limits: &Limits,
    out_size: Option<(usize, usize)>,
) -> Result<Option<Size>> {
    limits.check(key, bytes)?;
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return decode_checked(key, bytes, out).map(Some);
    }
    if cfg!(feature = "turbojpeg") {
        return Ok(None);
    }
    let scalable = |f: limits::JpegFrame| {
        out_size.is_some_and(|(ow, oh)| {
            usize::from(f.width) >= 2 * ow && usize::from(f.height) >= 2 * oh
        })
    };
    if limits::jpeg_frame(bytes).is_some_and(scalable) {
        return Ok(None);
    }
    Ok(own_whole(bytes, out)
        .filter(|&(w, h)| w > 0 && h > 0)
        .map(|(w, h)| Size::new(w, h)))
}

/// The whole JPEG `bytes` at full size by libjpeg-turbo into `out` as
/// packed RGB8, or `None` where it declines (the large-photo bench times it
/// beside wick's own decoder).
#[cfg(feature = "turbojpeg")]
pub fn turbo_whole(bytes: &[u8], out: &mut Vec<u8>) -> Option<(usize, usize)> {
    let frame = limits::jpeg_frame(bytes)?;
    let (w, h) = (usize::from(frame.width), usize::from(frame.height));
    let whole = |w: usize, h: usize| (Crop::whole(w, h), false);
    turbo::decode_region(bytes, out, (w, h), whole).map(|r| (r.width, r.height))
}

/// The whole image by wick's own JPEG decoder, or `None` where it declines.
fn own_whole(bytes: &[u8], out: &mut Vec<u8>) -> Option<(usize, usize)> {
    let whole = |w, h| {
        let win = Window {
            x0: 0,
            y0: 0,
            x1: w,
            y1: h,
        };
        (win, 1)
    };
    JPEG.with(|s| jpeg::decode_window(bytes, &mut s.borrow_mut(), out, whole))
        .map(|win| (win.width(), win.height()))
}

fn decode_jpeg(key: &str, bytes: &[u8], out: &mut Vec<u8>) -> Result<(usize, usize)> {
    match own_whole(bytes, out) {
        Some(wh) => Ok(wh),
        None => zune(key, bytes, out),
    }
}

/// Decodes with zune-jpeg.
pub(crate) fn zune(key: &str, bytes: &[u8], out: &mut Vec<u8>) -> Result<(usize, usize)> {
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_strict_mode(false)
        .set_max_width(MAX_SIDE as usize)
        .set_max_height(MAX_SIDE as usize);
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder.decode_headers().map_err(|e| decode_error(key, e))?;
    let (w, h) = decoder
        .dimensions()
        .ok_or_else(|| decode_error(key, std::io::Error::other("no image dimensions")))?;
    let size = decoder
        .output_buffer_size()
        .ok_or_else(|| decode_error(key, std::io::Error::other("no output size")))?;
    if size as u64 > MAX_ALLOC || size != w * h * 3 {
        return Err(decode_error(
            key,
            std::io::Error::other(format!("{w}x{h} RGB image exceeds the decode limit")),
        ));
    }
    // Grow only: shrinking and re-growing would zero-fill on every larger image.
    if out.len() < size {
        out.resize(size, 0);
    }
    decoder
        .decode_into(&mut out[..size])
        .map_err(|e| decode_error(key, e))?;
    Ok((w, h))
}

fn decode_other(key: &str, bytes: &[u8], out: &mut Vec<u8>) -> Result<(usize, usize)> {
    // BMP variants the decoder refuses, rewritten (see `bmp`).
    let fixed = bmp::normalize(bytes);
    let (bytes, flip) = match &fixed {
        Some((b, flip)) => (b.as_slice(), *flip),
        None => (bytes, false),
    };
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| decode_error(key, image::ImageError::IoError(e)))?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_ALLOC);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| decode_error(key, e))?;
    let rgb = match img {
        DynamicImage::ImageRgb8(rgb) => rgb,
        other => other.to_rgb8(),
    };
    let (w, h) = (rgb.width() as usize, rgb.height() as usize);
    *out = rgb.into_raw();
    if flip {
        bmp::flip_rows(out, w);
    }
    Ok((w, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};

    fn encode(img: DynamicImage, fmt: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, fmt).unwrap();
        out.into_inner()
    }

    /// A decoded cache keeps the pixels of a JPEG whose crops are never
    /// decoded at a reduced scale (smaller than twice the output in an
    /// axis), and keeps a larger one encoded; without an output size it
    /// keeps the pixels. Other formats are always decoded.
    #[cfg(not(feature = "turbojpeg"))]
    #[test]
    fn a_decoded_cache_keeps_jpegs_that_scaled_decoding_would_change_encoded() {
        let jpeg = |w, h| {
            encode(
                DynamicImage::ImageRgb8(RgbImage::new(w, h)),
                ImageFormat::Jpeg,
            )
        };
        let limits = Limits::default();
        let cached = |bytes: &[u8], out| {
            decode_for_cache("t", bytes, &mut Vec::new(), &limits, out).unwrap()
        };
        assert_eq!(
            cached(&jpeg(63, 80), Some((32, 32))),
            Some(Size::new(63, 80))
        );
        assert_eq!(
            cached(&jpeg(80, 63), Some((32, 32))),
            Some(Size::new(80, 63))
        );
        assert_eq!(cached(&jpeg(64, 64), Some((32, 32))), None);
        assert_eq!(cached(&jpeg(64, 64), None), Some(Size::new(64, 64)));
        let png = encode(
            DynamicImage::ImageRgb8(RgbImage::new(64, 64)),
            ImageFormat::Png,
        );
        assert_eq!(cached(&png, Some((32, 32))), Some(Size::new(64, 64)));
    }

    fn decode(bytes: &[u8]) -> (usize, usize, Vec<u8>) {
        let mut out = Vec::new();
        let Size {
            width: w,
            height: h,
        } = decode_rgb_into("t", bytes, &mut out).unwrap();
        (w, h, out)
    }

    /// A tiled TIFF of one plane a channel (PlanarConfiguration 2),
    /// `w`x`h` in tiles of 16x16 (those at the edges padded, as TIFF
    /// stores them), uncompressed: plane `c` holds `value(c, x, y)`.
    fn tiled_planar_tiff(
        (w, h): (usize, usize),
        value: impl Fn(usize, usize, usize) -> u8,
    ) -> Vec<u8> {
        let tile = 16usize;
        let (across, down) = (w.div_ceil(tile), h.div_ceil(tile));
        let tiles: Vec<Vec<u8>> = (0..3)
            .flat_map(|c| {
                let value = &value;
                (0..across * down).map(move |t| {
                    let (tx, ty) = ((t % across) * tile, (t / across) * tile);
                    (0..tile * tile)
                        .map(|i| value(c, tx + i % tile, ty + i / tile))
                        .collect()
                })
            })
            .collect();
        // Header, IFD of 11 entries, then bits, offsets, counts, tiles.
        let ifd_len = 2 + 11 * 12 + 4;
        let bits_at = 8 + ifd_len;
        let offsets_at = bits_at + 6;
        let counts_at = offsets_at + 4 * tiles.len();
        let data_at = counts_at + 4 * tiles.len();
        let mut b = b"II*\0".to_vec();
        b.extend(8u32.to_le_bytes());
        b.extend(11u16.to_le_bytes());
        let mut entry = |tag: u16, ty: u16, count: u32, value: u32| {
            b.extend(tag.to_le_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(count.to_le_bytes());
            b.extend(value.to_le_bytes());
        };
        let (short, long) = (3, 4);
        entry(256, short, 1, w as u32);
        entry(257, short, 1, h as u32);
        entry(258, short, 3, bits_at as u32);
        entry(259, short, 1, 1);
        entry(262, short, 1, 2);
        entry(277, short, 1, 3);
        entry(284, short, 1, 2);
        entry(322, short, 1, tile as u32);
        entry(323, short, 1, tile as u32);
        entry(324, long, tiles.len() as u32, offsets_at as u32);
        entry(325, long, tiles.len() as u32, counts_at as u32);
        b.extend(0u32.to_le_bytes());
        for _ in 0..3 {
            b.extend(8u16.to_le_bytes());
        }
        for i in 0..tiles.len() {
            b.extend(((data_at + i * tile * tile) as u32).to_le_bytes());
        }
        for t in &tiles {
            b.extend((t.len() as u32).to_le_bytes());
        }
        for t in &tiles {
            b.extend(t);
        }
        b
    }

    /// A valid tiled planar TIFF: decoded exactly, or refused as this
    /// file's error saying which layout; never a panic that ends a worker
    /// or `wick inspect` (the tiff crate 0.11 asserts on it).
    #[test]
    fn a_tiled_planar_tiff_is_decoded_or_its_own_error() {
        let value = |c: usize, x: usize, y: usize| (c * 80 + x * 2 + y) as u8;
        // The fixture `wick inspect`'s test reads is this file.
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tiled_planar.tif"
        );
        if std::env::var_os("WICK_WRITE_FIXTURES").is_some() {
            std::fs::write(fixture, tiled_planar_tiff((40, 24), value)).unwrap();
        }
        assert!(std::fs::read(fixture).unwrap() == tiled_planar_tiff((40, 24), value));
        for (w, h) in [(32, 32), (40, 24)] {
            let tiff = tiled_planar_tiff((w, h), value);
            let mut out = Vec::new();
            match decode_rgb_into("planar.tif", &tiff, &mut out) {
                Ok(size) => {
                    assert_eq!((size.width, size.height), (w, h));
                    let want: Vec<u8> = (0..w * h)
                        .flat_map(|i| (0..3).map(move |c| value(c, i % w, i / w)))
                        .collect();
                    assert!(out[..want.len()] == want[..], "{w}x{h}: pixels differ");
                }
                Err(e) => {
                    let text = crate::error::error_chain(&e);
                    assert!(e.is_sample_error(), "{text}");
                    assert!(
                        text.contains("planar.tif") && text.contains("TIFF"),
                        "{text}"
                    );
                }
            }
        }
    }

    /// A TIFF decodes exactly; an animated GIF gives its first frame, as
    /// Pillow's `Image.open(..).convert("RGB")` and torchvision do.
    #[test]
    fn tiff_and_the_first_frame_of_a_gif_decode() {
        let img = RgbImage::from_fn(13, 7, |x, y| Rgb([x as u8 * 19, y as u8 * 31, 200]));
        let (w, h, px) = decode(&encode(img.clone().into(), ImageFormat::Tiff));
        assert_eq!((w, h, px), (13, 7, img.clone().into_raw()));

        let frame = |c: u8| {
            let rgba = RgbaImage::from_pixel(6, 4, Rgba([c, 255 - c, c / 2, 255]));
            image::Frame::new(rgba)
        };
        let mut gif = Vec::new();
        {
            let mut enc = image::codecs::gif::GifEncoder::new(&mut gif);
            enc.encode_frames([frame(10), frame(240)]).unwrap();
        }
        let (w, h, px) = decode(&gif);
        assert_eq!((w, h), (6, 4));
        assert_eq!(&px[..3], &[10, 245, 5], "the first frame");
    }

    #[test]
    fn gray_and_alpha_become_rgb() {
        let gray = GrayImage::from_pixel(3, 2, image::Luma([77]));
        let (w, h, px) = decode(&encode(gray.clone().into(), ImageFormat::Png));
        assert_eq!((w, h), (3, 2));
        assert_eq!(&px[15..18], [77, 77, 77]);
        let (w, h, px) = decode(&encode(gray.into(), ImageFormat::Jpeg));
        assert_eq!((w, h, px.len()), (3, 2, 18));
        assert!(px.iter().all(|&v| v.abs_diff(77) <= 2), "{px:?}");
        let rgba = RgbaImage::from_pixel(2, 2, Rgba([10, 20, 30, 0]));
        let (_, _, px) = decode(&encode(rgba.into(), ImageFormat::Png));
        assert_eq!(&px[..3], [10, 20, 30]);
    }

    #[test]
    fn jpeg_decodes_into_the_reused_buffer() {
        let img = RgbImage::from_pixel(17, 9, Rgb([200, 40, 90]));
        let jpeg = encode(img.into(), ImageFormat::Jpeg);
        let mut out = vec![1u8; 10_000];
        let Size {
            width: w,
            height: h,
        } = decode_rgb_into("j", &jpeg, &mut out).unwrap();
        assert_eq!(
            (w, h, out.len()),
            (17, 9, 10_000),
            "the buffer is not shrunk"
        );
        let px = &out[..17 * 9 * 3];
        assert!(px
            .chunks(3)
            .all(|p| p[0].abs_diff(200) <= 3 && p[1].abs_diff(40) <= 3));
    }

    #[test]
    fn garbage_truncated_and_empty_name_the_key() {
        let mut out = Vec::new();
        let e = decode_rgb_into("dir/x.jpg", b"not an image", &mut out).unwrap_err();
        assert!(e.to_string().contains("dir/x.jpg"));
        let e = decode_rgb_into("dir/y.jpg", b"", &mut out).unwrap_err();
        assert!(matches!(e, Error::EmptyFile { .. }), "{e}");
        let e = decode_rgb_into("dir/z.jpg", &[0xFF, 0xD8, 0xFF], &mut out).unwrap_err();
        assert!(e.to_string().contains("dir/z.jpg"), "{e}");
    }
}
