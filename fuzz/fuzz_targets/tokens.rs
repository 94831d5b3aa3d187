//! Token files (raw u16 and llm.c shards: header magic, version, count
//! checked against the size) on arbitrary bytes, then windows read in both
//! orders. The first byte picks a sequence length.
#![no_main]
use candle_wick::source::{TokenFile, TokenLayout, TokenSource, TokenType, WindowOrder};
use candle_wick::Source;
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&seq, bytes)) = data.split_first() else {
        return;
    };
    let path = common::path("bin");
    if std::fs::write(&path, bytes).is_err() {
        return;
    }
    let open = |layout: Option<TokenLayout>| match layout {
        None => TokenFile::open(&path),
        Some(l) => TokenFile::open_as(&path, l),
    };
    for layout in [None, Some(TokenLayout::LlmC), Some(TokenLayout::Raw(TokenType::U16))] {
        let Ok(file) = open(layout) else {
            continue;
        };
        let mut out = vec![0u32; 8];
        let _ = file.read_into(0, &mut out);
        let _ = file.read_into(file.len().saturating_sub(3), &mut out);
        for order in [WindowOrder::NonOverlapping, WindowOrder::Random] {
            let Ok(file) = open(layout) else {
                continue;
            };
            let Ok(src) = TokenSource::new(vec![file], usize::from(seq % 64) + 1, order) else {
                continue;
            };
            for i in 0..src.len().min(16) {
                let _ = src.read(i);
                if let Ok(w) = src.window(3, 1, i) {
                    let mut window = vec![0u32; src.seq_len() + 1];
                    let _ = src.files()[w.file].read_into(w.token, &mut window);
                }
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
