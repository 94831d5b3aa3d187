//! CMYK JPEGs and palette PNGs (fixtures written by Pillow) become RGB with
//! the colours Pillow's `convert("RGB")` gives.

use candle_wick::__bench::{HostLayout, ImageTransform, Slot};
use candle_wick::{Size, Transforms};

fn decode(name: &str, size: usize) -> Vec<u8> {
    let path = format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap();
    // Resize to the image's own size: no resampling, the pixels as decoded.
    let t = ImageTransform::new(
        Transforms::ResizeCenterCrop { resize: size },
        HostLayout::U8Nhwc,
        Size::square(size),
        0,
    )
    .unwrap();
    let mut out = vec![0; t.slot_len()];
    t.apply(&path, &bytes, 0, 0, Slot::U8(&mut out)).unwrap();
    out
}

#[test]
fn cmyk_jpeg_becomes_rgb() {
    let out = decode("cmyk.jpg", 16);
    let px = |x: usize, y: usize| &out[(y * 16 + x) * 3..][..3];
    let close = |got: &[u8], want: [u8; 3]| {
        got.iter()
            .zip(want)
            .all(|(&g, w)| (g as i32 - w as i32).abs() <= 16)
    };
    assert!(close(px(2, 2), [255, 0, 0]), "left {:?}", px(2, 2));
    assert!(close(px(13, 13), [0, 255, 0]), "right {:?}", px(13, 13));
}

#[test]
fn palette_png_becomes_rgb() {
    let out = decode("palette.png", 4);
    for y in 0..4 {
        for x in 0..4 {
            let want = if (x + y) % 2 == 0 {
                [10, 20, 30]
            } else {
                [200, 100, 50]
            };
            assert_eq!(&out[(y * 4 + x) * 3..][..3], &want, "at {x},{y}");
        }
    }
}
