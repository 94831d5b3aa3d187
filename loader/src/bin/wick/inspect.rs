//! `wick inspect DATA`: decodes every sample of a dataset in parallel and
//! says what is in it and what is bad.
//!
//! DATA is a shard file (TFRecord, WebDataset tar, safetensors), a
//! Megatron `.idx`, a file list, or any of them (or an image folder) at a
//! URL, read through the loader's own sources; or a folder, which is
//! surveyed whatever it holds: every image is decoded, every shard opened
//! and its samples decoded (unlabeled WebDataset shards too), every
//! Megatron dataset checked and counted, and the report says what the
//! loader would open the folder as and why (`source::detect`), or why it
//! would refuse it, with the files of another kind it leaves out. Nothing
//! in the folder stops the survey: a shard that cannot be opened is bad
//! like an image that cannot be decoded. The folder is walked without
//! following links to folders (no link loop can trap it), and a file that
//! cannot be read (no permission, a dangling or looping link) is bad.
//! Decoding is the loader's own (`decode_rgb_into`, with its
//! decompression-bomb limit). A file that is neither named nor made like
//! an image or a shard is listed as ignored (the loader does not read
//! it), not as bad.

use candle_wick::source::{detect, DatasetKind, DocumentWindows, Megatron};
use candle_wick::{error_chain, Source};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub(crate) struct InspectArgs {
    /// The dataset: shards, a file list, or any folder.
    pub(crate) data: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
}

/// What one sample turned out to be.
#[derive(Debug)]
enum Seen {
    Image(Image),
    Bad { key: String, reason: String },
    Ignored { key: String },
}

/// A sample that decoded.
#[derive(Debug)]
struct Image {
    key: String,
    format: &'static str,
    width: usize,
    height: usize,
    /// gray, gray+alpha, rgb, rgba, cmyk, palette, 16-bit, progressive.
    modes: Vec<&'static str>,
    /// The file's name says another format.
    misnamed: bool,
}

/// The report `--json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    data: PathBuf,
    /// What the loader opens DATA as, and why (or why it refuses).
    opened_as: String,
    /// Files of DATA that the loader leaves out (another kind).
    strays: Vec<String>,
    /// Shards and files of each kind found.
    kinds: BTreeMap<&'static str, usize>,
    /// WebDataset shards whose samples have no label member.
    unlabeled: Vec<String>,
    /// Megatron datasets: each prefix's documents and tokens.
    token_corpora: Vec<TokenCorpus>,
    samples: usize,
    images: usize,
    bad: Vec<BadSample>,
    ignored: Vec<String>,
    formats: BTreeMap<&'static str, usize>,
    modes: BTreeMap<&'static str, usize>,
    misnamed: Vec<String>,
    /// Smallest and largest width and height, and the median pixel count.
    min_size: Option<(usize, usize)>,
    max_size: Option<(usize, usize)>,
    median_pixels: Option<usize>,
    seconds: f64,
}

/// A Megatron dataset found, checked against its index.
#[derive(Debug, Serialize)]
struct TokenCorpus {
    prefix: String,
    token_type: String,
    documents: usize,
    tokens: u64,
}

/// A bad sample and why, with the whole cause chain.
#[derive(Debug, Serialize)]
struct BadSample {
    key: String,
    reason: String,
}

/// The format by the file's first bytes.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [0xFF, 0xD8, ..] => Some("jpeg"),
        [0x89, b'P', b'N', b'G', ..] => Some("png"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("webp"),
        [b'B', b'M', ..] => Some("bmp"),
        [b'G', b'I', b'F', ..] => Some("gif"),
        [b'I', b'I', 42, 0, ..] | [b'M', b'M', 0, 42, ..] => Some("tiff"),
        _ => None,
    }
}

/// The format a file name says.
fn named(key: &str) -> Option<&'static str> {
    let ext = Path::new(key).extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "jpg" | "jpeg" | "jpe" => "jpeg",
        "png" => "png",
        "webp" => "webp",
        "bmp" | "dib" => "bmp",
        "gif" => "gif",
        "tif" | "tiff" => "tiff",
        _ => return None,
    })
}

/// Modes read from a JPEG's frame header (component count, progressive)
/// and a PNG's IHDR (palette), which decoding to RGB hides.
fn header_modes(format: &str, bytes: &[u8], modes: &mut Vec<&'static str>) {
    match format {
        "jpeg" => {
            if let Some(f) = candle_wick::__bench::jpeg_frame(bytes) {
                if matches!(f.marker, 0xC2 | 0xC6 | 0xCA | 0xCE) {
                    modes.push("progressive");
                }
                if f.precision > 8 {
                    modes.push("12-bit");
                }
                if f.components == 4 {
                    modes.push("cmyk");
                }
            }
        }
        "png" if bytes.len() > 25 && bytes[25] == 3 => modes.push("palette"),
        _ => {}
    }
}

