//! Encoded bytes to an RGB8 image, with limits against hostile files.

use crate::error::{Error, Result};
use image::{DynamicImage, ImageReader, Limits, RgbImage};
use std::io::Cursor;

/// Largest width or height a sample may declare.
pub(crate) const MAX_SIDE: u32 = 32_768;
/// Largest allocation the decoder may make for one sample (1 GiB).
pub(crate) const MAX_ALLOC: u64 = 1 << 30;

/// Decodes `bytes` (JPEG, PNG, WebP, BMP; format sniffed from the bytes) to
/// RGB8. Grayscale, palette, CMYK and alpha images become RGB (alpha is
/// dropped, as PIL's `convert("RGB")` does). Errors name `key`.
pub(crate) fn decode_rgb(key: &str, bytes: &[u8]) -> Result<RgbImage> {
    if bytes.is_empty() {
        return Err(Error::EmptyFile { key: key.into() });
    }
    let err = |source| Error::Decode {
        key: key.into(),
        source: Box::new(source),
    };
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| err(image::ImageError::IoError(e)))?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_ALLOC);
    reader.limits(limits);
    let img = reader.decode().map_err(err)?;
    let rgb = match img {
        DynamicImage::ImageRgb8(rgb) => rgb,
        other => other.to_rgb8(),
    };
    if rgb.width() == 0 || rgb.height() == 0 {
        return Err(Error::Transform {
            key: key.into(),
            reason: "image has zero width or height".into(),
        });
    }
    Ok(rgb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, ImageFormat, Rgba, RgbaImage};

    fn encode(img: DynamicImage, fmt: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, fmt).unwrap();
        out.into_inner()
    }

    #[test]
    fn gray_and_alpha_become_rgb() {
        let gray = GrayImage::from_pixel(3, 2, image::Luma([77]));
        let rgb = decode_rgb("g", &encode(gray.into(), ImageFormat::Png)).unwrap();
        assert_eq!(rgb.get_pixel(2, 1).0, [77, 77, 77]);
        let rgba = RgbaImage::from_pixel(2, 2, Rgba([10, 20, 30, 0]));
        let rgb = decode_rgb("a", &encode(rgba.into(), ImageFormat::Png)).unwrap();
        assert_eq!(rgb.get_pixel(0, 0).0, [10, 20, 30]);
    }

    #[test]
    fn garbage_and_empty_name_the_key() {
        let e = decode_rgb("dir/x.jpg", b"not an image").unwrap_err();
        assert!(e.to_string().contains("dir/x.jpg"));
        let e = decode_rgb("dir/y.jpg", b"").unwrap_err();
        assert!(matches!(e, Error::EmptyFile { .. }), "{e}");
    }
}
