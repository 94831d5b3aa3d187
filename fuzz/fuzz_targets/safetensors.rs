//! safetensors shard headers, both layouts.
#![no_main]
use candle_wick::source::SafetensorsShards;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let p = common::path("safetensors");
    std::fs::write(&p, data).unwrap();
    if let Ok(src) = SafetensorsShards::open([&p]) {
        common::exercise(&src);
    }
});
