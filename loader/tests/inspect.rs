//! `wick inspect` finishes on a folder of hostile files (truncated,
//! zero-byte, misnamed, a decompression bomb's header, not an image, a
//! link loop, a link to a folder, no read permission), names every bad
//! file with its reason, reports modes (gray, alpha, 16-bit, palette,
//! CMYK, progressive) and exits 1; on clean shards it exits 0.
#![cfg(feature = "cli")]

use image::{ImageFormat, Rgb, RgbImage};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn rgb(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| Rgb([(x * 7) as u8, (y * 5) as u8, 90]))
}

fn save(img: image::DynamicImage, path: &Path, format: ImageFormat) {
    img.save_with_format(path, format).unwrap();
}

fn jpeg(w: u16, h: u16, color: jpeg_encoder::ColorType, progressive: bool) -> Vec<u8> {
    let channels = match color {
        jpeg_encoder::ColorType::Cmyk => 4,
        _ => 3,
    };
    let px: Vec<u8> = (0..usize::from(w) * usize::from(h) * channels)
        .map(|i| (i * 13 % 251) as u8)
        .collect();
    let mut out = Vec::new();
    let mut enc = jpeg_encoder::Encoder::new(&mut out, 90);
    enc.set_progressive(progressive);
    enc.encode(&px, w, h, color).unwrap();
    out
}

/// A baseline JPEG header declaring 12,000 x 12,000 with no scan data.
fn bomb() -> Vec<u8> {
    let mut j = vec![0xFF, 0xD8, 0xFF, 0xDB, 0, 67, 0];
    j.extend([1u8; 64]);
    j.extend([0xFF, 0xC0, 0, 17, 8, 0x2E, 0xE0, 0x2E, 0xE0, 3]);
    j.extend([1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0, 0xFF, 0xD9]);
    j
}

fn inspect(data: &Path) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["inspect", "--json"])
        .arg(data)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), json)
}

fn names(v: &serde_json::Value, key: Option<&str>) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let s = match key {
                Some(k) => x[k].as_str().unwrap(),
                None => x.as_str().unwrap(),
            };
            Path::new(s).file_name().unwrap().to_string_lossy().into()
        })
        .collect()
}

