//! Time to the first batch and peak memory of a Parquet image dataset
//! (a local file or a URL), two ways:
//!
//! - `first-batch wick PATH_OR_URL [BATCH]`: wick's Parquet source (the
//!   footer and the row groups a batch needs, by ranged reads) through the
//!   loader, shuffled, 224x224 RandomResizedCrop;
//! - `first-batch rowwise PATH_OR_URL [BATCH] [--lazy]`: what Candle users
//!   have today in `candle-datasets` (`hub::from_hub` + its vision loaders):
//!   the whole file downloaded first (a URL is fetched with `curl` to a
//!   temporary file, as hf-hub fetches it to its cache), then read row by row
//!   with the parquet crate's record API (`SerializedFileReader`, rows'
//!   `get_column_iter`), every image decoded and resized to 224x224 into one
//!   buffer, the batch taken from it. `--lazy` stops after BATCH rows (a
//!   kinder variant than `candle-datasets`, which materialises the split).
//!
//! Prints `first_batch_s` (from the start of the process) and `peak_rss_mb`.
//! The image is resized with the `image` crate's triangle filter in the
//! rowwise path: what a user of that crate writes.

use benches::peak_rss_mb;
use candle_wick::{Loader, Output};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use std::time::Instant;

/// The image bytes of a Hub image row (`image: {bytes, path}`).
fn image_bytes(row: &parquet::record::Row) -> Option<Vec<u8>> {
    for (name, field) in row.get_column_iter() {
        if name != "image" {
            continue;
        }
        if let Field::Group(sub) = field {
            for (n, f) in sub.get_column_iter() {
                if let (true, Field::Bytes(b)) = (n == "bytes", f) {
                    return Some(b.data().to_vec());
                }
            }
        }
    }
    None
}

fn rowwise(target: &str, batch: usize, lazy: bool) -> Result<(), Box<dyn std::error::Error>> {
    let tmp = std::env::temp_dir().join(format!("first-batch-{}.parquet", std::process::id()));
    let file = if target.contains("://") {
        let ok = std::process::Command::new("curl")
            .args(["-sf", "-o"])
            .arg(&tmp)
            .arg(target)
            .status()?
            .success();
        if !ok {
            return Err(format!("curl {target} failed").into());
        }
        std::fs::File::open(&tmp)?
    } else {
        std::fs::File::open(target)?
    };
    let _ = std::fs::remove_file(&tmp); // the open file stays readable
    let reader = SerializedFileReader::new(file)?;
    let rows = reader.metadata().file_metadata().num_rows() as usize;
    let side = 224u32;
    let want = if lazy { batch.min(rows) } else { rows };
    let mut pixels: Vec<u8> = Vec::with_capacity(want * (side * side * 3) as usize);
    let mut n = 0;
    for row in reader.get_row_iter(None)? {
        let row = row?;
        let bytes = image_bytes(&row).ok_or("a row without image.bytes")?;
        let img = image::load_from_memory(&bytes)?.to_rgb8();
        let img = image::imageops::resize(&img, side, side, image::imageops::FilterType::Triangle);
        pixels.extend_from_slice(img.as_raw());
        n += 1;
        if n == want {
            break;
        }
    }
    let first = &pixels[..batch.min(n) * (side * side * 3) as usize];
    println!("rows_materialised {n} first_batch_bytes {}", first.len());
    Ok(())
}

fn wick(target: &str, batch: usize) -> Result<(), Box<dyn std::error::Error>> {
    let source = candle_wick::source::Parquet::open([target])?;
    let mut loader = Loader::builder(source)
        .batch_size(batch)
        .image_size(224)
        .output(Output::U8Nhwc)
        .shuffle(1)
        .build()?;
    let b = loader.epoch(0).next().ok_or("no batch")??;
    println!("first_batch_rows {}", b.len());
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "first-batch wick|rowwise PATH_OR_URL [BATCH] [--lazy]";
    let (mode, target) = match (args.first(), args.get(1)) {
        (Some(m), Some(t)) => (m.as_str(), t.as_str()),
        _ => return Err(usage.into()),
    };
    let batch = args
        .get(2)
        .filter(|a| !a.starts_with("--"))
        .map_or(Ok(64), |b| b.parse())?;
    let lazy = args.iter().any(|a| a == "--lazy");
    match mode {
        "wick" => wick(target, batch)?,
        "rowwise" => rowwise(target, batch, lazy)?,
        _ => return Err(usage.into()),
    }
    println!(
        "first_batch_s {:.3} peak_rss_mb {:.0}",
        start.elapsed().as_secs_f64(),
        peak_rss_mb()
    );
    Ok(())
}
