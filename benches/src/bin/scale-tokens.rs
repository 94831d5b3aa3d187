//! What a token file in object storage costs a rank before its first
//! window, read by range or whole.
//!
//! `scale-tokens MB [whole] [shared]` serves a raw u16 token file of `MB`
//! MiB from a loopback HTTP server that counts requests and body bytes,
//! opens it by URL as a `TokenFile` (with a cache directory when
//! `shared`), and reads one 2,048-token window from its middle, as a
//! rank's first random window would. With `shared` a second open (another
//! rank of the node) then reads another window near it. `whole` sets the
//! chunk size past the file, so it is downloaded whole at open, as every
//! token file was before ranged chunks. Prints, for each open and first
//! window, the GETs, the bytes sent and the seconds, and the process's
//! peak RSS (`VmHWM`; the server holds the file in memory, counted too).
//!
//! `scale-tokens megatron DOCS` writes a local Megatron prefix of `DOCS`
//! documents of 4 `u16` tokens (one sequence each), opens it with packed
//! windows and with windows inside documents, reads a window of each,
//! and prints the `.idx`'s size, the private memory (`RssAnon`) each
//! open added (what a rank holds per document, apart from the page
//! cache's shared pages of the mapped files) and the time of a window
//! read at a million scattered positions.

use benches::{anon_rss_mb, peak_rss_mb};
use candle_wick::source::{DocumentWindows, Megatron, Source, TokenFile};
use candle_wick::storage::{__set_chunk_bytes, set_cache, RemoteCache};
use std::time::Instant;
use tests::ObjectServer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("megatron") {
        let docs = args.get(1).and_then(|a| a.parse().ok());
        return megatron(docs.ok_or("usage: scale-tokens megatron DOCS")?);
    }
    let mb: u64 = args
        .first()
        .and_then(|a| a.parse().ok())
        .ok_or("usage: scale-tokens MB [whole] [shared]")?;
    let whole = args.iter().any(|a| a == "whole");
    let shared = args.iter().any(|a| a == "shared");
    if whole {
        __set_chunk_bytes(u64::MAX / 4);
    }
    let dir = std::env::temp_dir().join(format!("wick-scale-tokens-{}", std::process::id()));
    if shared {
        set_cache(&RemoteCache::memory(0).disk(&dir, 1 << 40))?;
    }
    let server = ObjectServer::start();
    let tokens = (mb << 20) / 2;
    let bytes: Vec<u8> = (0..tokens)
        .flat_map(|i| ((i * 7 % 65_521) as u16).to_le_bytes())
        .collect();
    server.put("/corpus/tokens.bin", bytes);
    let url = server.url("/corpus/tokens.bin");
    let readers = if shared { 2 } else { 1 };
    for reader in 0..readers {
        let (log, sent, t) = (server.log().len(), server.bytes_sent(), Instant::now());
        let f = TokenFile::open(&url)?;
        let mut out = vec![0u32; 2048];
        let first = tokens as usize / 2 + reader * 4096;
        f.read_into(first, &mut out)?;
        let want = |i: usize| ((i as u64 * 7 % 65_521) as u16) as u32;
        if out.iter().enumerate().any(|(k, &v)| v != want(first + k)) {
            return Err(format!("reader {reader}: the window's tokens differ").into());
        }
        let gets = server.log()[log..]
            .iter()
            .filter(|l| l.starts_with("GET "))
            .count();
        println!(
            "reader {reader}: open + first window: {gets} GETs, {} bytes, {:.3} s",
            server.bytes_sent() - sent,
            t.elapsed().as_secs_f64()
        );
    }
    println!("peak_rss_mb {:.1}", peak_rss_mb());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The `megatron DOCS` mode (see the module's documentation).
fn megatron(docs: u64) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("wick-scale-megatron-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let prefix = dir.join("corpus");
    let mut bin = std::io::BufWriter::new(std::fs::File::create(prefix.with_extension("bin"))?);
    for d in 0..docs {
        for t in 0..4u64 {
            bin.write_all(&(((d + t) % 65_521) as u16).to_le_bytes())?;
        }
    }
    bin.flush()?;
    let mut idx = std::io::BufWriter::new(std::fs::File::create(prefix.with_extension("idx"))?);
    idx.write_all(b"MMIDIDX\0\0")?;
    idx.write_all(&1u64.to_le_bytes())?;
    idx.write_all(&[8])?;
    idx.write_all(&docs.to_le_bytes())?;
    idx.write_all(&(docs + 1).to_le_bytes())?;
    for _ in 0..docs {
        idx.write_all(&4i32.to_le_bytes())?;
    }
    for d in 0..docs {
        idx.write_all(&((d * 8) as i64).to_le_bytes())?;
    }
    for d in 0..=docs {
        idx.write_all(&(d as i64).to_le_bytes())?;
    }
    idx.flush()?;
    drop(idx);
    let idx_bytes = std::fs::metadata(prefix.with_extension("idx"))?.len();
    println!("{docs} documents, .idx {idx_bytes} bytes");
    let kinds = [
        ("packed", DocumentWindows::Packed { eos: None }),
        (
            "within documents",
            DocumentWindows::WithinDocument { pad: 0 },
        ),
    ];
    for (name, windows) in kinds {
        let (before, t) = (anon_rss_mb(), Instant::now());
        let corpus = Megatron::open([&prefix], 3, windows)?;
        let mut out = [0u32; 4];
        corpus.read_window(corpus.len() - 1, &mut out)?;
        let added = anon_rss_mb() - before;
        let opened = t.elapsed().as_secs_f64();
        // A million windows at scattered positions (a multiplicative
        // stride), as a shuffled epoch reads them.
        let (reads, n, t) = (1_000_000u64, corpus.len() as u64, Instant::now());
        for i in 0..reads {
            corpus.read_window((i * 2_654_435_761 % n) as usize, &mut out)?;
        }
        println!(
            "{name}: open + last window {opened:.3} s, private memory added {added:.1} MB ({:.2} B a document), {:.0} ns a scattered window",
            added * 1048576.0 / docs as f64,
            t.elapsed().as_secs_f64() * 1e9 / reads as f64
        );
        drop(corpus);
    }
    println!("peak_rss_mb {:.1}", peak_rss_mb());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
