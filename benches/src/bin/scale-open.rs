//! What opening a sharded dataset over the network costs one rank, with
//! and without its manifest.
//!
//! `scale-open make DIR SHARDS SAMPLES` writes `SHARDS` WebDataset shards
//! of `SAMPLES` samples each into `DIR` (a 2 KB `.jpg`, a `.cls` and a
//! `.txt` a sample) and indexes them over HTTP (`write::index`, what `wick
//! index URL` runs: the manifest records each shard's entity tag); the
//! manifest is kept aside as `DIR/manifest.json`.
//!
//! `scale-open DIR RANK WORLD manifest|scan [stream]` serves `DIR` on
//! 127.0.0.1 from a server that counts requests and body bytes (the
//! manifest only with `manifest`), opens the shards by URL, builds a
//! loader as rank `RANK` of `WORLD` (batch 32, shuffled; `stream`: the
//! streaming mode, 4 shards open, a 256-record shuffle buffer) and takes
//! its first batch. It prints the requests and bytes of the open and of
//! the first batch, the time to each, and the process's peak RSS
//! (`VmHWM`; the server reads each file from disk per request and holds
//! none). `benches/scale.sh` runs the matrix.
//!
//! `scale-open node DIR RANKS [alone]` serves `DIR` without its manifest
//! and opens the shards in `RANKS` threads at once, standing for the
//! ranks of one node (each holds its lock files on its own, as processes
//! do), with one cache directory (`alone`: none, each indexing every
//! shard), then once more after them (a rank started late). It prints
//! the requests and body bytes of the node's opens, as a multiple of the
//! shards' bytes, and of the late one.
//!
//! `scale-open epoch DIR RANK WORLD random|blocks` serves `DIR` with its
//! manifest and reads rank `RANK` of `WORLD`'s whole epoch 0 (batch 32,
//! shuffled): `random`, the epoch's permutation read sample by sample;
//! `blocks`, the shard-block shuffle (`shard_blocks`, default settings,
//! a 256 MiB RAM budget). It prints the epoch's requests and body bytes
//! (after the open) against the rank's share of the shards, its time,
//! the peak RSS, and the shuffle as the rank saw it: distinct shards in a
//! batch, and the shards the rank's samples came from.
//!
//! `scale-open node-epoch DIR RANKS PARTS [alone]` reads, in `RANKS`
//! threads at once (the ranks of one node, each a loader of its own),
//! the whole epoch 0 of ranks `0..RANKS` of `RANKS` by shard blocks in
//! `PARTS` parts, with one cache directory (`alone`: none, the chunks in
//! each rank's memory). It prints the node's requests and body bytes as
//! a multiple of the shards' bytes, and the wall time.
//!
//! `scale-open tfrecord DIR SHARDS RECORDS` writes `SHARDS` TFRecord
//! shards of `RECORDS` `tf.train.Example`s each (2 KB of noise as the
//! image, and a label) into `DIR/shards` (once), indexes them over HTTP as `wick index
//! URL` does (their `.idx` files and manifest kept in `DIR/index`), then
//! opens them by URL three ways, each from a fresh counting server: with
//! neither the `.idx` files nor the manifest served (read through), with
//! the `.idx` files, and with both. It prints each open's
//! requests, body bytes and time, and what reading one record then asks.
//!
//! A last row opens them with the manifest as 8 ranks of one node, one
//! after another, sharing a cache directory, each reading that record:
//! the node's requests and bytes, and each rank's at open and at its
//! read.
//!
//! `scale-open parquet DIR FILES ROWS` does the same for Parquet files
//! of `ROWS` rows (row groups of a tenth of a file; the image and label
//! columns), opened without and with their manifest (a window of one
//! row group, so a read reads ahead one group).

use benches::peak_rss_mb;
use candle_wick::fields::{Field, FieldType};
use candle_wick::map::{map_fn, Sample};
use candle_wick::source::{WebDataset, WebDatasetOptions};
use candle_wick::Loader;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tests::ObjectServer;

/// Shard `k`'s name.
fn shard_name(k: usize) -> String {
    format!("s-{k:06}.tar")
}

