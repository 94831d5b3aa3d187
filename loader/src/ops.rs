//! The building blocks of the built-in image map, public for user maps
//! ([`crate::map`]): crop parameters, decode into reused buffers, an
//! antialiased bilinear resample of a crop into a slot (with the flip and
//! the normalization), and a nearest-neighbour resample for label maps
//! that follows exactly the same geometry.
//!
//! The built-in [`ImageClassification`](crate::map::ImageClassification)
//! map is [`Resize::decode_into`] with the crop of
//! [`RandomResizedCrop::draw`] (training) or [`center_crop`] (evaluation):
//! a map built from these runs the same code.

use crate::error::{Error, Result};
use crate::geometry::Size;
use crate::layout::HostLayout;
use crate::transform::{ImageTransform, Transforms};
use rand::Rng;

pub use crate::geometry::Crop;
pub use crate::layout::Slot;
pub use crate::transform::Scratch;

/// torchvision's `RandomResizedCrop(scale, ratio)` and
/// `RandomHorizontalFlip(0.5)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResizedCrop {
    /// Range of the crop's area as a fraction of the image's area.
    pub scale: (f64, f64),
    /// Range of the crop's aspect ratio (width / height).
    pub ratio: (f64, f64),
    /// Flip horizontally with probability 0.5.
    pub flip: bool,
}

impl Default for RandomResizedCrop {
    /// torchvision's defaults: scale `(0.08, 1)`, ratio `(3/4, 4/3)`, with
    /// the flip.
    fn default() -> Self {
        Self {
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip: true,
        }
    }
}

impl RandomResizedCrop {
    /// The crop and flip for an `width x height` image, drawn from `rng`
    /// (pass [`Sample::rng`](crate::map::Sample::rng): the built-in map's
    /// draws for the sample).
    pub fn draw(&self, rng: &mut impl Rng, width: usize, height: usize) -> (Crop, bool) {
        crate::transform::random_resized_crop_and_flip(
            rng, width, height, self.scale, self.ratio, self.flip,
        )
    }
}

/// torchvision's evaluation crop: `Resize(resize)` (the shorter side to
/// `resize`) then `CenterCrop(out)`, as a box of the `width x height`
/// image's pixels.
pub fn center_crop(width: usize, height: usize, resize: usize, out: Size) -> Crop {
    crate::transform::center_crop(width, height, resize, (out.width, out.height))
}

/// What [`Resize::decode_into`] did: the decoded image's size, and the
/// crop (in its pixels) and flip applied, so a map can apply the same
/// geometry to another part (a mask).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resized {
    /// The image's full size.
    pub image: Size,
    /// The crop that was resized to the output.
    pub crop: Crop,
    /// Whether it was flipped.
    pub flip: bool,
}

/// Resizes a crop of an RGB image to a fixed output, as `u8 [h, w, 3]` or
/// normalized `f32 [3, h, w]`: the built-in map's resampler (antialiased
/// bilinear, PIL's and torchvision's `antialias=True` filter), flip and
/// normalization.
#[derive(Debug, Clone)]
pub struct Resize {
    inner: ImageTransform,
}

impl Resize {
    /// `u8 [height, width, 3]` output of `size`.
    pub fn new(size: Size) -> Result<Self> {
        Self::with_layout(size, HostLayout::U8Nhwc)
    }

    /// `f32 [3, height, width]` output of `size`, `(v / 255 - mean[c]) /
    /// std[c]` (0..1 scale).
    pub fn normalized(size: Size, mean: [f32; 3], std: [f32; 3]) -> Result<Self> {
        Self::with_layout(size, HostLayout::F32Nchw { mean, std })
    }

    fn with_layout(size: Size, layout: HostLayout) -> Result<Self> {
        // The transform's own crop rule is never used: every call passes
        // its crop.
        let resize = size.width.max(size.height);
        let inner = ImageTransform::new(Transforms::ResizeCenterCrop { resize }, layout, size, 0)?;
        Ok(Self { inner })
    }

    /// Elements of one output (`h * w * 3`).
    pub fn slot_len(&self) -> usize {
        self.inner.slot_len()
    }