#[test]
fn inspect_names_every_hostile_file_and_reports_modes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("data");
    let sub = d.join("class0");
    std::fs::create_dir_all(&sub).unwrap();
    // Good files, one of each mode.
    save(rgb(30, 20).into(), &sub.join("rgb.jpg"), ImageFormat::Jpeg);
    save(
        image::DynamicImage::ImageRgb8(rgb(30, 20))
            .to_luma8()
            .into(),
        &sub.join("gray.png"),
        ImageFormat::Png,
    );
    save(
        image::DynamicImage::ImageRgb8(rgb(30, 20))
            .to_rgba8()
            .into(),
        &sub.join("alpha.png"),
        ImageFormat::Png,
    );
    save(
        image::DynamicImage::ImageRgb8(rgb(30, 20))
            .to_rgb16()
            .into(),
        &sub.join("deep.png"),
        ImageFormat::Png,
    );
    save(rgb(17, 9).into(), &sub.join("small.bmp"), ImageFormat::Bmp);
    save(
        rgb(12, 12).into(),
        &sub.join("lossless.webp"),
        ImageFormat::WebP,
    );
    let mut palette = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut palette, 4, 4);
        enc.set_color(png::ColorType::Indexed);
        enc.set_palette(vec![0, 0, 0, 255, 0, 0]);
        let mut w = enc.write_header().unwrap();
        // 8 bits per index: 16 bytes.
        w.write_image_data(&[0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1])
            .unwrap();
        w.finish().unwrap();
    }
    std::fs::write(sub.join("palette.png"), &palette).unwrap();
    std::fs::write(
        sub.join("cmyk.jpg"),
        jpeg(16, 16, jpeg_encoder::ColorType::Cmyk, false),
    )
    .unwrap();
    std::fs::write(
        sub.join("progressive.jpg"),
        jpeg(24, 16, jpeg_encoder::ColorType::Rgb, true),
    )
    .unwrap();
    // A PNG named .jpg: good, listed as misnamed.
    save(
        rgb(8, 8).into(),
        &sub.join("really_png.jpg"),
        ImageFormat::Png,
    );
    // Bad ones.
    let mut cut = jpeg(64, 64, jpeg_encoder::ColorType::Rgb, false);
    cut.truncate(cut.len() / 4);
    std::fs::write(sub.join("truncated.jpg"), cut).unwrap();
    std::fs::write(sub.join("empty.jpg"), b"").unwrap();
    std::fs::write(sub.join("bomb.jpg"), bomb()).unwrap();
    std::fs::write(sub.join("notes.png"), b"this is text, not a picture").unwrap();
    std::os::unix::fs::symlink("loop_b.jpg", sub.join("loop_a.jpg")).unwrap();
    std::os::unix::fs::symlink("loop_a.jpg", sub.join("loop_b.jpg")).unwrap();
    // Ignored: not an image, and a link to a folder (not followed).
    std::fs::write(d.join("README.txt"), b"about this dataset").unwrap();
    std::os::unix::fs::symlink("..", sub.join("up")).unwrap();
    // Unreadable (root reads it anyway: then it is a good image).
    let locked = sub.join("locked.jpg");
    save(rgb(8, 8).into(), &locked, ImageFormat::Jpeg);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let root = std::fs::read(&locked).is_ok();

    let (code, r) = inspect(&d);
    assert_eq!(code, 1, "bad files: exit 1\n{r:#}");
    let mut want_bad: BTreeSet<String> = [
        "truncated.jpg",
        "empty.jpg",
        "bomb.jpg",
        "notes.png",
        "loop_a.jpg",
        "loop_b.jpg",
    ]
    .map(String::from)
    .into();
    if !root {
        want_bad.insert("locked.jpg".into());
    }
    assert_eq!(names(&r["bad"], Some("key")), want_bad, "{r:#}");
    for b in r["bad"].as_array().unwrap() {
        let (key, reason) = (b["key"].as_str().unwrap(), b["reason"].as_str().unwrap());
        match Path::new(key).file_name().unwrap().to_str().unwrap() {
            "bomb.jpg" => assert!(reason.contains("89478485 pixels"), "{reason}"),
            "empty.jpg" => assert!(reason.contains("empty"), "{reason}"),
            "loop_a.jpg" | "loop_b.jpg" => {
                assert!(reason.contains("symbolic links"), "{reason}")
            }
            "locked.jpg" => assert!(reason.contains("ermission denied"), "{reason}"),
            _ => assert!(!reason.is_empty()),
        }
    }
    assert_eq!(
        names(&r["ignored"], None),
        ["README.txt", "up"].map(String::from).into()
    );
    assert_eq!(
        names(&r["misnamed"], None),
        ["really_png.jpg".to_string()].into()
    );
    let modes = &r["modes"];
    for m in [
        "gray",
        "rgba",
        "16-bit",
        "palette",
        "cmyk",
        "progressive",
        "rgb",
    ] {
        assert!(modes[m].as_u64().unwrap_or(0) >= 1, "mode {m}: {modes}");
    }
    for f in ["jpeg", "png", "bmp", "webp"] {
        assert!(
            r["formats"][f].as_u64().unwrap_or(0) >= 1,
            "format {f}: {r:#}"
        );
    }
    assert_eq!(r["max_size"], serde_json::json!([30, 20]), "{r:#}");
}

#[test]
fn inspect_reads_shards_and_exits_0_when_all_is_well() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    for i in 0..6u32 {
        let class = folder.join(format!("c{}", i % 2));
        std::fs::create_dir_all(&class).unwrap();
        save(
            rgb(20 + i, 16).into(),
            &class.join(format!("{i}.png")),
            ImageFormat::Png,
        );
    }
    let shards = dir.path().join("shards");
    let status = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["convert", "--format", "wds", "--shard-size", "4"])
        .arg(&folder)
        .arg(&shards)
        .status()
        .unwrap();
    assert!(status.success());
    for data in [&folder, &shards] {
        let (code, r) = inspect(data);
        assert_eq!(code, 0, "{r:#}");
        assert_eq!(r["images"], 6, "{r:#}");
        assert_eq!(r["bad"].as_array().unwrap().len(), 0);
    }
}

/// A Megatron dataset of `docs` (one sequence each, `u16`) at `prefix`.
fn megatron(prefix: &Path, docs: &[&[u16]]) {
    let mut bin = Vec::new();
    let mut idx = b"MMIDIDX\0\0".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(8);
    idx.extend((docs.len() as u64).to_le_bytes());
    idx.extend((docs.len() as u64 + 1).to_le_bytes());
    let mut pointers = Vec::new();
    for d in docs {
        idx.extend((d.len() as i32).to_le_bytes());
        pointers.extend((bin.len() as i64).to_le_bytes());
        bin.extend(d.iter().flat_map(|t| t.to_le_bytes()));
    }
    idx.extend(pointers);
    for i in 0..=docs.len() as i64 {
        idx.extend(i.to_le_bytes());
    }
    std::fs::write(prefix.with_extension("bin"), bin).unwrap();
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
}

