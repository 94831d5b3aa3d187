//! Decoder limits: an image whose header declares more than 89,478,485
//! pixels (Pillow's decompression-bomb limit) is refused before anything is
//! allocated for it, as a bad sample naming the file; `max_pixels` moves
//! the limit; an image whose decoded pixels exceed what the RAM budget
//! grants each decode worker is decoded alone, not refused, so what is
//! refused never depends on the worker count or the budget.

use candle_wick::source::ImageFolder;
use candle_wick::{BadSamples, Error, Loader, Output};
use std::path::Path;
use tests::{encode, pattern};

/// A baseline JPEG header declaring `w x h` (three components, 4:4:4),
/// with tables and a scan header but no entropy-coded data: a bomb's
/// header without its body.
fn jpeg_header(w: u16, h: u16) -> Vec<u8> {
    let mut j = vec![0xFF, 0xD8];
    // DQT: table 0, all ones.
    j.extend([0xFF, 0xDB, 0, 67, 0]);
    j.extend([1u8; 64]);
    // SOF0: 8-bit, h x w, 3 components sampled 1x1 with table 0.
    j.extend([0xFF, 0xC0, 0, 17, 8]);
    j.extend(h.to_be_bytes());
    j.extend(w.to_be_bytes());
    j.extend([3, 1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0]);
    // DHT: DC table 0 with one 1-bit code for category 0; AC table 0
    // with one 1-bit code for end-of-block.
    j.extend([0xFF, 0xC4, 0, 20, 0x00, 1]);
    j.extend([0u8; 15]);
    j.push(0);
    j.extend([0xFF, 0xC4, 0, 20, 0x10, 1]);
    j.extend([0u8; 15]);
    j.push(0);
    // SOS, then the end of the image.
    j.extend([0xFF, 0xDA, 0, 12, 3, 1, 0, 2, 0, 3, 0, 0, 63, 0]);
    j.extend([0xFF, 0xD9]);
    j
}

/// Six 20x20 images in two classes, plus `extra` files in class 0.
fn folder(dir: &Path, extra: &[(&str, Vec<u8>)]) {
    for c in 0..2 {
        let class = dir.join(format!("c{c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..3 {
            let img = encode(&pattern(20, 20, c * 3 + i), image::ImageFormat::Png);
            std::fs::write(class.join(format!("{i}.png")), img).unwrap();
        }
    }
    for (name, bytes) in extra {
        std::fs::write(dir.join("c0").join(name), bytes).unwrap();
    }
}

fn skipped(l: &mut Loader) -> (usize, Vec<(String, Error)>) {
    let mut good = 0;
    let mut bad = Vec::new();
    for b in l.epoch(0) {
        let b = b.unwrap();
        good += b.len();
        bad.extend(b.skipped.into_iter().map(|s| (s.key, s.error)));
    }
    (good, bad)
}

#[test]
fn a_decompression_bomb_is_refused_from_its_header_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // 10,000 x 9,000 = 90,000,000 pixels: just over the limit.
    folder(dir.path(), &[("bomb.jpg", jpeg_header(10_000, 9_000))]);
    let build = |max_pixels: Option<u64>| {
        let mut b = Loader::builder(ImageFolder::new(dir.path()).unwrap())
            .batch_size(4)
            .image_size(16)
            .output(Output::U8Nhwc)
            .bad_samples(BadSamples::Skip);
        if let Some(n) = max_pixels {
            b = b.max_pixels(n);
        }
        b.build().unwrap()
    };
    let (good, bad) = skipped(&mut build(None));
    assert_eq!(good, 6);
    assert_eq!(bad.len(), 1, "{bad:?}");
    let (key, err) = &bad[0];
    assert!(key.ends_with("bomb.jpg"), "{key}");
    assert!(
        matches!(
            err,
            Error::ImageTooLarge {
                width: 10_000,
                height: 9_000,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = candle_wick::error_chain(err);
    assert!(
        msg.contains("bomb.jpg") && msg.contains("89478485 pixels"),
        "{msg}"
    );
    // With the limit raised it decodes (a truncated scan decodes as
    // libjpeg does, the missing blocks grey); with it lowered, ordinary
    // images are refused.
    let (good, bad) = skipped(&mut build(Some(100_000_000)));
    assert_eq!((good, bad.len()), (7, 0), "{bad:?}");
    let (good, bad) = skipped(&mut build(Some(399)));
    assert_eq!(
        (good, bad.len()),
        (0, 7),
        "20x20 is 400 pixels: all refused"
    );
}

/// Whether an image is refused depends on the image (and `max_pixels`),
/// never on the worker count or the RAM budget: the batches of a run are
/// the same whatever AUTOTUNE or another machine's memory choose. An
/// image over a worker's share of the budget is decoded alone instead.
#[test]
fn an_image_larger_than_a_workers_share_is_decoded_whatever_the_workers_and_budget() {
    let dir = tempfile::tempdir().unwrap();
    // 1500 x 1000 RGB: 4.5 MB decoded.
    let big = encode(&pattern(1500, 1000, 7), image::ImageFormat::Png);
    folder(dir.path(), &[("big.png", big)]);
    let build = |workers: usize, budget: u64| {
        Loader::builder(ImageFolder::new(dir.path()).unwrap())
            .batch_size(2)
            .image_size(16)
            .output(Output::U8Nhwc)
            .shuffle(1)
            .workers(workers)
            .bad_samples(BadSamples::Skip)
            .ram_budget(budget)
            .build()
            .unwrap()
    };
    let batches = |workers, budget| {
        let mut l = build(workers, budget);
        let out: Vec<(Vec<usize>, Vec<u8>)> = l
            .epoch(0)
            .map(|b| {
                let b = b.unwrap();
                assert!(b.skipped.is_empty(), "{:?}", b.skipped);
                let px = b.images().unwrap().flatten_all().unwrap().to_vec1::<u8>();
                (b.indices.clone(), px.unwrap())
            })
            .collect();
        let peak = l.stats().decode_scratch_bytes;
        (out, peak)
    };
    // A share of well under the image (3 MB budget over 1 or 4 workers)
    // and one with room for it: the same batches.
    let (tight_1, _) = batches(1, 3_000_000);
    let (tight_4, held) = batches(4, 3_000_000);
    let (roomy, _) = batches(2, 64_000_000);
    assert_eq!(tight_1.iter().map(|b| b.0.len()).sum::<usize>(), 7);
    assert!(tight_1 == tight_4 && tight_1 == roomy, "the batches differ");
    // What the scratches keep after the oversized decode is within the
    // budget (its buffers were given back).
    assert!(held < 3_000_000, "scratches hold {held} bytes");
}
