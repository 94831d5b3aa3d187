//! Semantic segmentation fed by wick: images and PNG label masks, jointly
//! augmented (one RandomResizedCrop and flip for both; the mask resampled
//! nearest-neighbour), from a WebDataset shard (`x.jpg` + `x.seg.png`) and
//! from an image folder beside a mask folder, training a small per-pixel
//! classifier for a few steps on the CPU.
//!
//! ```text
//! cargo run --release -p candle-wick --example segmentation
//! ```
//!
//! It writes its own data (synthetic shapes whose class is their colour)
//! to a temporary directory, checks that both sources give the same
//! batches and that every mask agrees with its image's colours away from
//! the shapes' edges, then trains.

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Map, Sample};
use candle_wick::ops::{self, RandomResizedCrop, Resize, Slot};
use candle_wick::source::{ImageMaskFolders, Parts, WebDataset, WebDatasetOptions};
use candle_wick::{Error, Loader, Result, Size, IMAGENET_MEAN, IMAGENET_STD};
use std::path::Path;

/// Classes 0 (background) to 4, each drawn in its own colour.
const PALETTE: [[u8; 3]; 5] = [
    [20, 20, 20],
    [230, 40, 40],
    [40, 200, 60],
    [50, 80, 230],
    [240, 220, 50],
];
const SAMPLES: usize = 48;
/// The network's input and the masks' size.
const OUT: Size = Size::new(64, 48);

// ANCHOR: map
/// The segmentation map: `image` f32 [3, h, w] (ImageNet-normalized) and
/// `mask` i64 [h, w], from the record's image and its mask part `mask_part`.
fn segmentation_map(mask_part: &'static str) -> Result<impl Map> {
    let resize = Resize::normalized(OUT, IMAGENET_MEAN, IMAGENET_STD)?;
    let rrc = RandomResizedCrop {
        scale: (0.35, 1.0),
        ..RandomResizedCrop::default()
    };
    let (h, w) = (OUT.height, OUT.width);
    let fields = vec![
        Field::new("image", FieldType::F32, &[3, h, w]),
        Field::new("mask", FieldType::I64, &[h, w]),
    ];
    let map = map_fn(fields, move |s: &mut Sample<'_>| {
        let (image, mask) = (s.take::<f32>(0)?, s.take::<i64>(1)?);
        let (record, rng) = (s.record(), s.rng());
        // One crop and flip for both, from (seed, epoch, index).
        let plan = |iw, ih| rrc.draw(&mut rng.clone(), iw, ih);
        let key = &record.key;
        let done = resize.decode_into(s.scratch(), key, &record.bytes, plan, Slot::F32(image))?;
        let mut labels = Vec::new();
        let size = ops::decode_label_map_into(key, record.part_bytes(mask_part)?, &mut labels)?;
        if size != done.image {
            let reason = format!("mask is {size:?}, image {:?}", done.image);
            return Err(Error::sample(key, reason));
        }
        ops::resample_nearest(key, &labels, size, 1, done.crop, done.flip, OUT, mask)
    });
    Ok(map.parts(Parts::Named(vec![mask_part.into()])))
}
// ANCHOR_END: map

/// A scene of a few rectangles and discs over the background, as the RGB
/// image and its class mask.
fn scene(i: usize) -> (image::RgbImage, image::GrayImage) {
    let (w, h) = (120 + (i % 3) * 20, 90 + (i % 4) * 10);
    let mut mask = image::GrayImage::new(w as u32, h as u32);
    let mut state = i as u64 * 0x9E37_79B9_7F4A_7C15 + 1;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for shape in 0..3 {
        let class = 1 + (i + shape) % 4;
        let (cx, cy, r) = (next(w), next(h), 12 + next(24));
        for y in 0..h {
            for x in 0..w {
                let (dx, dy) = (x.abs_diff(cx), y.abs_diff(cy));
                let inside = if shape % 2 == 0 {
                    dx * dx + dy * dy <= r * r
                } else {
                    dx <= r && dy <= r / 2 + 4
                };
                if inside {
                    mask.put_pixel(x as u32, y as u32, image::Luma([class as u8]));
                }
            }
        }
    }
    let img = image::RgbImage::from_fn(w as u32, h as u32, |x, y| {
        image::Rgb(PALETTE[mask.get_pixel(x, y).0[0] as usize])
    });
    (img, mask)
}

fn encode(img: &image::DynamicImage, format: image::ImageFormat) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, format).expect("encoding to memory");
    out.into_inner()
}

/// Writes the scenes as a WebDataset shard and as two folders.
fn write_data(dir: &Path) -> std::io::Result<()> {
    let shard = std::fs::File::create(dir.join("seg-000000.tar"))?;
    let mut tar = tar::Builder::new(shard);
    std::fs::create_dir_all(dir.join("images"))?;
    std::fs::create_dir_all(dir.join("masks"))?;
    for i in 0..SAMPLES {
        let (img, mask) = scene(i);
        let jpg = encode(
            &image::DynamicImage::ImageRgb8(img),
            image::ImageFormat::Jpeg,
        );
        let png = encode(
            &image::DynamicImage::ImageLuma8(mask),
            image::ImageFormat::Png,
        );
        for (name, data) in [
            (format!("{i:04}.jpg"), &jpg),
            (format!("{i:04}.seg.png"), &png),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, name, data.as_slice())?;
        }
        std::fs::write(dir.join("images").join(format!("{i:04}.jpg")), &jpg)?;
        std::fs::write(dir.join("masks").join(format!("{i:04}.png")), &png)?;
    }
    tar.finish()
}

