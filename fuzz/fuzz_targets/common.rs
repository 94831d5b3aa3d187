//! Shared by the fuzz targets: the sources open files, so each input is
//! written to a per-process file (in /dev/shm where there is one) and
//! opened, read record by record and streamed. Any `Result` is fine; a
//! panic, hang or huge allocation is the bug libFuzzer looks for.

use candle_wick::Source;
use std::path::PathBuf;

pub fn path(ext: &str) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("wick-fuzz-{}.{ext}", std::process::id()))
}

/// Reads, reads with every part, and streams each shard of `src`. (The
/// token target writes files only: it has no use for this.)
#[allow(dead_code)]
pub fn exercise(src: &dyn Source) {
    for i in 0..src.len().min(64) {
        let _ = src.read(i);
        // Every named part (tf.train.Example features, tar members).
        let _ = src.read_parts(i, &candle_wick::source::Parts::All, Vec::new());
    }
    for s in 0..src.shards().len() {
        if let Ok(Some(stream)) = src.stream_shard(s, &candle_wick::source::Parts::All) {
            stream.take(64).for_each(drop);
        }
    }
}
