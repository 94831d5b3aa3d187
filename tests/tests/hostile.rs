//! A generated corpus of more than 500 hostile files, read by a loader:
//! JPEG (baseline, progressive, gray, CMYK, 4:2:0), PNG (RGB, gray,
//! 16-bit, palette, alpha), WebP and BMP (24-bit, OS/2 header) files cut
//! at many offsets and with bits flipped at many places; JPEGs of every
//! size from 1 to 17 px per axis in every chroma subsampling; headers
//! declaring huge sizes; zero-byte, text and random files named as
//! images. No panic (a panic would be a `WorkerPanic` sample), no hang
//! (the epoch runs under a watchdog), bounded memory (the process's peak
//! resident set), and every sample either delivered or skipped with its
//! file named.

use candle_wick::source::ImageFolder;
use candle_wick::{BadSamples, Error, Loader, Output};
use image::{DynamicImage, ImageFormat, Rgb, RgbImage};
use std::path::Path;

fn photo(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        Rgb([
            (x * 255 / w.max(1)) as u8,
            (y * 255 / h.max(1)) as u8,
            ((x * 7 + y * 13) % 256) as u8,
        ])
    })
}

fn encoded(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn jpeg(
    w: u16,
    h: u16,
    color: jpeg_encoder::ColorType,
    sampling: jpeg_encoder::SamplingFactor,
    progressive: bool,
) -> Vec<u8> {
    let channels = if matches!(color, jpeg_encoder::ColorType::Cmyk) {
        4
    } else if matches!(color, jpeg_encoder::ColorType::Luma) {
        1
    } else {
        3
    };
    let px: Vec<u8> = (0..usize::from(w) * usize::from(h) * channels)
        .map(|i| (i * 31 % 253) as u8)
        .collect();
    let mut out = Vec::new();
    let mut enc = jpeg_encoder::Encoder::new(&mut out, 85);
    enc.set_sampling_factor(sampling);
    enc.set_progressive(progressive);
    enc.encode(&px, w, h, color).unwrap();
    out
}

/// The well-formed files the damaged ones are made from.
fn bases() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    use jpeg_encoder::{ColorType as C, SamplingFactor as S};
    let img = DynamicImage::ImageRgb8(photo(48, 40));
    let mut os2 = encoded(img.clone(), ImageFormat::Bmp);
    // The 24-bit BMP's 40-byte header as an OS/2 2.x one of 64 bytes.
    let mut header = os2[14..54].to_vec();
    header[..4].copy_from_slice(&64u32.to_le_bytes());
    header.resize(64, 0);
    let offset = u32::from_le_bytes(os2[10..14].try_into().unwrap()) + 24;
    os2 = [&os2[..10], &offset.to_le_bytes(), &header, &os2[54..]].concat();
    vec![
        ("baseline", "jpg", jpeg(48, 40, C::Rgb, S::F_2_2, false)),
        ("progressive", "jpg", jpeg(48, 40, C::Rgb, S::F_2_1, true)),
        ("gray", "jpg", jpeg(40, 33, C::Luma, S::F_1_1, false)),
        ("cmyk", "jpg", jpeg(32, 24, C::Cmyk, S::F_1_1, false)),
        ("rgb", "png", encoded(img.clone(), ImageFormat::Png)),
        (
            "gray",
            "png",
            encoded(img.to_luma8().into(), ImageFormat::Png),
        ),
        (
            "deep",
            "png",
            encoded(img.to_rgb16().into(), ImageFormat::Png),
        ),
        (
            "alpha",
            "png",
            encoded(img.to_rgba8().into(), ImageFormat::Png),
        ),
        ("palette", "png", palette_png()),
        ("lossless", "webp", encoded(img.clone(), ImageFormat::WebP)),
        ("rgb", "bmp", encoded(img, ImageFormat::Bmp)),
        ("os2", "bmp", os2),
    ]
}

fn palette_png() -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, 16, 16);
    enc.set_color(png::ColorType::Indexed);
    enc.set_palette((0..48u8).collect::<Vec<_>>());
    let mut w = enc.write_header().unwrap();
    let idx: Vec<u8> = (0..256u32).map(|i| (i % 16) as u8).collect();
    w.write_image_data(&idx).unwrap();
    w.finish().unwrap();
    out
}

/// Headers declaring huge images, with little or nothing after them.
fn huge() -> Vec<(&'static str, Vec<u8>)> {
    let mut sof = vec![0xFF, 0xD8, 0xFF, 0xC0, 0, 17, 8, 0xFF, 0xFF, 0xFF, 0xFF, 3];
    sof.extend([1, 0x22, 0, 2, 0x11, 0, 3, 0x11, 0, 0xFF, 0xD9]);
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    png.extend(100_000u32.to_be_bytes());
    png.extend(100_000u32.to_be_bytes());
    png.extend([8, 2, 0, 0, 0, 0, 0, 0, 0]);
    let mut bmp = b"BM".to_vec();
    bmp.extend([0; 8]);
    bmp.extend(54u32.to_le_bytes());
    bmp.extend(40u32.to_le_bytes());
    bmp.extend(30_000i32.to_le_bytes());
    bmp.extend(30_000i32.to_le_bytes());
    bmp.extend([1, 0, 24, 0]);
    bmp.extend([0; 24]);
    let mut webp = b"RIFF\x20\0\0\0WEBPVP8L\x0c\0\0\0\x2f".to_vec();
    webp.extend([0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0, 0, 0, 0]);
    vec![("jpg", sof), ("png", png), ("bmp", bmp), ("webp", webp)]
}

