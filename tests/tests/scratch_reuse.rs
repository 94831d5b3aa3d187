//! Decode scratch (buffers, planes, tables; the same kind of set a loader's
//! worker reuses, here the calling thread's) leaves nothing behind: a small
//! image decoded right after a large one on the same thread gives the bytes it gives on a fresh thread, for every
//! kind of JPEG the encoder here writes (RGB, grayscale) and for PNG.

use candle_wick::__bench::{HostLayout, ImageTransform, Slot};
use candle_wick::{Size, Transforms};
use image::{DynamicImage, ImageFormat};
use std::io::Cursor;

fn encode(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn run(t: &ImageTransform, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; t.slot_len()];
    t.apply("x", bytes, 0, 3, Slot::U8(&mut out)).unwrap();
    out
}

#[test]
fn a_small_image_after_a_large_one_decodes_as_on_a_fresh_thread() {
    let t = ImageTransform::new(
        Transforms::train(),
        HostLayout::U8Nhwc,
        Size::new(24, 24),
        5,
    )
    .unwrap();
    let rgb = |w, h, seed| DynamicImage::ImageRgb8(tests::pattern(w, h, seed));
    let cases = [
        (
            "jpeg rgb",
            ImageFormat::Jpeg,
            rgb(2000, 1500, 1),
            rgb(37, 23, 2),
        ),
        (
            "jpeg gray",
            ImageFormat::Jpeg,
            DynamicImage::ImageLuma8(rgb(2000, 1500, 3).to_luma8()),
            DynamicImage::ImageLuma8(rgb(37, 23, 4).to_luma8()),
        ),
        ("png", ImageFormat::Png, rgb(1200, 900, 5), rgb(37, 23, 6)),
        // A small JPEG after a large PNG and the reverse share one thread.
        (
            "png then jpeg",
            ImageFormat::Png,
            rgb(1200, 900, 7),
            rgb(37, 23, 8),
        ),
    ];
    for (name, format, big, small) in cases {
        let small_format = if name == "png then jpeg" {
            ImageFormat::Jpeg
        } else {
            format
        };
        let (big, small) = (encode(big, format), encode(small, small_format));
        let t2 = t.clone();
        let s2 = small.clone();
        let fresh = std::thread::spawn(move || run(&t2, &s2)).join().unwrap();
        let t3 = t.clone();
        let after_big = std::thread::spawn(move || {
            run(&t3, &big);
            run(&t3, &small)
        })
        .join()
        .unwrap();
        assert!(
            after_big == fresh,
            "{name}: the large image's scratch leaked into the small one"
        );
    }
}