/// A folder of class folders that also holds an unlabeled `.tar`, a
/// Megatron dataset, a GIF and a TIFF: the survey decodes all of it,
/// says what the loader opens and what it leaves out, and finds nothing
/// bad (exit 0).
#[test]
fn inspect_surveys_a_folder_of_several_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("mixed");
    for (i, class) in ["cat", "dog"].iter().enumerate() {
        let c = d.join(class);
        std::fs::create_dir_all(&c).unwrap();
        for j in 0..4u32 {
            save(
                rgb(20 + j, 10).into(),
                &c.join(format!("{j}.jpg")),
                ImageFormat::Jpeg,
            );
        }
        save(
            rgb(9, 7 + i as u32).into(),
            &c.join("x.gif"),
            ImageFormat::Gif,
        );
        save(rgb(11, 5).into(), &c.join("y.tif"), ImageFormat::Tiff);
    }
    // An unlabeled WebDataset shard of two images.
    let loose = dir.path().join("loose");
    std::fs::create_dir_all(&loose).unwrap();
    save(rgb(5, 5).into(), &loose.join("a.jpg"), ImageFormat::Jpeg);
    save(rgb(6, 6).into(), &loose.join("b.png"), ImageFormat::Png);
    let status = Command::new("tar")
        .arg("cf")
        .arg(d.join("extra.tar"))
        .args(["-C", loose.to_str().unwrap(), "a.jpg", "b.png"])
        .status()
        .unwrap();
    assert!(status.success());
    megatron(&d.join("corpus"), &[&[1, 2, 3], &[4, 5]]);

    let (code, r) = inspect(&d);
    assert_eq!(code, 0, "{r:#}");
    // 8 JPEGs, 2 GIFs, 2 TIFFs in the class folders, 2 in the shard.
    assert_eq!(r["images"], 14, "{r:#}");
    assert_eq!(r["formats"]["gif"], 2, "{r:#}");
    assert_eq!(r["formats"]["tiff"], 2, "{r:#}");
    let opened = r["opened_as"].as_str().unwrap();
    assert!(opened.starts_with("an image folder"), "{opened}");
    let strays = names(&r["strays"], None);
    assert!(
        strays.contains("extra.tar") && strays.contains("corpus"),
        "{strays:?}"
    );
    assert_eq!(
        names(&r["unlabeled"], None),
        ["extra.tar".to_string()].into()
    );
    let corpus = &r["token_corpora"][0];
    assert_eq!(
        (corpus["documents"].as_u64(), corpus["tokens"].as_u64()),
        (Some(2), Some(5))
    );
    assert_eq!(r["ignored"].as_array().unwrap().len(), 0, "{r:#}");

    // The shard alone: unlabeled is fine for inspect.
    let (code, r) = inspect(&d.join("extra.tar"));
    assert_eq!((code, r["images"].as_u64()), (0, Some(2)), "{r:#}");
}

/// A valid tiled planar TIFF (tests/fixtures/tiled_planar.tif: 40x24, one
/// plane a channel, edge tiles padded), on which the tiff crate 0.11
/// asserts: `wick inspect` names it as bad, saying which layout, and
/// surveys the rest (it exited 101 with a backtrace).
#[test]
fn inspect_survives_a_decoder_that_panics() {
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("a");
    std::fs::create_dir_all(&class).unwrap();
    save(rgb(8, 6).into(), &class.join("ok.png"), ImageFormat::Png);
    let tiff = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/tiled_planar.tif"
    );
    std::fs::copy(tiff, class.join("planar.tif")).unwrap();
    let (code, r) = inspect(dir.path());
    assert_eq!(code, 1, "a bad file: exit 1\n{r:#}");
    let bad = r["bad"].as_array().unwrap();
    assert_eq!(bad.len(), 1, "{r:#}");
    assert!(bad[0]["key"].as_str().unwrap().ends_with("planar.tif"));
    assert!(bad[0]["reason"].as_str().unwrap().contains("TIFF"), "{r:#}");
}