/// Whether a JPEG has no end-of-image marker after its last scan (data
/// after the marker, as some cameras append, is not truncation; the
/// entropy-coded data never holds `FF D9`).
fn jpeg_truncated(bytes: &[u8]) -> bool {
    let last = |m: u8| bytes.windows(2).rposition(|w| w == [0xFF, m]);
    match (last(0xDA), last(0xD9)) {
        (Some(sos), Some(eoi)) => eoi < sos,
        (_, None) => true,
        (None, Some(_)) => false,
    }
}

/// Decodes one sample's bytes as the loader does; a panic in any decoder
/// is that sample's error, and the survey goes on.
fn inspect_bytes(key: String, bytes: &[u8], from_folder: bool) -> Seen {
    let k = key.clone();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        inspect_unguarded(key, bytes, from_folder)
    }))
    .unwrap_or_else(|_| Seen::Bad {
        key: k,
        reason: "a decoder panicked on this file".into(),
    })
}

/// [`inspect_bytes`] without the guard.
fn inspect_unguarded(key: String, bytes: &[u8], from_folder: bool) -> Seen {
    let format = sniff(bytes);
    if from_folder && format.is_none() && named(&key).is_none() {
        return Seen::Ignored { key };
    }
    let mut px = Vec::new();
    let size = match candle_wick::ops::decode_rgb_into(&key, bytes, &mut px) {
        Ok(size) => size,
        Err(e) => {
            return Seen::Bad {
                reason: error_chain(&e),
                key,
            }
        }
    };
    // The loader decodes a JPEG cut short, the missing rows grey, as
    // libjpeg does; the dataset still has a damaged file.
    if format == Some("jpeg") && jpeg_truncated(bytes) {
        return Seen::Bad {
            key,
            reason: "truncated: no end-of-image marker (the loader decodes it with the \
                     missing part grey)"
                .into(),
        };
    }
    let mut modes = Vec::new();
    // The colour type before conversion to RGB.
    let color = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .ok()
        .and_then(|r| r.into_decoder().ok())
        .map(|d| image::ImageDecoder::color_type(&d));
    if let Some(c) = color {
        use image::ColorType::*;
        modes.push(match c {
            L8 | L16 => "gray",
            La8 | La16 => "gray+alpha",
            Rgba8 | Rgba16 | Rgba32F => "rgba",
            _ => "rgb",
        });
        if c.bytes_per_pixel() / c.channel_count() > 1 {
            modes.push("16-bit");
        }
    }
    let format = format.unwrap_or("other");
    header_modes(format, bytes, &mut modes);
    if modes.contains(&"cmyk") {
        modes.retain(|m| *m != "rgb");
    }
    Seen::Image(Image {
        misnamed: named(&key).is_some_and(|n| n != format),
        key,
        format,
        width: size.width,
        height: size.height,
        modes,
    })
}

/// Every file under `root`, links to folders not followed; what cannot be
/// listed is bad.
fn walk(root: &Path, files: &mut Vec<PathBuf>, bad: &mut Vec<Seen>) {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) => {
            bad.push(Seen::Bad {
                key: root.display().to_string(),
                reason: format!("cannot list the folder: {e}"),
            });
            return;
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => walk(&path, files, bad),
            // A link is read through (a loop or a dangling one fails the
            // read), unless it leads to a folder: not followed.
            Ok(m) if m.file_type().is_symlink() && path.is_dir() => bad.push(Seen::Ignored {
                key: path.display().to_string(),
            }),
            Ok(_) => files.push(path),
            Err(e) => bad.push(Seen::Bad {
                key: path.display().to_string(),
                reason: format!("cannot stat: {e}"),
            }),
        }
    }
}

/// What the survey found besides samples.
#[derive(Default)]
struct Extra {
    kinds: BTreeMap<&'static str, usize>,
    unlabeled: Vec<String>,
    token_corpora: Vec<TokenCorpus>,
}

/// Opens shards `paths` of `kind` as a source, as leniently as the format
/// allows: WebDataset shards without labels too (listed in `unlabeled`).
fn open_shards(
    kind: DatasetKind,
    paths: &[PathBuf],
    extra: &mut Extra,
) -> candle_wick::Result<Box<dyn Source>> {
    let (source, gave_up) = kind.open_lenient(paths)?;
    if gave_up.is_some() {
        extra
            .unlabeled
            .extend(paths.iter().map(|p| p.display().to_string()));
    }
    Ok(source)
}

