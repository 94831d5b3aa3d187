//! WebDataset tar indexing and member reads.
#![no_main]
use candle_wick::source::WebDataset;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let p = common::path("tar");
    std::fs::write(&p, data).unwrap();
    if let Ok(src) = WebDataset::open([&p]) {
        common::exercise(&src);
    }
});
