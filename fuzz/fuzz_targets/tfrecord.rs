//! TFRecord framing + tf.train.Example parsing, plain and GZIP.
#![no_main]
use candle_wick::source::TfRecord;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let (first, rest) = data.split_first().unwrap_or((&0, &[]));
    let p = common::path(if first & 1 == 0 { "tfrecord" } else { "tfrecord.gz" });
    std::fs::write(&p, rest).unwrap();
    if let Ok(src) = TfRecord::open([&p]) {
        common::exercise(&src);
    }
});
