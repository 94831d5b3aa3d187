//! User maps: a segmentation map built from the public blocks keeps image
//! and mask aligned through the augmentation and gives the same batches for
//! any worker count; a map's errors and panics follow the bad-sample
//! policy and name the sample; padded fields and schema mistakes are
//! errors, not corrupt batches.

use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Sample};
use candle_wick::ops::{self, RandomResizedCrop, Resize, Slot};
use candle_wick::source::{ImageMaskFolders, MemorySource, Parts, Record};
use candle_wick::{BadSamples, Batch, CacheMode, Error, Loader, Result, Size};
use std::path::Path;

const PALETTE: [[u8; 3]; 4] = [[10, 10, 10], [240, 30, 30], [30, 220, 40], [40, 60, 250]];
const OUT: Size = Size::new(40, 32);

/// Image + mask PNGs: discs and bars whose class is their colour.
fn write_pairs(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir.join("img")).unwrap();
    std::fs::create_dir_all(dir.join("mask")).unwrap();
    for i in 0..n {
        let (w, h) = (70 + i % 5 * 9, 50 + i % 3 * 11);
        let mask = image::GrayImage::from_fn(w as u32, h as u32, |x, y| {
            let (x, y) = (x as usize, y as usize);
            let disc = x.abs_diff(w / 3 + i).pow(2) + y.abs_diff(h / 2).pow(2) < 15 * 15;
            let bar = x > w / 2 + i % 7 && y % 20 < 9;
            image::Luma([if disc {
                1 + i % 3
            } else if bar {
                1 + (i + 1) % 3
            } else {
                0
            } as u8])
        });
        let img = image::RgbImage::from_fn(w as u32, h as u32, |x, y| {
            image::Rgb(PALETTE[mask.get_pixel(x, y).0[0] as usize])
        });
        img.save(dir.join("img").join(format!("{i:03}.png")))
            .unwrap();
        mask.save(dir.join("mask").join(format!("{i:03}.png")))
            .unwrap();
    }
}

/// The segmentation map of the `map` module's docs: one crop and flip.
fn segmentation() -> impl candle_wick::map::Map {
    let resize = Resize::new(OUT).unwrap();
    let rrc = RandomResizedCrop {
        scale: (0.2, 1.0),
        ..RandomResizedCrop::default()
    };
    let fields = vec![
        Field::new("image", FieldType::U8, &[OUT.height, OUT.width, 3]),
        Field::new("mask", FieldType::U8, &[OUT.height, OUT.width]),
    ];
    map_fn(fields, move |s: &mut Sample<'_>| {
        let (image, mask) = (s.take::<u8>(0)?, s.take::<u8>(1)?);
        let (r, rng) = (s.record(), s.rng());
        let plan = |w, h| rrc.draw(&mut rng.clone(), w, h);
        let done = resize.decode_into(s.scratch(), &r.key, &r.bytes, plan, Slot::U8(image))?;
        let mut labels = Vec::new();
        let size = ops::decode_label_map_into(&r.key, r.part_bytes("mask")?, &mut labels)?;
        assert_eq!(size, done.image);
        ops::resample_nearest(&r.key, &labels, size, 1, done.crop, done.flip, OUT, mask)
    })
    .parts(Parts::Named(vec!["mask".into()]))
}

fn epoch(dir: &Path, workers: usize, e: u64) -> Vec<Batch> {
    let src = ImageMaskFolders::new(dir.join("img"), dir.join("mask")).unwrap();
    let mut loader = Loader::builder(src)
        .map(segmentation())
        .batch_size(5)
        .shuffle(11)
        .workers(workers)
        .build()
        .unwrap();
    loader.epoch(e).collect::<Result<_>>().unwrap()
}