    /// Decodes the encoded image `bytes` (JPEG, PNG, WebP, BMP) and writes
    /// the crop `plan(width, height)` chooses, flipped if it says so,
    /// resized into `out`. A JPEG is decoded only in the window the resize
    /// reads. `plan` may be called more than once and must give the same
    /// answer each time (draw from a fresh clone of the sample's rng).
    /// Errors name `key`.
    pub fn decode_into(
        &self,
        scratch: &mut Scratch,
        key: &str,
        bytes: &[u8],
        plan: impl Fn(usize, usize) -> (Crop, bool),
        out: Slot<'_>,
    ) -> Result<Resized> {
        // A crop outside the image never reaches the resampler: the whole
        // image stands in for it and the sample is an error.
        let outside = std::cell::Cell::new(None);
        let checked = |w, h| {
            let (crop, flip) = plan(w, h);
            if inside(crop, Size::new(w, h)) {
                (crop, flip)
            } else {
                outside.set(Some((crop, w, h)));
                (Crop::whole(w, h), flip)
            }
        };
        let a = self
            .inner
            .apply_planned(scratch, key, bytes, checked, out)?;
        if let Some((crop, w, h)) = outside.get() {
            return Err(outside_error(key, crop, Size::new(w, h)));
        }
        Ok(Resized {
            image: a.image,
            crop: a.crop,
            flip: a.flip,
        })
    }

    /// Writes `crop` of the decoded packed RGB image `rgb` of `size`,
    /// flipped if `flip`, resized into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn resample_into(
        &self,
        scratch: &mut Scratch,
        key: &str,
        rgb: &[u8],
        size: Size,
        crop: Crop,
        flip: bool,
        out: Slot<'_>,
    ) -> Result<()> {
        if !inside(crop, size) {
            return Err(outside_error(key, crop, size));
        }
        self.inner
            .resample_decoded(scratch, key, rgb, size, (crop, flip), out)
    }
}

/// Whether `crop` is a non-empty box inside an image of `size`.
fn inside(crop: Crop, size: Size) -> bool {
    crop.left >= 0.0
        && crop.top >= 0.0
        && crop.width > 0.0
        && crop.height > 0.0
        && crop.left + crop.width <= size.width as f64 + 1e-9
        && crop.top + crop.height <= size.height as f64 + 1e-9
}

fn outside_error(key: &str, crop: Crop, size: Size) -> Error {
    Error::Transform {
        key: key.into(),
        reason: format!(
            "crop {crop:?} is not inside the {}x{} image",
            size.width, size.height
        ),
        source: None,
    }
}

/// Decodes an encoded image into packed RGB8 `out` (cleared and reused),
/// returning its size. Errors name `key`.
pub fn decode_rgb_into(key: &str, bytes: &[u8], out: &mut Vec<u8>) -> Result<Size> {
    crate::decode::decode_rgb_into(key, bytes, out)
}

/// Largest label map [`decode_label_map_into`] decodes, in pixels.
const MAX_LABEL_PIXELS: u64 = 1 << 28;

/// Decodes a PNG label map into one byte per pixel in `out` (cleared and
/// reused), returning its size: the palette **index** of an indexed PNG
/// (Pascal VOC's masks), the value of an 8-bit grayscale one (ADE20K,
/// Cityscapes' label ids). Other PNGs (colour, 16-bit, alpha) and other
/// formats are an error naming `key`: a colour-coded mask needs its own
/// colour-to-class table.
pub fn decode_label_map_into(key: &str, bytes: &[u8], out: &mut Vec<u8>) -> Result<Size> {
    let bad = |reason: String, source: Option<crate::error::BoxError>| Error::Transform {
        key: key.into(),
        reason,
        source,
    };
    let mut dec = png::Decoder::new(std::io::Cursor::new(bytes));
    dec.set_transformations(png::Transformations::IDENTITY);
    let mut reader = dec
        .read_info()
        .map_err(|e| bad("not a readable PNG label map".into(), Some(Box::new(e))))?;
    let (w, h) = reader.info().size();
    let (color, depth) = reader.output_color_type();
    let unpack = match (color, depth) {
        (png::ColorType::Grayscale, png::BitDepth::Eight)
        | (png::ColorType::Indexed, png::BitDepth::Eight) => 8,
        (png::ColorType::Indexed, png::BitDepth::Four) => 4,
        (png::ColorType::Indexed, png::BitDepth::Two) => 2,
        (png::ColorType::Indexed, png::BitDepth::One) => 1,
        other => {
            return Err(bad(
                format!(
                    "label map is {other:?}: only 8-bit grayscale or indexed PNGs hold class ids"
                ),
                None,
            ))
        }
    };
    if w == 0 || h == 0 || u64::from(w) * u64::from(h) > MAX_LABEL_PIXELS {
        return Err(bad(format!("label map of {w}x{h} pixels"), None));
    }
    let (w, h) = (w as usize, h as usize);
    let raw_len = reader
        .output_buffer_size()
        .ok_or_else(|| bad("label map too large".into(), None))?;
    let line = reader
        .output_line_size(w as u32)
        .ok_or_else(|| bad("label map rows too long".into(), None))?;
    out.clear();
    out.resize(raw_len.max(w * h), 0);
    reader
        .next_frame(&mut out[..raw_len])
        .map_err(|e| bad("corrupt PNG label map".into(), Some(Box::new(e))))?;
    if unpack < 8 {
        // Expand packed indices in place, from the last row back.
        let per = 8 / unpack;
        let mask = (1u16 << unpack) as u8 - 1;
        for y in (0..h).rev() {
            for x in (0..w).rev() {
                let byte = out[y * line + x / per];
                let shift = 8 - unpack * (x % per + 1);
                out[y * w + x] = (byte >> shift) & mask;
            }
        }
    } else if line != w {
        return Err(bad(
            format!("label map rows of {line} bytes for {w} pixels"),
            None,
        ));
    }
    out.truncate(w * h);
    Ok(Size::new(w, h))
}

