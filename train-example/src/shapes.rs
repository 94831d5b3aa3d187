//! The built-in dataset: coloured shapes in 10 classes, written once as real
//! JPEG files so the whole input path (files, decode, augment) runs.

use image::{codecs::jpeg::JpegEncoder, Rgb, RgbImage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};

/// Class names, in label order (sorted, as ImageFolder lists them).
pub(crate) const CLASSES: [&str; 10] = [
    "circle", "cross", "diamond", "frame", "hbars", "plus", "ring", "square", "triangle", "vbars",
];
/// Side of the generated images.
pub(crate) const SIDE: u32 = 40;

/// Whether offset `(dx, dy)` from the centre is inside shape `class` of radius `r`.
fn inside(class: &str, dx: f32, dy: f32, r: f32) -> bool {
    let (ax, ay) = (dx.abs(), dy.abs());
    let d = (dx * dx + dy * dy).sqrt();
    match class {
        "circle" => d <= r,
        "square" => ax <= 0.8 * r && ay <= 0.8 * r,
        "triangle" => dy <= 0.8 * r && dy >= -r && ax <= (dy + r) / 1.8,
        "ring" => d <= r && d >= 0.55 * r,
        "frame" => ax.max(ay) <= 0.85 * r && ax.max(ay) >= 0.5 * r,
        "plus" => (ax <= 0.25 * r && ay <= r) || (ay <= 0.25 * r && ax <= r),
        "cross" => {
            ax <= 0.8 * r
                && ay <= 0.8 * r
                && ((dx - dy).abs() <= 0.35 * r || (dx + dy).abs() <= 0.35 * r)
        }
        "hbars" => ax <= r && ay <= r && (((dy + r) / (r / 2.5)) as i32) % 2 == 0,
        "vbars" => ax <= r && ay <= r && (((dx + r) / (r / 2.5)) as i32) % 2 == 0,
        "diamond" => ax + ay <= r,
        _ => false,
    }
}

fn draw(class: &str, rng: &mut ChaCha8Rng) -> RgbImage {
    let c = SIDE as f32 / 2.0;
    let (cx, cy) = (
        c + rng.random_range(-5.0..5.0),
        c + rng.random_range(-5.0..5.0),
    );
    let r = rng.random_range(9.0..14.0);
    let fg = [0, 1, 2].map(|_| rng.random_range(110..=255u8));
    let bg = [0, 1, 2].map(|_| rng.random_range(0..=90u8));
    RgbImage::from_fn(SIDE, SIDE, |x, y| {
        let on = inside(class, x as f32 + 0.5 - cx, y as f32 + 0.5 - cy, r);
        let base = if on { fg } else { bg };
        Rgb(base.map(|v| v.saturating_add_signed(rng.random_range(-12..=12i8))))
    })
}

/// Writes `root/{train,val}/<class>/NNNN.jpg` unless a complete copy is
/// there already. Returns the train and val folders.
pub(crate) fn ensure(
    root: &Path,
    train_per_class: usize,
    val_per_class: usize,
) -> std::io::Result<(PathBuf, PathBuf)> {
    let (train, val) = (root.join("train"), root.join("val"));
    let marker_name = format!(".complete-{train_per_class}-{val_per_class}");
    let marker = root.join(&marker_name);
    if marker.exists() {
        return Ok((train, val));
    }
    // Written aside and renamed into place, so that ranks started together
    // (one process per GPU) never read or delete one another's half-made set.
    let name = root
        .file_name()
        .map_or("data".into(), |n| n.to_string_lossy());
    let tmp = root.with_file_name(format!("{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    for (split, per_class, seed) in [("train", train_per_class, 1u64), ("val", val_per_class, 2)] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for class in CLASSES {
            let dir = tmp.join(split).join(class);
            std::fs::create_dir_all(&dir)?;
            for i in 0..per_class {
                let img = draw(class, &mut rng);
                let file = std::fs::File::create(dir.join(format!("{i:04}.jpg")))?;
                JpegEncoder::new_with_quality(std::io::BufWriter::new(file), 90)
                    .encode_image(&img)
                    .map_err(std::io::Error::other)?;
            }
        }
    }
    std::fs::write(tmp.join(&marker_name), b"")?;
    if root.exists() && !marker.exists() {
        // An older or interrupted set (another rank may remove it first).
        match std::fs::remove_dir_all(root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    match std::fs::rename(&tmp, root) {
        Ok(()) => {}
        // Another rank finished first: its set is the same.
        Err(_) if marker.exists() => std::fs::remove_dir_all(&tmp)?,
        Err(e) => return Err(e),
    }
    Ok((train, val))
}