#[test]
fn a_segmentation_map_keeps_image_and_mask_aligned_for_any_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    write_pairs(dir.path(), 14);
    let one = epoch(dir.path(), 1, 2);
    let (mut interior, mut agree, mut flipped_classes) = (0, 0, 0);
    for b in &one {
        let px = tests::u8_field(b, "image");
        let mask = tests::u8_field(b, "mask");
        let (w, h) = (OUT.width, OUT.height);
        for s in 0..b.len() {
            for y in 1..h - 1 {
                for x in 1..w - 1 {
                    let m = |x: usize, y: usize| mask[(s * h + y) * w + x];
                    let c = m(x, y);
                    flipped_classes += usize::from(c > 0);
                    // The filter reaches one output pixel around: a
                    // pixel whose 3x3 neighbourhood holds another class
                    // is a resampling border.
                    if (y - 1..=y + 1).any(|ny| (x - 1..=x + 1).any(|nx| m(nx, ny) != c)) {
                        continue; // a resampling border
                    }
                    let p = &px[((s * h + y) * w + x) * 3..][..3];
                    let want = PALETTE[c as usize];
                    interior += 1;
                    agree += usize::from((0..3).all(|k| p[k].abs_diff(want[k]) <= 2));
                }
            }
        }
    }
    assert!(flipped_classes > 0, "the crops show the shapes");
    assert_eq!(
        agree, interior,
        "every interior pixel's colour is its mask's class"
    );
    for workers in [2, 3] {
        let other = epoch(dir.path(), workers, 2);
        assert_eq!(other.len(), one.len());
        for (a, b) in one.iter().zip(&other) {
            assert_eq!(a.keys, b.keys);
            for f in ["image", "mask"] {
                let (x, y) = (tests::u8_field(a, f), tests::u8_field(b, f));
                assert!(
                    x == y,
                    "{f} of batch {} differs with {workers} workers",
                    a.index
                );
            }
        }
    }
    // Another epoch draws other crops.
    let next = epoch(dir.path(), 1, 3);
    assert!(next
        .iter()
        .zip(&one)
        .any(|(a, b)| tests::u8_field(a, "mask") != tests::u8_field(b, "mask")));
}

fn records(n: usize) -> MemorySource {
    MemorySource::new(
        (0..n)
            .map(|i| Record::encoded(format!("rec{i}"), vec![i as u8; 3], i as u32))
            .collect(),
    )
}

/// Field `v` u32 [2]: the record's label and its first byte; bad records
/// fail as `how` says.
fn fragile(how: &'static str) -> impl candle_wick::map::Map {
    map_fn(
        vec![Field::new("v", FieldType::U32, &[2])],
        move |s: &mut Sample<'_>| {
            let key = s.key();
            if key == "rec5" {
                match how {
                    "panic" => panic!("the map broke on {key}"),
                    _ => return Err(Error::sample(key, "no good")),
                }
            }
            let r = s.record();
            s.take::<u32>(0)?
                .copy_from_slice(&[r.label, u32::from(r.bytes[0])]);
            Ok(())
        },
    )
}

#[test]
fn a_failing_or_panicking_map_follows_the_bad_sample_policy() {
    for how in ["panic", "error"] {
        let mut fail = Loader::builder(records(12))
            .map(fragile(how))
            .batch_size(4)
            .workers(2)
            .build()
            .unwrap();
        let got: Vec<_> = fail.epoch(0).collect();
        assert_eq!(got.len(), 3);
        assert!(got[0].is_ok() && got[2].is_ok(), "{how}: the other batches");
        let e = got[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("rec5"), "{how}: {e}");
        if how == "panic" {
            assert!(e.contains("the map broke"), "{e}");
        }
        let mut skip = Loader::builder(records(12))
            .map(fragile(how))
            .batch_size(4)
            .workers(2)
            .bad_samples(BadSamples::Skip)
            .build()
            .unwrap();
        let batches: Vec<Batch> = skip.epoch(0).collect::<Result<_>>().unwrap();
        let b = &batches[1];
        assert_eq!(b.keys, ["rec4", "rec6", "rec7"], "{how}");
        assert_eq!(b.skipped.len(), 1);
        assert_eq!(b.skipped[0].key, "rec5");
        let v = b.get("v").unwrap().to_vec2::<u32>().unwrap();
        assert_eq!(
            v,
            [[4, 4], [6, 6], [7, 7]],
            "{how}: the kept samples moved up"
        );
        assert_eq!(skip.stats().skipped, ["rec5"]);
    }
}

