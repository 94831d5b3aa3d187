//! The antialiased bilinear resize matches Pillow's `BILINEAR` (the filter
//! torchvision's `antialias=True` follows) on reference outputs that Pillow
//! wrote (tests/fixtures/make_resize_reference.py).

use candle_wick::__bench::{HostLayout, ImageTransform, Slot};
use candle_wick::{Size, Transforms};
use image::ImageReader;

fn fixture(name: &str) -> image::RgbImage {
    let path = format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    ImageReader::open(&path)
        .unwrap()
        .decode()
        .unwrap()
        .to_rgb8()
}

fn check(src: &str, reference: &str, tolerance: u8) {
    let src = fixture(src);
    let want = fixture(reference);
    let t = ImageTransform::new(
        Transforms::ResizeCenterCrop { resize: 24 },
        HostLayout::U8Nhwc,
        Size::square(24),
        0,
    )
    .unwrap();
    let mut out = vec![0u8; t.slot_len()];
    let wh = Size::new(src.width() as usize, src.height() as usize);
    t.apply_decoded("ref", src.as_raw(), wh, 0, 0, Slot::U8(&mut out))
        .unwrap();
    let worst = out
        .iter()
        .zip(want.as_raw())
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    assert!(
        worst <= tolerance,
        "{reference}: max difference {worst} > {tolerance}"
    );
}

/// Pillow's weights and rounding: bit-identical. (Upscales put a whole
/// weight on one pixel, which leaves 14 fraction bits instead of Pillow's
/// 22: off by one level at most.)
#[test]
fn downscale_matches_pillow_bilinear() {
    check("resize_src_64x48.png", "resize_ref_down_24.png", 0);
}

#[test]
fn upscale_matches_pillow_bilinear() {
    check("resize_src_20x16.png", "resize_ref_up_24.png", 1);
}
