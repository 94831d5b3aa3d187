//! `RANK` without `WORLD_SIZE` (or the reverse) is an error, not a silent
//! single shard on which every rank would train on the same batches. Its
//! own test binary: it sets the process environment.

use candle_wick::source::{MemorySource, Record};
use candle_wick::Loader;

fn source() -> MemorySource {
    MemorySource::new(
        (0..8)
            .map(|i| Record::encoded(format!("#{i}"), vec![0u8; 4], 0))
            .collect(),
    )
}

fn build_error() -> String {
    match Loader::builder(source()).batch_size(2).build() {
        Ok(_) => panic!("built a loader from a half-set environment"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn one_of_rank_and_world_size_alone_is_an_error() {
    std::env::set_var("RANK", "1");
    let err = build_error();
    assert!(err.contains("RANK") && err.contains("WORLD_SIZE"), "{err}");
    std::env::remove_var("RANK");
    std::env::set_var("WORLD_SIZE", "2");
    let err = build_error();
    assert!(err.contains("RANK") && err.contains("WORLD_SIZE"), "{err}");
    // Both: rank 1 of 2 gets its half; shard() overrides the environment.
    std::env::set_var("RANK", "1");
    let loader = Loader::builder(source()).batch_size(2).build().unwrap();
    assert_eq!(loader.len(), 2);
    std::env::set_var("RANK", "x");
    assert!(Loader::builder(source())
        .batch_size(2)
        .shard(0, 1)
        .build()
        .is_ok());
    std::env::remove_var("RANK");
    std::env::remove_var("WORLD_SIZE");
    assert_eq!(
        Loader::builder(source())
            .batch_size(2)
            .build()
            .unwrap()
            .len(),
        4
    );
}