#[test]
fn padded_fields_are_padded_and_counted_and_misuse_is_an_error_naming_the_field() {
    let fields = vec![
        Field::padded("items", FieldType::I64, &[4, 2], -7.0),
        Field::new("id", FieldType::F32, &[]),
    ];
    let map = map_fn(fields.clone(), |s: &mut Sample<'_>| {
        let n = s.index() % 5;
        let items = s.take::<i64>(0)?;
        for (k, v) in items[..2 * n.min(4)].iter_mut().enumerate() {
            *v = (s.index() * 10 + k) as i64;
        }
        s.take::<f32>(2)?[0] = s.index() as f32;
        // Sample 4 claims 4 items: at most 4; a count of 5 never happens.
        s.set_len(0, n.min(4))
    });
    let mut loader = Loader::builder(records(6))
        .map(map)
        .batch_size(6)
        .build()
        .unwrap();
    let b = loader.epoch(0).next().unwrap().unwrap();
    let names: Vec<&str> = b.fields().map(|(n, _)| n).collect();
    assert_eq!(names, ["items", "items_len", "id"]);
    let items = b.get("items").unwrap().to_vec3::<i64>().unwrap();
    let lens = b.get("items_len").unwrap().to_vec1::<u32>().unwrap();
    assert_eq!(lens, [0, 1, 2, 3, 4, 0]);
    for (i, rows) in items.iter().enumerate() {
        let n = lens[i] as usize;
        for (k, row) in rows.iter().enumerate() {
            let want = if k < n {
                vec![(i * 10 + 2 * k) as i64, (i * 10 + 2 * k + 1) as i64]
            } else {
                vec![-7, -7]
            };
            assert_eq!(row, &want, "sample {i} item {k}");
        }
    }
    assert_eq!(
        b.get("id").unwrap().to_vec1::<f32>().unwrap(),
        [0., 1., 2., 3., 4., 5.]
    );

    // Misuse: a field never taken, no count, too many items, the wrong
    // type, a field twice, the loader's count field.
    let misuse = |f: fn(&mut Sample<'_>) -> Result<()>| {
        let map = map_fn(fields.clone(), f);
        let mut l = Loader::builder(records(2))
            .map(map)
            .batch_size(2)
            .build()
            .unwrap();
        let e = l.epoch(0).next().unwrap().unwrap_err().to_string();
        assert!(e.contains("rec0"), "{e}");
        e
    };
    let e = misuse(|_| Ok(()));
    assert!(e.contains("did not write field \"items\""), "{e}");
    let e = misuse(|s| s.take::<i64>(0).map(drop));
    assert!(e.contains("did not write field \"id\""), "{e}");
    fn both(s: &mut Sample<'_>) -> Result<()> {
        s.take::<i64>(0)?;
        s.take::<f32>(2).map(drop)
    }
    assert!(misuse(both).contains("set_len"));
    assert!(misuse(|s| {
        both(s)?;
        s.set_len(0, 5)
    })
    .contains("at most 4"));
    // An empty padded field needs no take.
    let map = map_fn(fields.clone(), |s: &mut Sample<'_>| {
        s.take::<f32>(2)?[0] = 1.0;
        s.set_len(0, 0)
    });
    let mut l = Loader::builder(records(2))
        .map(map)
        .batch_size(2)
        .build()
        .unwrap();
    let b = l.epoch(0).next().unwrap().unwrap();
    assert_eq!(
        b.get("items_len").unwrap().to_vec1::<u32>().unwrap(),
        [0, 0]
    );
    assert!(misuse(|s| s.take::<u8>(0).map(drop)).contains("I64"));
    assert!(misuse(|s| {
        s.take::<f32>(2)?;
        s.take::<f32>(2).map(drop)
    })
    .contains("twice"));
    assert!(misuse(|s| s.take::<u32>(1).map(drop)).contains("set_len"));
}

#[test]
fn the_builder_refuses_image_settings_and_the_cache_with_a_user_map() {
    let map = || fragile("error");
    let e = Loader::builder(records(2))
        .map(map())
        .image_size(32)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("image_size"), "{e}");
    let e = Loader::builder(records(2))
        .map(map())
        .cache(CacheMode::Encoded)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("cache"), "{e}");
    let dup = map_fn(
        vec![
            Field::new("x", FieldType::U8, &[1]),
            Field::new("x", FieldType::U8, &[1]),
        ],
        |_| Ok(()),
    );
    assert!(Loader::builder(records(2)).map(dup).build().is_err());
    // A batch asked for a field it does not have names the ones it has.
    let mut l = Loader::builder(records(2)).map(map()).build().unwrap();
    let b = l.epoch(0).next().unwrap().unwrap();
    let e = b.images().unwrap_err().to_string();
    assert!(e.contains("\"v\""), "{e}");
}
