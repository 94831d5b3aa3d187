//! Per-stage costs on 64 ImageNet-like JPEGs (~400x350, q90): decode alone
//! (wick's decoder and zune-jpeg), each transform on decoded pixels (and the
//! eval resize by fast_image_resize, for comparison), and the fused
//! decode+transform path (which decodes only the crop window).

use candle_wick::__bench::{decode_rgb_into, HostLayout, ImageTransform, Slot};
use candle_wick::{Size, Transforms};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

const N: usize = 64;

fn load() -> Vec<Vec<u8>> {
    let dir = benches::imagenet_like(&benches::data_root(), 500).expect("bench dataset");
    let mut files: Vec<_> = std::fs::read_dir(dir.join("n00"))
        .expect("class folder")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .take(N)
        .map(|p| std::fs::read(p).expect("read"))
        .collect()
}

fn transform(t: Transforms, output: HostLayout) -> ImageTransform {
    ImageTransform::new(t, output, Size::new(224, 224), 0).expect("transform")
}

fn bench(c: &mut Criterion) {
    let jpegs = load();
    let mut group = c.benchmark_group("stages_224");
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(8));

    let mut buf = Vec::new();
    group.bench_function("decode_jpeg", |b| {
        b.iter(|| {
            for j in &jpegs {
                decode_rgb_into("bench", j, &mut buf).expect("decode");
            }
        })
    });
    // The same full decodes with zune-jpeg (image's decoder), which wick's
    // own decoder replaced for JPEGs.
    group.bench_function("decode_jpeg_zune", |b| {
        use zune_jpeg::zune_core::options::DecoderOptions;
        use zune_jpeg::zune_core::{bytestream::ZCursor, colorspace::ColorSpace};
        b.iter(|| {
            for j in &jpegs {
                let options = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
                let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(&j[..]), options);
                d.decode_headers().expect("headers");
                let size = d.output_buffer_size().expect("size");
                buf.resize(size, 0);
                d.decode_into(&mut buf[..size]).expect("zune decode");
            }
        })
    });

    let decoded: Vec<(Vec<u8>, Size)> = jpegs
        .iter()
        .map(|j| {
            let mut out = Vec::new();
            let wh = decode_rgb_into("bench", j, &mut out).expect("decode");
            (out, wh)
        })
        .collect();
    let rrc_no_flip = Transforms::RandomResizedCrop {
        scale: (0.08, 1.0),
        ratio: (3.0 / 4.0, 4.0 / 3.0),
        flip: false,
    };
    let cases = [
        (
            "resize_center_crop_u8",
            transform(Transforms::eval(224), HostLayout::U8Nhwc),
        ),
        (
            "random_resized_crop_u8",
            transform(rrc_no_flip, HostLayout::U8Nhwc),
        ),
        (
            "random_resized_crop_flip_u8",
            transform(Transforms::train(), HostLayout::U8Nhwc),
        ),
        (
            "random_resized_crop_flip_f32_normalize",
            transform(Transforms::train(), HostLayout::imagenet()),
        ),
    ];
    for (name, t) in &cases {
        let mut u8s = vec![0u8; t.slot_len()];
        let mut f32s = vec![0f32; t.slot_len()];
        group.bench_function(*name, |b| {
            b.iter(|| {
                for (i, (px, wh)) in decoded.iter().enumerate() {
                    let slot = match t.output() {
                        HostLayout::U8Nhwc => Slot::U8(&mut u8s),
                        HostLayout::F32Nchw { .. } => Slot::F32(&mut f32s),
                    };
                    t.apply_decoded("bench", px, *wh, 0, i, slot)
                        .expect("transform");
                }
            })
        });
    }

    // The same centre crops resized by fast_image_resize (AVX2 convolution,
    // the crate wick used before its own resampler), into one reused image.
    group.bench_function("resize_center_crop_u8_fast_image_resize", |b| {
        use fast_image_resize::images::{Image, ImageRef};
        use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
        let mut resizer = Resizer::new();
        let mut dst = Image::new(224, 224, PixelType::U8x3);
        b.iter(|| {
            for (px, size) in &decoded {
                let (w, h) = (size.width as f64, size.height as f64);
                // torchvision Resize(256) + CenterCrop(224), as a source box.
                let s = 256.0 / w.min(h);
                let (nw, nh) = ((w * s).trunc(), (h * s).trunc());
                let (left, top) = (((nw - 224.0) / 2.0).round(), ((nh - 224.0) / 2.0).round());
                let (sx, sy) = (w / nw, h / nh);
                let src = ImageRef::new(w as u32, h as u32, px, PixelType::U8x3).expect("image");
                let opts = ResizeOptions::new()
                    .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
                    .crop(left * sx, top * sy, 224.0 * sx, 224.0 * sy);
                resizer.resize(&src, &mut dst, &opts).expect("resize");
            }
        })
    });

    for (name, t) in [
        (
            "fused_decode_rrc_flip_u8",
            transform(Transforms::train(), HostLayout::U8Nhwc),
        ),
        (
            "fused_decode_rrc_flip_f32",
            transform(Transforms::train(), HostLayout::imagenet()),
        ),
    ] {
        let mut u8s = vec![0u8; t.slot_len()];
        let mut f32s = vec![0f32; t.slot_len()];
        group.bench_function(name, |b| {
            b.iter(|| {
                for (i, j) in jpegs.iter().enumerate() {
                    let slot = match t.output() {
                        HostLayout::U8Nhwc => Slot::U8(&mut u8s),
                        HostLayout::F32Nchw { .. } => Slot::F32(&mut f32s),
                    };
                    t.apply("bench", j, 0, i, slot).expect("apply");
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
