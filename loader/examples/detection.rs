//! Object detection fed by wick: images with a variable number of boxes
//! each, from a WebDataset shard (`x.jpg` + `x.json`), resized to a fixed
//! input with a random horizontal flip applied to the image and its boxes,
//! and batched as padded fields: `boxes` f32 `[B, 12, 4]` (pad -1) and
//! `classes` i64 `[B, 12]` (pad -1), with their counts in `boxes_len` and
//! `classes_len` (u32 `[B]`).
//!
//! ```text
//! cargo run --release -p candle-wick --example detection
//! ```
//!
//! The shard is written to a temporary directory: coloured rectangles
//! whose class is their colour. The example checks every box against the
//! JSON it came from and against the pixels under it.

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Map, Sample};
use candle_wick::ops::{Crop, Resize, Slot};
use candle_wick::source::{Parts, WebDataset, WebDatasetOptions};
use candle_wick::{Error, Loader, Result, Size};
use rand::Rng;
use std::path::Path;

const MAX_BOXES: usize = 12;
const OUT: Size = Size::new(96, 96);
const COLOURS: [[u8; 3]; 3] = [[230, 40, 40], [40, 200, 60], [50, 80, 230]];
const SAMPLES: usize = 40;

/// A JSON annotation: `{"boxes": [[x0, y0, x1, y1], ...], "classes":
/// [c, ...]}`, boxes in pixels.
struct Annotation {
    boxes: Vec<[f32; 4]>,
    classes: Vec<i64>,
}

impl Annotation {
    fn parse(key: &str, bytes: &[u8]) -> Result<Self> {
        let bad = |what: &str| Error::sample(key, format!("annotation: {what}"));
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
        let list = |name| {
            v[name]
                .as_array()
                .ok_or_else(|| bad(&format!("no {name} list")))
        };
        let boxes = list("boxes")?
            .iter()
            .map(|b| {
                let c: Vec<f32> = b
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_f64())
                            .map(|x| x as f32)
                            .collect()
                    })
                    .unwrap_or_default();
                <[f32; 4]>::try_from(c).map_err(|_| bad("a box is not 4 numbers"))
            })
            .collect::<Result<_>>()?;
        let classes = list("classes")?
            .iter()
            .map(|c| c.as_i64().ok_or_else(|| bad("a class is not an integer")))
            .collect::<Result<_>>()?;
        Ok(Self { boxes, classes })
    }
}

// ANCHOR: map
fn detection_map() -> Result<impl Map> {
    let resize = Resize::new(OUT)?;
    let fields = vec![
        Field::new("image", FieldType::U8, &[OUT.height, OUT.width, 3]),
        Field::padded("boxes", FieldType::F32, &[MAX_BOXES, 4], -1.0),
        Field::padded("classes", FieldType::I64, &[MAX_BOXES], -1.0),
    ];
    // Field numbers: each padded field is followed by its `_len`.
    let (image_f, boxes_f, classes_f) = (0, 1, 3);
    let map = map_fn(fields, move |s: &mut Sample<'_>| {
        let record = s.record();
        let key = &record.key;
        let ann = Annotation::parse(key, record.part_bytes("json")?)?;
        if ann.boxes.len() != ann.classes.len() || ann.boxes.len() > MAX_BOXES {
            let reason = format!("{} boxes, {} classes", ann.boxes.len(), ann.classes.len());
            return Err(Error::sample(key, reason));
        }
        let flip = s.rng().random::<f64>() < 0.5;
        let image = s.take::<u8>(image_f)?;
        let whole = |w: usize, h: usize| (Crop::whole(w, h), flip);
        let done = resize.decode_into(s.scratch(), key, &record.bytes, whole, Slot::U8(image))?;
        let sx = OUT.width as f32 / done.image.width as f32;
        let sy = OUT.height as f32 / done.image.height as f32;
        let boxes = s.take::<f32>(boxes_f)?;
        for (out, b) in boxes.chunks_exact_mut(4).zip(&ann.boxes) {
            let (x0, x1) = if flip {
                (OUT.width as f32 - b[2] * sx, OUT.width as f32 - b[0] * sx)
            } else {
                (b[0] * sx, b[2] * sx)
            };
            out.copy_from_slice(&[x0, b[1] * sy, x1, b[3] * sy]);
        }
        s.take::<i64>(classes_f)?[..ann.classes.len()].copy_from_slice(&ann.classes);
        s.set_len(boxes_f, ann.boxes.len())?;
        s.set_len(classes_f, ann.classes.len())
    });
    Ok(map.parts(Parts::Named(vec!["json".into()])))
}
// ANCHOR_END: map