/// Checks and counts the Megatron dataset at `prefix`.
fn token_corpus(prefix: &Path, seen: &mut Vec<Seen>, extra: &mut Extra) {
    let windows = DocumentWindows::Packed { eos: None };
    match Megatron::open([prefix], 1, windows) {
        Ok(m) => extra.token_corpora.push(TokenCorpus {
            prefix: prefix.display().to_string(),
            token_type: format!("{:?}", m.token_types()[0]),
            documents: m.documents(),
            tokens: m.tokens(),
        }),
        Err(e) => seen.push(Seen::Bad {
            key: prefix.display().to_string(),
            reason: error_chain(&e),
        }),
    }
}

/// Every sample of `source`, decoded in parallel on `pool`.
fn inspect_source(source: &dyn Source, pool: &rayon::ThreadPool) -> Vec<Seen> {
    let pb = bar(source.len());
    let seen = pool.install(|| {
        (0..source.len())
            .into_par_iter()
            .map(|i| {
                let s = match source.read(i) {
                    // Stored decoded (safetensors pixels): nothing to decode.
                    Ok(r) => match r.rgb_size {
                        Some(size) => Seen::Image(Image {
                            key: r.key,
                            format: "pixels",
                            width: size.width,
                            height: size.height,
                            modes: vec!["rgb"],
                            misnamed: false,
                        }),
                        None => inspect_bytes(r.key, &r.bytes, false),
                    },
                    Err(e) => Seen::Bad {
                        key: source.key(i),
                        reason: error_chain(&e),
                    },
                };
                pb.inc(1);
                s
            })
            .collect()
    });
    pb.finish_and_clear();
    seen
}

fn bar(n: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(n as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} samples, {per_sec}, eta {eta}",
        )
        .expect("a valid template"),
    );
    bar
}

pub(crate) fn run(a: &InspectArgs) -> Result<Report, Box<dyn std::error::Error>> {
    let t = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()?;
    let detected = detect(&a.data);
    let (opened_as, strays) = match &detected {
        Ok(d) => (
            format!("{}: {}", d.kind.name(), d.why),
            d.strays.iter().map(|p| p.display().to_string()).collect(),
        ),
        Err(e) => (format!("not opened: {}", error_chain(e)), Vec::new()),
    };
    let mut seen = Vec::new();
    let mut extra = Extra::default();
    if candle_wick::storage::is_url(&a.data) || a.data.is_file() {
        // One dataset, read through the loader's sources.
        let d = detected?;
        *extra.kinds.entry(d.kind.name()).or_default() += d.paths.len();
        match d.kind {
            DatasetKind::Megatron => token_corpus(&d.paths[0], &mut seen, &mut extra),
            kind => {
                let source = open_shards(kind, &d.paths, &mut extra)?;
                seen = inspect_source(&*source, &pool);
            }
        }
    } else {
        // A folder: everything in it.
        let mut files = Vec::new();
        walk(&a.data, &mut files, &mut seen);
        let mut megatron: Vec<PathBuf> = Vec::new();
        let mut shards: Vec<(DatasetKind, PathBuf)> = Vec::new();
        let mut others = Vec::new();
        for p in files {
            match DatasetKind::of_file(&p) {
                Some(DatasetKind::Megatron) => megatron.push(p.with_extension("")),
                Some(kind) => shards.push((kind, p)),
                None => others.push(p),
            }
        }
        // A shard is inspected through its source, and a Megatron
        // dataset's two files as one.
        others.retain(|p| !megatron.contains(&p.with_extension("")));
        let files = others;
        for prefix in &megatron {
            *extra.kinds.entry(DatasetKind::Megatron.name()).or_default() += 1;
            token_corpus(prefix, &mut seen, &mut extra);
        }
        for (kind, shard) in &shards {
            *extra.kinds.entry(kind.name()).or_default() += 1;
            match open_shards(*kind, std::slice::from_ref(shard), &mut extra) {
                Ok(source) => seen.extend(inspect_source(&*source, &pool)),
                Err(e) => seen.push(Seen::Bad {
                    key: shard.display().to_string(),
                    reason: error_chain(&e),
                }),
            }
        }
        let pb = bar(files.len());
        let found: Vec<Seen> = pool.install(|| {
            files
                .par_iter()
                .map(|path| {
                    let key = path.display().to_string();
                    let s = match std::fs::read(path) {
                        Ok(bytes) => inspect_bytes(key, &bytes, true),
                        Err(e) => Seen::Bad {
                            key,
                            reason: format!("cannot read: {e}"),
                        },
                    };
                    pb.inc(1);
                    s
                })
                .collect()
        });
        pb.finish_and_clear();
        let images = found.iter().filter(|s| matches!(s, Seen::Image(_))).count();
        if images > 0 {
            extra.kinds.insert("image files", images);
        }
        seen.extend(found);
    }
    let mut r = summarize(&a.data, seen, t.elapsed().as_secs_f64());
    r.opened_as = opened_as;
    r.strays = strays;
    r.kinds = extra.kinds;
    r.unlabeled = extra.unlabeled;
    r.token_corpora = extra.token_corpora;
    Ok(r)
}