fn make(dir: &Path, shards: usize, samples: usize) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut bytes = 0u64;
    for k in 0..shards {
        let b = tests::wds_bytes(k * samples, samples, 2048);
        bytes += b.len() as u64;
        std::fs::write(dir.join(shard_name(k)), b)?;
    }
    // Indexed over HTTP, as `wick index URL` does it: the manifest then
    // records each shard's entity tag, and a rank opens a shard it reads
    // without a HEAD. The index files and manifest the server was sent
    // are kept in `dir`.
    let server = ObjectServer::start();
    server.put_dir("/ds", dir);
    let pattern = server.url(&format!("/ds/s-{{000000..{:06}}}.tar", shards - 1));
    let t = Instant::now();
    let done = candle_wick::write::index(Path::new(&pattern), &WebDatasetOptions::default())?;
    let took = t.elapsed();
    for k in 0..shards {
        let name = format!("{}.wickidx", shard_name(k));
        let index = server
            .get(&format!("/ds/{name}"))
            .ok_or("an index file not written")?;
        std::fs::write(dir.join(name), index)?;
    }
    let manifest = server
        .get("/ds/wick-manifest.json")
        .ok_or("no manifest written")?;
    std::fs::write(dir.join("manifest.json"), &manifest)?;
    let manifest = manifest.len() as u64;
    println!(
        "wrote {shards} shards of {samples} samples ({:.1} MB) and indexed them over HTTP in \
         {took:.1?}: index files {:.1} B a sample, manifest {:.0} B a shard",
        bytes as f64 / 1e6,
        (done.index_bytes - manifest) as f64 / done.records as f64,
        manifest as f64 / shards as f64,
    );
    Ok(())
}

/// A map that keeps each sample's image size (the loader reads, the
/// bench counts).
fn bytes_map() -> impl candle_wick::map::Map {
    map_fn(
        vec![Field::new("bytes", FieldType::U32, &[1])],
        |s: &mut Sample<'_>| {
            let n = s.record().bytes.len() as u32;
            s.take::<u32>(0)?.copy_from_slice(&[n]);
            Ok(())
        },
    )
}

/// `(requests, body bytes)` the server has seen.
fn counts(server: &ObjectServer) -> (usize, u64) {
    (server.log().len(), server.bytes_sent())
}

fn run(
    dir: &Path,
    rank: usize,
    world: usize,
    manifest: bool,
    stream: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let (server, urls, shard_bytes) = serve(dir, manifest)?;
    let t = Instant::now();
    let wds = WebDataset::open(&urls)?;
    let open_s = t.elapsed().as_secs_f64();
    let (open_requests, open_bytes) = counts(&server);
    let samples = candle_wick::Source::len(&wds);
    let mut b = Loader::builder(wds)
        .map(bytes_map())
        .batch_size(32)
        .shuffle(1234)
        .workers(2)
        .shard(rank, world);
    if stream {
        b = b.interleave(4, 1).shuffle_buffer(256);
    }
    let mut loader = b.build()?;
    let mut epoch = loader.epoch(0);
    let batch = epoch.next().ok_or("an epoch with no batch")??;
    let first_s = t.elapsed().as_secs_f64();
    drop(batch);
    let (requests, bytes) = counts(&server);
    println!(
        "{} shards, {samples} samples ({:.1} MB), rank {rank}/{world}, {}, {}",
        urls.len(),
        shard_bytes as f64 / 1e6,
        if manifest { "manifest" } else { "no manifest" },
        if stream { "streaming" } else { "random access" },
    );
    println!(
        "open: {open_requests} requests, {open_bytes} bytes ({:.3}% of the shards), {open_s:.3} s",
        100.0 * open_bytes as f64 / shard_bytes as f64
    );
    println!(
        "first batch: {} more requests, {} more bytes; {first_s:.3} s from the open",
        requests - open_requests,
        bytes - open_bytes
    );
    println!("peak_rss_mb {:.1}", peak_rss_mb());
    Ok(())
}

/// `DIR`'s shards served on 127.0.0.1 (with the manifest when
/// `manifest`): the server, the shards' URLs in name order, their bytes.
fn serve(
    dir: &Path,
    manifest: bool,
) -> Result<(ObjectServer, Vec<PathBuf>, u64), Box<dyn std::error::Error>> {
    let server = ObjectServer::start();
    server.put_dir("/ds", dir);
    if manifest {
        server.put(
            "/ds/wick-manifest.json",
            std::fs::read(dir.join("manifest.json"))?,
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.ends_with(".tar").then_some(name)
        })
        .collect();
    names.sort();
    let shard_bytes: u64 = names
        .iter()
        .map(|n| std::fs::metadata(dir.join(n)).map_or(0, |m| m.len()))
        .sum();
    let urls = names
        .iter()
        .map(|n| PathBuf::from(server.url(&format!("/ds/{n}"))))
        .collect();
    Ok((server, urls, shard_bytes))
}