/// Nearest-neighbour resample of `crop` of `src` (`channels` bytes per
/// pixel, `size`), flipped if `flip`, into `out` (`out_size`, same
/// channels), widened to `T` (`u8`, or `i64` for a loss that takes class
/// indices so): for label maps, whose values must not be blended. Output
/// pixel `(x, y)` takes the source pixel under its centre in the crop,
/// the geometry of [`Resize`]'s bilinear filter, so a mask stays aligned
/// with its image.
#[allow(clippy::too_many_arguments)]
pub fn resample_nearest<T: Copy + From<u8>>(
    key: &str,
    src: &[u8],
    size: Size,
    channels: usize,
    crop: Crop,
    flip: bool,
    out_size: Size,
    out: &mut [T],
) -> Result<()> {
    let (w, h, c) = (size.width, size.height, channels);
    let (ow, oh) = (out_size.width, out_size.height);
    let bad = |reason: String| Error::Transform {
        key: key.into(),
        reason,
        source: None,
    };
    if c == 0 || w == 0 || h == 0 || src.len() < w * h * c {
        return Err(bad(format!(
            "{} bytes do not hold a {w}x{h} map of {c} channels",
            src.len()
        )));
    }
    if out.len() != ow * oh * c {
        return Err(bad(format!(
            "an output of {} elements for {ow}x{oh} of {c} channels",
            out.len()
        )));
    }
    if !inside(crop, size) {
        return Err(outside_error(key, crop, size));
    }
    let (sx, sy) = (crop.width / ow as f64, crop.height / oh as f64);
    let src_x: Vec<usize> = (0..ow)
        .map(|x| {
            let x = if flip { ow - 1 - x } else { x };
            ((crop.left + (x as f64 + 0.5) * sx).floor() as usize).min(w - 1)
        })
        .collect();
    for (y, row) in out.chunks_exact_mut(ow * c).enumerate() {
        let sy = ((crop.top + (y as f64 + 0.5) * sy).floor() as usize).min(h - 1);
        let src_row = &src[sy * w * c..(sy + 1) * w * c];
        for (px, &x) in row.chunks_exact_mut(c).zip(&src_x) {
            for (o, &v) in px.iter_mut().zip(&src_row[x * c..(x + 1) * c]) {
                *o = T::from(v);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_resample_keeps_values_and_follows_the_flip() {
        // A 4x2 map of distinct values, crop of the right half, 2x2 out.
        let src: Vec<u8> = (0..8).collect();
        let crop = Crop {
            left: 2.0,
            top: 0.0,
            width: 2.0,
            height: 2.0,
        };
        let mut out = [0u8; 4];
        let s = Size::new(4, 2);
        resample_nearest("k", &src, s, 1, crop, false, Size::new(2, 2), &mut out).unwrap();
        assert_eq!(out, [2, 3, 6, 7]);
        resample_nearest("k", &src, s, 1, crop, true, Size::new(2, 2), &mut out).unwrap();
        assert_eq!(out, [3, 2, 7, 6]);
        // Upsampling repeats, never blends.
        let mut big = [0u8; 16];
        resample_nearest("k", &src, s, 1, crop, false, Size::new(4, 4), &mut big).unwrap();
        assert_eq!(big, [2, 2, 3, 3, 2, 2, 3, 3, 6, 6, 7, 7, 6, 6, 7, 7]);
        let outside = Crop { left: 3.0, ..crop };
        assert!(
            resample_nearest("k", &src, s, 1, outside, false, Size::new(2, 2), &mut out).is_err()
        );
    }

    #[test]
    fn resize_reports_its_geometry_and_refuses_a_crop_outside_the_image() {
        let img =
            image::RgbImage::from_fn(40, 30, |x, y| image::Rgb([x as u8 * 6, y as u8 * 8, 9]));
        let mut png = std::io::Cursor::new(Vec::new());
        img.write_to(&mut png, image::ImageFormat::Png).unwrap();
        let png = png.into_inner();
        let resize = Resize::new(Size::new(8, 6)).unwrap();
        let mut scratch = Scratch::default();
        let mut out = vec![0u8; resize.slot_len()];
        let crop = Crop {
            left: 4.0,
            top: 2.0,
            width: 20.0,
            height: 15.0,
        };
        let done = resize
            .decode_into(
                &mut scratch,
                "k",
                &png,
                |_, _| (crop, true),
                Slot::U8(&mut out),
            )
            .unwrap();
        assert_eq!(
            done,
            Resized {
                image: Size::new(40, 30),
                crop,
                flip: true
            }
        );
        // The same crop of the decoded pixels gives the same bytes.
        let mut again = vec![0u8; resize.slot_len()];
        let rgb = img.into_raw();
        resize
            .resample_into(
                &mut scratch,
                "k",
                &rgb,
                Size::new(40, 30),
                crop,
                true,
                Slot::U8(&mut again),
            )
            .unwrap();
        assert_eq!(out, again);
        let outside = Crop { left: 30.0, ..crop };
        let e = resize
            .decode_into(
                &mut scratch,
                "k.png",
                &png,
                |_, _| (outside, false),
                Slot::U8(&mut out),
            )
            .unwrap_err();
        assert!(
            e.to_string().contains("k.png") && e.to_string().contains("not inside"),
            "{e}"
        );
        let e = resize
            .resample_into(
                &mut scratch,
                "k",
                &rgb,
                Size::new(40, 30),
                outside,
                false,
                Slot::U8(&mut out),
            )
            .unwrap_err();
        assert!(e.to_string().contains("not inside"), "{e}");
    }

    #[test]
    fn label_maps_decode_as_indices_and_colour_is_refused() {
        let (w, h) = (5u32, 3u32);
        for depth in [png::BitDepth::One, png::BitDepth::Two, png::BitDepth::Eight] {
            let max = match depth {
                png::BitDepth::One => 2,
                png::BitDepth::Two => 4,
                _ => 256,
            };
            let values: Vec<u8> = (0..w * h).map(|i| (i * 7 % max) as u8).collect();
            let bits = depth as usize;
            let line = (w as usize * bits).div_ceil(8);
            let mut packed = vec![0u8; line * h as usize];
            for y in 0..h as usize {
                for x in 0..w as usize {
                    let v = values[y * w as usize + x];
                    let shift = 8 - bits * (x % (8 / bits) + 1);
                    packed[y * line + x * bits / 8] |= v << shift;
                }
            }
            let mut png_bytes = Vec::new();
            {
                let mut enc = png::Encoder::new(&mut png_bytes, w, h);
                enc.set_color(png::ColorType::Indexed);
                enc.set_depth(depth);
                enc.set_palette(vec![0u8; 3 * max as usize]);
                enc.write_header()
                    .unwrap()
                    .write_image_data(&packed)
                    .unwrap();
            }
            let mut out = Vec::new();
            let size = decode_label_map_into("m", &png_bytes, &mut out).unwrap();
            assert_eq!(size, Size::new(5, 3));
            assert_eq!(out, values, "{depth:?}");
        }
        let rgb = {
            let mut v = std::io::Cursor::new(Vec::new());
            image::RgbImage::new(2, 2)
                .write_to(&mut v, image::ImageFormat::Png)
                .unwrap();
            v.into_inner()
        };
        let e = decode_label_map_into("m.png", &rgb, &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("m.png"), "{e}");
        assert!(decode_label_map_into("x", b"not a png", &mut Vec::new()).is_err());
    }
}