fn summarize(data: &Path, seen: Vec<Seen>, seconds: f64) -> Report {
    let mut r = Report {
        data: data.into(),
        opened_as: String::new(),
        strays: Vec::new(),
        kinds: BTreeMap::new(),
        unlabeled: Vec::new(),
        token_corpora: Vec::new(),
        samples: seen.len(),
        images: 0,
        bad: Vec::new(),
        ignored: Vec::new(),
        formats: BTreeMap::new(),
        modes: BTreeMap::new(),
        misnamed: Vec::new(),
        min_size: None,
        max_size: None,
        median_pixels: None,
        seconds,
    };
    let mut pixels = Vec::new();
    for s in seen {
        match s {
            Seen::Image(img) => {
                r.images += 1;
                *r.formats.entry(img.format).or_default() += 1;
                for m in img.modes {
                    *r.modes.entry(m).or_default() += 1;
                }
                if img.misnamed {
                    r.misnamed.push(img.key);
                }
                let (w, h) = (img.width, img.height);
                r.min_size = Some(r.min_size.map_or((w, h), |(a, b)| (a.min(w), b.min(h))));
                r.max_size = Some(r.max_size.map_or((w, h), |(a, b)| (a.max(w), b.max(h))));
                pixels.push(w * h);
            }
            Seen::Bad { key, reason } => r.bad.push(BadSample { key, reason }),
            Seen::Ignored { key } => r.ignored.push(key),
        }
    }
    pixels.sort_unstable();
    r.median_pixels = pixels.get(pixels.len() / 2).copied();
    r.bad.sort_by(|a, b| a.key.cmp(&b.key));
    r
}

pub(crate) fn print_text(r: &Report) {
    println!(
        "{}: {} samples in {:.1} s: {} images, {} bad, {} ignored (not images)",
        r.data.display(),
        r.samples,
        r.seconds,
        r.images,
        r.bad.len(),
        r.ignored.len()
    );
    let list = |m: &BTreeMap<&str, usize>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("opened as {}", r.opened_as);
    if !r.strays.is_empty() {
        println!("left out by the loader ({}):", r.strays.len());
        for k in r.strays.iter().take(20) {
            println!("  {k}");
        }
        if r.strays.len() > 20 {
            println!("  ... and {} more", r.strays.len() - 20);
        }
    }
    println!("found: {}", list(&r.kinds));
    if !r.unlabeled.is_empty() {
        println!("WebDataset shards without labels ({}):", r.unlabeled.len());
        for k in &r.unlabeled {
            println!("  {k}");
        }
    }
    for t in &r.token_corpora {
        println!(
            "Megatron {}: {} documents, {} {} tokens",
            t.prefix, t.documents, t.tokens, t.token_type
        );
    }
    println!("formats: {}", list(&r.formats));
    println!("modes: {}", list(&r.modes));
    if let (Some(lo), Some(hi), Some(med)) = (r.min_size, r.max_size, r.median_pixels) {
        println!(
            "sizes: width {}..{}, height {}..{}, median {:.2} MP",
            lo.0,
            hi.0,
            lo.1,
            hi.1,
            med as f64 / 1e6
        );
    }
    if !r.misnamed.is_empty() {
        println!("named as another format ({}):", r.misnamed.len());
        for k in &r.misnamed {
            println!("  {k}");
        }
    }
    if !r.bad.is_empty() {
        println!("bad ({}):", r.bad.len());
        for b in &r.bad {
            println!("  {}: {}", b.key, b.reason);
        }
    }
}

/// Whether the report found anything bad (the exit code says so).
pub(crate) fn any_bad(r: &Report) -> bool {
    !r.bad.is_empty()
}