/// Writes the corpus under `dir/hostile`; returns how many files.
fn corpus(dir: &Path) -> usize {
    let root = dir.join("hostile");
    std::fs::create_dir_all(&root).unwrap();
    let mut n = 0;
    let mut put = |name: String, bytes: &[u8]| {
        std::fs::write(root.join(name), bytes).unwrap();
        n += 1;
    };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |m: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % m as u64) as usize
    };
    for (kind, ext, bytes) in bases() {
        put(format!("{kind}-whole.{ext}"), &bytes);
        // Cut at 14 offsets through the file.
        for k in 1..15 {
            let at = bytes.len() * k / 15;
            put(format!("{kind}-cut{at}.{ext}"), &bytes[..at]);
        }
        // 20 files with one to four bits flipped each.
        for f in 0..20 {
            let mut b = bytes.clone();
            for _ in 0..1 + f % 4 {
                let at = next(b.len());
                b[at] ^= 1 << next(8);
            }
            put(format!("{kind}-flip{f}.{ext}"), &b);
        }
    }
    // Tiny JPEGs: every size 1..=17 on one axis, the other 1, 2 or 17,
    // in each subsampling.
    use jpeg_encoder::SamplingFactor as S;
    for (s, sampling) in [S::F_1_1, S::F_2_1, S::F_1_2, S::F_2_2]
        .into_iter()
        .enumerate()
    {
        for w in 1..=17u16 {
            for h in [1u16, 2, 17] {
                let j = jpeg(w, h, jpeg_encoder::ColorType::Rgb, sampling, w % 2 == 0);
                put(format!("tiny-{w}x{h}-s{s}.jpg"), &j);
            }
        }
    }
    for (ext, bytes) in huge() {
        put(format!("huge.{ext}"), &bytes);
    }
    put("zero.jpg".into(), b"");
    put("zero.png".into(), b"");
    put("text.jpg".into(), b"this is not an image at all\n");
    let noise: Vec<u8> = (0..4096).map(|_| next(256) as u8).collect();
    put("noise.png".into(), &noise);
    put("noise.bmp".into(), &[b"BM".as_slice(), &noise].concat());
    put("noise.jpg".into(), &[&[0xFF, 0xD8][..], &noise].concat());
    n
}

/// Peak resident set of this process, in bytes (Linux).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn a_hostile_corpus_is_read_without_panic_hang_or_unbounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let files = corpus(dir.path());
    assert!(files >= 500, "{files} files");
    // ImageFolder wants class folders: the corpus is one class.
    let data = dir.path().to_path_buf();
    let (delivered, skipped) = tests::within(300, move || {
        let mut l = Loader::builder(ImageFolder::new(&data).unwrap())
            .batch_size(16)
            .image_size(24)
            .output(Output::U8Nhwc)
            .train_transforms()
            .workers(2)
            .bad_samples(BadSamples::Skip)
            .build()
            .unwrap();
        let mut delivered = Vec::new();
        let mut skipped = Vec::new();
        for b in l.epoch(0) {
            let b = b.unwrap();
            delivered.extend(b.keys);
            skipped.extend(b.skipped);
        }
        (delivered, skipped)
    });
    assert_eq!(
        delivered.len() + skipped.len(),
        files,
        "every file delivered or named"
    );
    let panics: Vec<String> = skipped
        .iter()
        .filter(|s| matches!(s.error, Error::WorkerPanic { .. }))
        .map(|s| candle_wick::error_chain(&s.error))
        .collect();
    assert!(panics.is_empty(), "{} panics: {panics:#?}", panics.len());
    for s in &skipped {
        let reason = candle_wick::error_chain(&s.error);
        let name = Path::new(&s.key).file_name().unwrap().to_str().unwrap();
        assert!(
            reason.contains(name),
            "{} does not name its file: {reason}",
            s.key
        );
    }
    // Every well-formed file decodes, and every tiny JPEG; the huge,
    // empty, text and noise files are bad.
    let ok = |n: &str| delivered.iter().any(|k| k.ends_with(n));
    for (kind, ext, _) in bases() {
        assert!(
            ok(&format!("{kind}-whole.{ext}")),
            "{kind}.{ext} did not decode"
        );
    }
    assert_eq!(
        delivered.iter().filter(|k| k.contains("/tiny-")).count(),
        4 * 17 * 3
    );
    for bad in [
        "huge.jpg",
        "huge.png",
        "huge.bmp",
        "zero.jpg",
        "text.jpg",
        "noise.png",
    ] {
        assert!(
            skipped.iter().any(|s| s.key.ends_with(bad)),
            "{bad} was not skipped"
        );
    }
    let peak = peak_rss();
    eprintln!(
        "{files} files: {} decoded, {} named bad; peak resident set {} MiB",
        delivered.len(),
        skipped.len(),
        peak >> 20
    );
    assert!(peak < 1 << 30, "peak resident set {peak} bytes");
}