/// The share of mask pixels, away from class edges, whose image colour is
/// nearest their class's colour.
fn agreement(image: &Tensor, mask: &Tensor) -> candle_core::Result<f64> {
    let mean = Tensor::new(&IMAGENET_MEAN, &Device::Cpu)?.reshape((1, 3, 1, 1))?;
    let std = Tensor::new(&IMAGENET_STD, &Device::Cpu)?.reshape((1, 3, 1, 1))?;
    let rgb = ((image.broadcast_mul(&std)?.broadcast_add(&mean)?) * 255.0)?;
    let (n, _, h, w) = rgb.dims4()?;
    let rgb = rgb.permute((0, 2, 3, 1))?.flatten_all()?.to_vec1::<f32>()?;
    let mask = mask.flatten_all()?.to_vec1::<i64>()?;
    let (mut agree, mut counted) = (0usize, 0usize);
    for b in 0..n {
        for y in 1..h - 1 {
            for x in 1..w - 1 {
                let at = |x: usize, y: usize| mask[(b * h + y) * w + x];
                let c = at(x, y);
                // Interior pixels only: a resampled edge blends two colours.
                if [(x - 1, y), (x + 1, y), (x, y - 1), (x, y + 1)]
                    .iter()
                    .any(|&(x, y)| at(x, y) != c)
                {
                    continue;
                }
                let px = &rgb[((b * h + y) * w + x) * 3..][..3];
                let dist =
                    |p: &[u8; 3]| -> f32 { (0..3).map(|k| (px[k] - p[k] as f32).powi(2)).sum() };
                let nearest = (0..PALETTE.len())
                    .min_by(|&a, &b| dist(&PALETTE[a]).total_cmp(&dist(&PALETTE[b])))
                    .expect("a palette");
                counted += 1;
                agree += usize::from(nearest as i64 == c);
            }
        }
    }
    Ok(agree as f64 / counted.max(1) as f64)
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    write_data(dir.path())?;
    // ANCHOR: sources
    let shard = WebDataset::open_with(
        [dir.path().join("seg-000000.tar")],
        WebDatasetOptions {
            label_ext: None,
            ..WebDatasetOptions::default()
        },
    )?;
    let folders = ImageMaskFolders::new(dir.path().join("images"), dir.path().join("masks"))?;
    let build = |source: Box<dyn candle_wick::Source>, part| -> Result<Loader> {
        Loader::builder(source)
            .map(segmentation_map(part)?)
            .batch_size(16)
            .shuffle(7)
            .build()
    };
    let mut from_tar = build(Box::new(shard), "seg.png")?;
    let mut from_folders = build(Box::new(folders), "mask")?;
    // ANCHOR_END: sources

    // Both sources give the same batches; every mask agrees with its image.
    let (mut worst, mut batches) = (1.0f64, 0);
    let epoch: Vec<_> = from_folders.epoch(0).collect::<Result<_>>()?;
    for (a, b) in from_tar.epoch(0).zip(&epoch) {
        let a = a?;
        for name in ["image", "mask"] {
            let same = a.get(name)?.eq(b.get(name)?)?.to_dtype(DType::F32)?;
            let same = same.mean_all()?.to_scalar::<f32>()?;
            if same != 1.0 {
                return Err(format!("batch {}: the sources' {name}s differ", a.index).into());
            }
        }
        worst = worst.min(agreement(a.get("image")?, a.get("mask")?)?);
        batches += 1;
    }
    println!(
        "{batches} batches from the shard equal the folders'; masks agree with the image \
         colours on {:.2}% of interior pixels (worst batch)",
        worst * 100.0
    );
    if worst < 0.97 {
        return Err(format!("masks and images disagree: {:.3}", worst).into());
    }

    // A per-pixel classifier: conv 3x3 (3 -> 16), ReLU, conv 1x1 (16 -> 5).
    let dev = Device::Cpu;
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &dev);
    let conv = |i, o, k, name| {
        let cfg = candle_nn::Conv2dConfig {
            padding: k / 2,
            ..Default::default()
        };
        candle_nn::conv2d(i, o, k, cfg, vb.pp(name))
    };
    let (c1, c2) = (conv(3, 16, 3, "c1")?, conv(16, PALETTE.len(), 1, "c2")?);
    let mut opt = candle_nn::AdamW::new_lr(vars.all_vars(), 1e-2)?;
    let mut losses = Vec::new();
    for epoch in 0..4 {
        for batch in from_tar.epoch(epoch) {
            let batch = batch?;
            let logits = c2.forward(&c1.forward(batch.get("image")?)?.relu()?)?;
            let logits = logits.permute((0, 2, 3, 1))?.reshape(((), PALETTE.len()))?;
            let target = batch.get("mask")?.flatten_all()?;
            let loss = candle_nn::loss::cross_entropy(&logits, &target)?;
            opt.backward_step(&loss)?;
            let acc = logits
                .argmax(D::Minus1)?
                .to_dtype(DType::I64)?
                .eq(&target)?;
            let acc = acc.to_dtype(DType::F32)?.mean_all()?.to_scalar::<f32>()?;
            losses.push(loss.to_scalar::<f32>()?);
            println!(
                "epoch {epoch} batch {}: loss {:.3}, pixel accuracy {:.1}%",
                batch.index,
                losses.last().expect("pushed"),
                acc * 100.0
            );
        }
    }
    let (first, last) = (losses[0], *losses.last().expect("trained"));
    println!("loss {first:.3} -> {last:.3} over {} steps", losses.len());
    if last >= first {
        return Err("the loss did not fall".into());
    }
    Ok(())
}
