//! Crop, resize, flip and normalize outputs checked against values computed
//! here from the known input, not against the loader's own output.

use candle_wick::__bench::{HostLayout, ImageTransform, Slot};
use candle_wick::source::{MemorySource, Record};
use candle_wick::{Loader, Size, Transforms, IMAGENET_MEAN, IMAGENET_STD};
use image::{ImageFormat, Rgb, RgbImage};
use tests::encode;

fn png(img: &RgbImage) -> Vec<u8> {
    encode(img, ImageFormat::Png)
}

/// `pixel(x, y)` of the test gradient.
fn px(x: u32, y: u32) -> [u8; 3] {
    [(x * 5) as u8, (y * 7) as u8, ((x + y) * 3) as u8]
}

fn run_u8(t: &ImageTransform, bytes: &[u8], index: usize) -> Vec<u8> {
    let mut out = vec![0u8; t.slot_len()];
    t.apply("test", bytes, 0, index, Slot::U8(&mut out))
        .unwrap();
    out
}

#[test]
fn eval_center_crop_takes_the_middle_window() {
    // 40x32: the shorter side is already 32, so resizing is the identity and
    // the 32x32 centre crop starts at x = round((40 - 32) / 2) = 4.
    let img = RgbImage::from_fn(40, 32, |x, y| Rgb(px(x, y)));
    let t = ImageTransform::new(
        Transforms::ResizeCenterCrop { resize: 32 },
        HostLayout::U8Nhwc,
        Size::square(32),
        0,
    )
    .unwrap();
    let out = run_u8(&t, &png(&img), 0);
    for y in 0..32u32 {
        for x in 0..32u32 {
            let i = ((y * 32 + x) * 3) as usize;
            assert_eq!(&out[i..i + 3], &px(x + 4, y), "at {x},{y}");
        }
    }
}

#[test]
fn downscale_by_two_averages_with_the_antialiased_triangle_filter() {
    // v(j) = 4j along x. A 2x antialiased bilinear downscale weighs source
    // pixels 2x-1..2x+2 by 1:3:3:1, so the interior gives 4 * (2x + 0.5).
    let img = RgbImage::from_fn(64, 64, |x, _| Rgb([(4 * x) as u8, 0, 0]));
    let t = ImageTransform::new(
        Transforms::ResizeCenterCrop { resize: 32 },
        HostLayout::U8Nhwc,
        Size::square(32),
        0,
    )
    .unwrap();
    let out = run_u8(&t, &png(&img), 0);
    for y in 0..32usize {
        for x in 1..31usize {
            let want = 8 * x as i32 + 2;
            let got = out[(y * 32 + x) * 3] as i32;
            assert!((got - want).abs() <= 1, "x {x}: got {got}, want {want}");
        }
    }
}

#[test]
fn flip_mirrors_rows_and_happens_about_half_the_time() {
    // With scale (1, 1) and ratio fixed to 1 a square image is cropped whole,
    // so the output is the image itself or its mirror.
    let img = RgbImage::from_fn(16, 16, |x, y| Rgb(px(x, y)));
    let t = ImageTransform::new(
        Transforms::RandomResizedCrop {
            scale: (1.0, 1.0),
            ratio: (1.0, 1.0),
            flip: true,
        },
        HostLayout::U8Nhwc,
        Size::square(16),
        7,
    )
    .unwrap();
    let bytes = png(&img);
    let (mut plain, mut mirrored) = (0, 0);
    for index in 0..40 {
        let out = run_u8(&t, &bytes, index);
        let at = |x: u32, y: u32| &out[((y * 16 + x) * 3) as usize..][..3];
        if (0..16).all(|y| (0..16).all(|x| at(x, y) == px(x, y))) {
            plain += 1;
        } else if (0..16).all(|y| (0..16).all(|x| at(x, y) == px(15 - x, y))) {
            mirrored += 1;
        } else {
            panic!("sample {index} is neither the image nor its mirror");
        }
    }
    assert_eq!(plain + mirrored, 40);
    assert!(
        plain >= 10 && mirrored >= 10,
        "plain {plain} mirrored {mirrored}"
    );
}

#[test]
fn f32_output_is_planar_and_normalized() {
    let img = RgbImage::from_fn(8, 8, |x, _| {
        if x < 4 {
            Rgb([100, 150, 200])
        } else {
            Rgb([0, 255, 30])
        }
    });
    let source = MemorySource::new(vec![Record::encoded("k", png(&img), 4)]);
    let mut loader = Loader::builder(source)
        .image_size(8)
        .transforms(Transforms::ResizeCenterCrop { resize: 8 })
        .build()
        .unwrap();
    let b = loader.epoch(0).next().unwrap().unwrap();
    assert_eq!(b.images().unwrap().dims(), [1, 3, 8, 8]);
    assert_eq!(tests::labels(&b), [4]);
    let v = b
        .images()
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    for c in 0..3 {
        for y in 0..8 {
            for x in 0..8 {
                let byte = if x < 4 {
                    [100.0, 150.0, 200.0][c]
                } else {
                    [0.0, 255.0, 30.0][c]
                };
                let want = (byte / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
                let got = v[c * 64 + y * 8 + x];
                assert!((got - want).abs() < 1e-5, "c {c} x {x}: {got} vs {want}");
            }
        }
    }
}

#[test]
fn random_resized_crop_draws_depend_only_on_seed_epoch_and_index() {
    let img = RgbImage::from_fn(50, 40, |x, y| Rgb(px(x, y)));
    let bytes = png(&img);
    let t = ImageTransform::new(
        Transforms::train(),
        HostLayout::U8Nhwc,
        Size::new(12, 12),
        11,
    )
    .unwrap();
    let a: Vec<_> = (0..6).map(|i| run_u8(&t, &bytes, i)).collect();
    let b: Vec<_> = (0..6).rev().map(|i| run_u8(&t, &bytes, i)).collect();
    assert!(
        a.iter().eq(b.iter().rev()),
        "same index must give the same crop"
    );
    assert_ne!(a[0], a[1], "different indices should differ");
}
