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

use benches::peak_rss_mb;
use candle_wick::source::TokenFile;
use candle_wick::storage::{__set_chunk_bytes, set_cache, RemoteCache};
use std::time::Instant;
use tests::ObjectServer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