/// The `node` mode (see the module's documentation).
fn node(dir: &Path, ranks: usize, alone: bool) -> Result<(), Box<dyn std::error::Error>> {
    use candle_wick::storage::{set_cache, RemoteCache};
    let (server, urls, shard_bytes) = serve(dir, false)?;
    let cache = std::env::temp_dir().join(format!("wick-scale-node-{}", std::process::id()));
    if !alone {
        set_cache(&RemoteCache::memory(0).disk(&cache, 1 << 40))?;
    }
    let t = Instant::now();
    let lens = std::thread::scope(|s| {
        let opens: Vec<_> = (0..ranks)
            .map(|_| s.spawn(|| WebDataset::open(&urls).map(|w| candle_wick::Source::len(&w))))
            .collect();
        opens
            .into_iter()
            .map(|o| o.join().expect("an open thread"))
            .collect::<candle_wick::Result<Vec<_>>>()
    })?;
    let took = t.elapsed().as_secs_f64();
    if lens.iter().any(|&n| n != lens[0]) {
        return Err(format!("the ranks saw different sample counts: {lens:?}").into());
    }
    let (requests, bytes) = counts(&server);
    println!(
        "{} shards ({:.1} MB), {ranks} ranks of a node, {}: {requests} requests, {bytes} bytes \
         ({:.2}x the shards), {took:.2} s",
        urls.len(),
        shard_bytes as f64 / 1e6,
        if alone {
            "no cache directory"
        } else {
            "one cache directory"
        },
        bytes as f64 / shard_bytes as f64
    );
    let t = Instant::now();
    WebDataset::open(&urls)?;
    let (r, b) = counts(&server);
    println!(
        "a rank started later: {} requests, {} bytes, {:.2} s",
        r - requests,
        b - bytes,
        t.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

/// The `epoch` mode (see the module's documentation).
fn epoch(
    dir: &Path,
    rank: usize,
    world: usize,
    blocks: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let (server, urls, shard_bytes) = serve(dir, true)?;
    let wds = WebDataset::open(&urls)?;
    let shards: Vec<(usize, usize)> = candle_wick::Source::shards(&wds)
        .iter()
        .map(|s| (s.first, s.records))
        .collect();
    let shard_of = |i: usize| shards.partition_point(|&(first, _)| first <= i) - 1;
    let mut b = Loader::builder(wds)
        .map(bytes_map())
        .batch_size(32)
        .shuffle(1234)
        .workers(2)
        .ram_budget(256 << 20)
        .shard(rank, world);
    if blocks {
        b = b.shard_blocks(candle_wick::ShardBlocks::new());
    }
    let mut loader = b.build()?;
    let (r0, b0) = counts(&server);
    let t = Instant::now();
    let (mut samples, mut batches, mut distinct) = (0usize, 0usize, 0usize);
    let mut touched = std::collections::HashSet::new();
    for batch in loader.epoch(0) {
        let batch = batch?;
        let s: std::collections::HashSet<usize> =
            batch.indices.iter().map(|&i| shard_of(i)).collect();
        distinct += s.len();
        touched.extend(s);
        samples += batch.indices.len();
        batches += 1;
    }
    let took = t.elapsed().as_secs_f64();
    let (r1, b1) = counts(&server);
    let share = shard_bytes as f64 / world as f64;
    println!(
        "{} shards ({:.1} MB), rank {rank}/{world}, {}: {samples} samples in {:.2} s",
        urls.len(),
        shard_bytes as f64 / 1e6,
        if blocks {
            "shard blocks"
        } else {
            "per-sample random access"
        },
        took
    );
    println!(
        "epoch: {} requests ({:.2} a sample), {} bytes ({:.2}x the rank's share)",
        r1 - r0,
        (r1 - r0) as f64 / samples.max(1) as f64,
        b1 - b0,
        (b1 - b0) as f64 / share
    );
    println!(
        "shuffle: {:.1} distinct shards a batch of 32, {} shards read by the rank",
        distinct as f64 / batches.max(1) as f64,
        touched.len()
    );
    println!("peak_rss_mb {:.1}", peak_rss_mb());
    Ok(())
}

/// The `node-epoch` mode (see the module's documentation).
fn node_epoch(
    dir: &Path,
    ranks: usize,
    parts: usize,
    alone: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    use candle_wick::storage::{set_cache, RemoteCache};
    let (server, urls, shard_bytes) = serve(dir, true)?;
    let cache = std::env::temp_dir().join(format!("wick-scale-blocks-{}", std::process::id()));
    if !alone {
        set_cache(&RemoteCache::memory(0).disk(&cache, 1 << 40))?;
    }
    let wds: std::sync::Arc<dyn candle_wick::Source> =
        std::sync::Arc::new(WebDataset::open(&urls)?);
    let (r0, b0) = counts(&server);
    let t = Instant::now();
    let samples = std::thread::scope(|s| {
        let runs: Vec<_> = (0..ranks)
            .map(|rank| {
                let wds = wds.clone();
                s.spawn(move || -> candle_wick::Result<usize> {
                    let mut loader = Loader::builder(wds)
                        .map(bytes_map())
                        .batch_size(32)
                        .shuffle(1234)
                        .workers(1)
                        .ram_budget(256 << 20)
                        .shard(rank, ranks)
                        .shard_blocks(candle_wick::ShardBlocks::new().partitions(parts))
                        .build()?;
                    let mut n = 0;
                    for batch in loader.epoch(0) {
                        n += batch?.indices.len();
                    }
                    Ok(n)
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a rank's thread"))
            .sum::<candle_wick::Result<usize>>()
    })?;
    let took = t.elapsed().as_secs_f64();
    let (r1, b1) = counts(&server);
    println!(
        "{} shards ({:.1} MB), {ranks} ranks of a node in {parts} part(s), {}: {samples} samples, \
         {} requests, {} bytes ({:.2}x the shards), {took:.2} s",
        urls.len(),
        shard_bytes as f64 / 1e6,
        if alone {
            "chunks in memory"
        } else {
            "one cache directory"
        },
        r1 - r0,
        b1 - b0,
        (b1 - b0) as f64 / shard_bytes as f64
    );
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

/// Samples `keys` written with `w`, which is then finished: each a
/// labelled 2 KB image of noise (as incompressible as a JPEG's bytes).
fn fill(
    mut w: impl candle_wick::write::ShardWriter,
    keys: std::ops::Range<usize>,
) -> candle_wick::Result<()> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ keys.start as u64;
    let mut image = vec![0u8; 2048];
    for key in keys {
        for b in image.iter_mut() {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = (state >> 24) as u8;
        }
        w.write(candle_wick::write::ShardSample {
            key: &format!("{key:09}"),
            ext: "jpg",
            bytes: &image,
            label: (key % 1000) as u32,
        })?;
    }
    w.finish()
}

/// The `tfrecord` and `parquet` modes (see the module's documentation).
fn formats(
    format: &str,
    dir: &Path,
    shards: usize,
    records: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use candle_wick::write::{ParquetWriter, TfRecordWriter};
    let parquet = format == "parquet";
    let (data, index) = (dir.join("shards"), dir.join("index"));
    let ext = if parquet { "parquet" } else { "tfrecord" };
    let name = |k: usize| format!("s-{k:06}.{ext}");
    if !index.join("manifest.json").exists() {
        std::fs::create_dir_all(&data)?;
        std::fs::create_dir_all(&index)?;
        for k in 0..shards {
            let path = data.join(name(k));
            let first = k * records;
            match parquet {
                // Row groups of a tenth of the file.
                true => fill(
                    ParquetWriter::create(&path, records.div_ceil(10), None)?,
                    first..first + records,
                )?,
                false => fill(TfRecordWriter::create(&path)?, first..first + records)?,
            }
        }
        let server = ObjectServer::start();
        server.put_dir("/ds", &data);
        let pattern = server.url(&format!("/ds/s-{{000000..{:06}}}.{ext}", shards - 1));
        candle_wick::write::index(Path::new(&pattern), &WebDatasetOptions::default())?;
        for k in (0..shards).filter(|_| !parquet) {
            let idx = format!("{}.idx", name(k));
            let bytes = server.get(&format!("/ds/{idx}")).ok_or("no .idx written")?;
            std::fs::write(index.join(idx), bytes)?;
        }
        let manifest = server.get("/ds/wick-manifest.json").ok_or("no manifest")?;
        std::fs::write(index.join("manifest.json"), manifest)?;
    }
    let shard_bytes: u64 = (0..shards)
        .map(|k| std::fs::metadata(data.join(name(k))).map_or(0, |m| m.len()))
        .sum();
    println!(
        "{shards} {format} files of {records} records ({:.1} MB)",
        shard_bytes as f64 / 1e6
    );
    println!("| open | requests | bytes (% of the files) | time | a record's read |");
    println!("|---|---:|---:|---:|---|");
    let ways: &[&str] = match parquet {
        true => &["footers", "manifest", NODE],
        false => &["read through", ".idx files", "manifest", NODE],
    };
    for &how in ways {
        if how == NODE {
            node_open(parquet, &data, &index, shards, records)?;
            continue;
        }
        let server = ObjectServer::start();
        server.put_dir("/ds", &data);
        for k in (0..shards).filter(|_| !parquet && how != "read through") {
            let idx = format!("{}.idx", name(k));
            server.put(&format!("/ds/{idx}"), std::fs::read(index.join(&idx))?);
        }
        if how == "manifest" {
            let m = std::fs::read(index.join("manifest.json"))?;
            server.put("/ds/wick-manifest.json", m);
        }
        let urls: Vec<PathBuf> = (0..shards)
            .map(|k| PathBuf::from(server.url(&format!("/ds/{}", name(k)))))
            .collect();
        let t = Instant::now();
        let source = open_files(parquet, &urls)?;
        let took = t.elapsed();
        let (requests, bytes) = counts(&server);
        if source.len() != shards * records {
            return Err(format!("{how}: {} records", source.len()).into());
        }
        source.read(shards / 2 * records + records / 2)?;
        let mut read: Vec<String> = Vec::new();
        for l in &server.log()[requests..] {
            let l = l.split(" auth").next().unwrap_or(l).replace("/ds/", "");
            match read.last_mut() {
                Some(last) if last.ends_with(&l) || last.contains(&format!("{l} x")) => {
                    let n = last
                        .rsplit(" x")
                        .next()
                        .and_then(|n| n.parse::<usize>().ok());
                    *last = format!("{l} x{}", n.unwrap_or(1) + 1);
                }
                _ => read.push(l),
            }
        }
        println!(
            "| {how} | {requests} | {bytes} ({:.3}%) | {:.3} s | {} |",
            100.0 * bytes as f64 / shard_bytes as f64,
            took.as_secs_f64(),
            read.join(", ")
        );
    }
    Ok(())
}

/// The TFRecord shards or Parquet files `urls`, opened (Parquet: a
/// window of one row group, so a read reads ahead one group).
fn open_files(
    parquet: bool,
    urls: &[PathBuf],
) -> candle_wick::Result<Box<dyn candle_wick::Source>> {
    Ok(match parquet {
        true => {
            let opts = candle_wick::source::ParquetOptions {
                shuffle_window: 1,
                label_column: None,
                ..Default::default()
            };
            Box::new(candle_wick::source::Parquet::open_with(urls, opts)?)
        }
        false => Box::new(candle_wick::source::TfRecord::open(urls)?),
    })
}

/// The way of opening that stands for the ranks of one node.
const NODE: &str = "manifest, 8 ranks of a node";

/// Opens the `formats` files with their manifest as 8 ranks of one node
/// would, one after another, with one cache directory, each reading the
/// middle record: prints the node's requests and body bytes, and each
/// rank's requests and bytes at open and at its read (a shard read at
/// random is also downloaded whole into the directory in the background,
/// counted in its read's, so later ranks may read the record from
/// there). The time is the ranks' opens and reads, not the waits for
/// those downloads.
fn node_open(
    parquet: bool,
    data: &Path,
    index: &Path,
    shards: usize,
    records: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use candle_wick::storage::{set_cache, RemoteCache};
    let ext = if parquet { "parquet" } else { "tfrecord" };
    let name = |k: usize| format!("s-{k:06}.{ext}");
    let server = ObjectServer::start();
    server.put_dir("/ds", data);
    for k in (0..shards).filter(|_| !parquet) {
        let idx = format!("{}.idx", name(k));
        server.put(&format!("/ds/{idx}"), std::fs::read(index.join(&idx))?);
    }
    server.put(
        "/ds/wick-manifest.json",
        std::fs::read(index.join("manifest.json"))?,
    );
    let urls: Vec<PathBuf> = (0..shards)
        .map(|k| PathBuf::from(server.url(&format!("/ds/{}", name(k)))))
        .collect();
    let cache = std::env::temp_dir().join(format!("wick-scale-node-open-{}", std::process::id()));
    set_cache(&RemoteCache::memory(0).disk(&cache, 1 << 40))?;
    let mut took = std::time::Duration::ZERO;
    let mut per_rank = Vec::new();
    for _ in 0..8 {
        let t = Instant::now();
        let (r0, b0) = counts(&server);
        let source = open_files(parquet, &urls)?;
        let (r1, b1) = counts(&server);
        source.read(shards / 2 * records + records / 2)?;
        took += t.elapsed();
        // The cache's background download of the shard read finishes
        // before the next rank starts, so that its bytes count here.
        let mut settled = counts(&server);
        loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let now = counts(&server);
            if now == settled {
                break;
            }
            settled = now;
        }
        let (r2, b2) = settled;
        per_rank.push(format!("{}/{}+{}/{}", r1 - r0, b1 - b0, r2 - r1, b2 - b1));
    }
    set_cache(&RemoteCache::default())?;
    let _ = std::fs::remove_dir_all(&cache);
    let (requests, bytes) = counts(&server);
    println!(
        "| {NODE} | {requests} | {bytes} | {:.3} s | each rank's open, then read \
         (requests/bytes): {} |",
        took.as_secs_f64(),
        per_rank.join(", ")
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> Option<usize> { args.get(i)?.replace('_', "").parse().ok() };
    let usage = "usage: scale-open make DIR SHARDS SAMPLES | scale-open DIR RANK WORLD manifest|scan [stream] | scale-open node DIR RANKS [alone] | scale-open epoch DIR RANK WORLD random|blocks | scale-open node-epoch DIR RANKS PARTS [alone] | scale-open tfrecord|parquet DIR FILES RECORDS";
    if let Some(format @ ("tfrecord" | "parquet")) = args.first().map(String::as_str) {
        let (Some(dir), Some(shards), Some(records)) = (args.get(1), num(2), num(3)) else {
            return Err(usage.into());
        };
        return formats(format, Path::new(dir), shards, records);
    }
    if args.first().map(String::as_str) == Some("node-epoch") {
        let (Some(dir), Some(ranks), Some(parts)) = (args.get(1), num(2), num(3)) else {
            return Err(usage.into());
        };
        let alone = args.get(4).map(String::as_str) == Some("alone");
        return node_epoch(Path::new(dir), ranks, parts, alone);
    }
    if args.first().map(String::as_str) == Some("epoch") {
        let (Some(dir), Some(rank), Some(world), Some(how)) =
            (args.get(1), num(2), num(3), args.get(4))
        else {
            return Err(usage.into());
        };
        let blocks = match how.as_str() {
            "blocks" => true,
            "random" => false,
            _ => return Err(usage.into()),
        };
        return epoch(Path::new(dir), rank, world, blocks);
    }
    if args.first().map(String::as_str) == Some("node") {
        let (Some(dir), Some(ranks)) = (args.get(1), num(2)) else {
            return Err(usage.into());
        };
        let alone = args.get(3).map(String::as_str) == Some("alone");
        return node(Path::new(dir), ranks, alone);
    }
    if args.first().map(String::as_str) == Some("make") {
        let (Some(dir), Some(shards), Some(samples)) = (args.get(1), num(2), num(3)) else {
            return Err(usage.into());
        };
        return make(Path::new(dir), shards, samples);
    }
    let (Some(dir), Some(rank), Some(world), Some(mode)) =
        (args.first(), num(1), num(2), args.get(3))
    else {
        return Err(usage.into());
    };
    let manifest = match mode.as_str() {
        "manifest" => true,
        "scan" => false,
        _ => return Err(usage.into()),
    };
    let stream = args.get(4).map(String::as_str) == Some("stream");
    run(Path::new(dir), rank, world, manifest, stream)
}