/// Writes the shard: sample `i` has `i % 7` boxes (none for some).
fn write_shard(path: &Path) -> std::io::Result<()> {
    let mut tar = tar::Builder::new(std::fs::File::create(path)?);
    for i in 0..SAMPLES {
        let (w, h) = (160 + (i % 4) * 16, 120 + (i % 3) * 20);
        let mut img = image::RgbImage::from_pixel(w as u32, h as u32, image::Rgb([15, 15, 15]));
        let (mut boxes, mut classes) = (Vec::new(), Vec::new());
        for k in 0..i % 7 {
            // Boxes on a grid, so they never overlap.
            let (x0, y0) = ((k % 4) * (w / 4) + 4, (k / 4) * (h / 2) + 6);
            let (x1, y1) = (x0 + w / 4 - 10, y0 + h / 2 - 14);
            let class = (i + k) % COLOURS.len();
            for y in y0..y1 {
                for x in x0..x1 {
                    img.put_pixel(x as u32, y as u32, image::Rgb(COLOURS[class]));
                }
            }
            boxes.push([x0 as f32, y0 as f32, x1 as f32, y1 as f32]);
            classes.push(class as i64);
        }
        let mut jpg = std::io::Cursor::new(Vec::new());
        img.write_to(&mut jpg, image::ImageFormat::Jpeg)
            .expect("encoding to memory");
        let json = serde_json::json!({ "boxes": boxes, "classes": classes }).to_string();
        for (name, data) in [
            (format!("{i:04}.jpg"), jpg.into_inner()),
            (format!("{i:04}.json"), json.into_bytes()),
        ] {
            let mut hd = tar::Header::new_gnu();
            hd.set_size(data.len() as u64);
            hd.set_mode(0o644);
            hd.set_cksum();
            tar.append_data(&mut hd, name, data.as_slice())?;
        }
    }
    tar.finish()
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("det-000000.tar");
    write_shard(&path)?;
    // ANCHOR: loader
    let opts = WebDatasetOptions {
        label_ext: None,
        ..WebDatasetOptions::default()
    };
    let mut loader = Loader::builder(WebDataset::open_with([&path], opts)?)
        .map(detection_map()?)
        .batch_size(8)
        .shuffle(3)
        .build()?;
    // ANCHOR_END: loader
    let (mut objects, mut samples) = (0usize, 0usize);
    for batch in loader.epoch(0) {
        let batch = batch?;
        let pixels = batch.get("image")?.flatten_all()?.to_vec1::<u8>()?;
        let boxes = batch.get("boxes")?.to_vec3::<f32>()?;
        let classes = batch.get("classes")?.to_vec2::<i64>()?;
        let counts = batch.get("boxes_len")?.to_vec1::<u32>()?;
        let class_counts = batch.get("classes_len")?.to_vec1::<u32>()?;
        for (row, &index) in batch.indices.iter().enumerate() {
            let n = counts[row] as usize;
            if n != index % 7 || class_counts[row] as usize != n {
                return Err(format!("sample {index}: {n} boxes, wrote {}", index % 7).into());
            }
            if boxes[row][n..].iter().flatten().any(|&v| v != -1.0)
                || classes[row][n..].iter().any(|&c| c != -1)
            {
                return Err(format!("sample {index}: padding is not -1").into());
            }
            for (b, &class) in boxes[row][..n].iter().zip(&classes[row][..n]) {
                // The pixel at the box's centre has the box's class colour.
                let (cx, cy) = ((b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0);
                let (cx, cy) = (cx as usize, cy as usize);
                let at = ((row * OUT.height + cy) * OUT.width + cx) * 3;
                let px = &pixels[at..at + 3];
                let want = COLOURS[class as usize];
                if (0..3).any(|k| px[k].abs_diff(want[k]) > 40) {
                    return Err(format!("sample {index}: box {b:?} is not over its object").into());
                }
                objects += 1;
            }
            samples += 1;
        }
    }
    println!(
        "{samples} samples, {objects} boxes: every count, padding and box checked \
         against its annotation and the pixels under it"
    );
    Ok(())
}
