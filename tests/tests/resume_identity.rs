//! What a resume state is checked against, beyond the basic settings: the
//! shuffle seed apart from the augmentation seed, a token source's files,
//! their order and the window order, an image folder's or memory source's
//! names, `max_pixels` and the bad-sample policy. A state is the same on
//! every rank, so one saved by rank 0 resumes every rank; and
//! `loader.epoch(e)` after a resume does not restart the saved epoch.

use candle_wick::map::TokenWindowsMap;
use candle_wick::source::{ImageFolder, MemorySource, Record, TokenFile, TokenSource, WindowOrder};
use candle_wick::{BadSamples, Error, Loader, LoaderBuilder, LoaderState};
use std::path::Path;

/// The state after the first batch of `builder`'s first epoch.
fn after_one(builder: LoaderBuilder) -> LoaderState {
    let mut l = builder.build().unwrap();
    let mut e = l.next_epoch();
    e.next().unwrap().unwrap().state()
}

/// The differences `builder` refuses `state` with.
fn refused(builder: LoaderBuilder, state: &LoaderState) -> String {
    match builder.resume(state.clone()).build() {
        Err(Error::StateMismatch { differences }) => differences.join("; "),
        Err(e) => panic!("refused with another error: {e}"),
        Ok(_) => panic!("a mismatched state was accepted"),
    }
}

fn records(keys: &[&str]) -> Vec<Record> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| Record::encoded(*k, vec![i as u8], i as u32))
        .collect()
}

fn memory(keys: &[&str]) -> LoaderBuilder {
    Loader::builder(MemorySource::new(records(keys)))
        .map(tests::label_map())
        .batch_size(2)
        .shuffle(1)
        .workers(1)
        .shard(0, 1)
}

#[test]
fn the_shuffle_seed_is_checked_and_fingerprinted_apart_from_the_augmentation_seed() {
    let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let state = after_one(memory(&keys).shuffle(7).seed(5));
    let msg = refused(memory(&keys).shuffle(8).seed(5), &state);
    assert_eq!(
        msg,
        "shuffle: the state has shuffle(7), this loader shuffle(8)"
    );
    let fp = |shuffle, seed, rank| {
        memory(&keys)
            .shuffle(shuffle)
            .seed(seed)
            .shard(rank, 2)
            .build()
            .unwrap()
            .fingerprint()
    };
    // Ranks with other shuffle seeds read overlapping shares: they differ.
    assert_ne!(fp(1, 5, 0), fp(2, 5, 1));
    // Ranks with other augmentation seeds are a valid job: they agree.
    assert_eq!(fp(1, 5, 0), fp(1, 6, 1));
}

#[test]
fn a_sources_names_and_order_are_checked_not_only_its_length() {
    let state = after_one(memory(&["a", "b", "c", "d"]));
    let msg = refused(memory(&["a", "b", "d", "c"]), &state);
    assert!(msg.starts_with("source checksum"), "{msg}");

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("folder");
    tests::image_folder(&root, 2, 3);
    let build = |root: &Path| {
        Loader::builder(ImageFolder::new(root).unwrap())
            .batch_size(2)
            .image_size(8)
            .shuffle(3)
            .workers(1)
            .shard(0, 1)
    };
    let state = after_one(build(&root));
    // The same folder moved elsewhere resumes.
    let moved = dir.path().join("moved");
    std::fs::rename(&root, &moved).unwrap();
    build(&moved).resume(state.clone()).build().unwrap();
    // One file renamed (same count, same classes): refused.
    let class = std::fs::read_dir(&moved)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let file = std::fs::read_dir(&class)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::rename(&file, class.join("zz-renamed.png")).unwrap();
    let msg = refused(build(&moved), &state);
    assert!(msg.starts_with("source checksum"), "{msg}");
}

fn token_file(dir: &Path, name: &str, n: u32) -> TokenFile {
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..n).flat_map(|i| (i as u16 + 1).to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    TokenFile::open(path).unwrap()
}

#[test]
fn token_files_order_lengths_and_window_order_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let build = |names: [&str; 2], order| {
        let files = names.iter().map(|n| token_file(d, n, 1000)).collect();
        let src = TokenSource::new(files, 32, order).unwrap();
        Loader::builder(src.clone())
            .map(TokenWindowsMap::new(&src))
            .batch_size(4)
            .shuffle(2)
            .workers(1)
            .shard(0, 1)
    };
    let state = after_one(build(["a.bin", "b.bin"], WindowOrder::NonOverlapping));
    // Same length, files swapped (a directory listed in another order).
    let msg = refused(
        build(["b.bin", "a.bin"], WindowOrder::NonOverlapping),
        &state,
    );
    assert!(msg.starts_with("source checksum"), "{msg}");
    // Same length, the other window order.
    let msg = refused(build(["a.bin", "b.bin"], WindowOrder::Random), &state);
    assert!(msg.starts_with("source checksum"), "{msg}");
    // A file that grew by fewer tokens than a window: same length.
    let files = vec![token_file(d, "a.bin", 1000), token_file(d, "b.bin", 1010)];
    let src = TokenSource::new(files, 32, WindowOrder::NonOverlapping).unwrap();
    let grown = Loader::builder(src.clone())
        .map(TokenWindowsMap::new(&src))
        .batch_size(4)
        .shuffle(2)
        .workers(1)
        .shard(0, 1);
    let msg = refused(grown, &state);
    assert!(msg.starts_with("source checksum"), "{msg}");
}

#[test]
fn max_pixels_and_the_bad_sample_policy_are_checked() {
    let keys = ["a", "b", "c", "d"];
    let state = after_one(memory(&keys));
    let msg = refused(memory(&keys).max_pixels(1000), &state);
    assert!(msg.starts_with("max_pixels: the state has"), "{msg}");
    let msg = refused(memory(&keys).bad_samples(BadSamples::Skip), &state);
    assert_eq!(
        msg,
        "bad-sample policy: the state has Fail, this loader Skip"
    );
}

/// Every batch `l` yields from its position to the end of its epoch,
/// as (batch index, source indices).
fn rest(l: &mut Loader) -> Vec<(usize, Vec<usize>)> {
    l.next_epoch()
        .map(|b| {
            let b = b.unwrap();
            (b.index, b.indices.clone())
        })
        .collect()
}

#[test]
fn a_state_saved_by_rank_0_resumes_every_rank() {
    let keys: Vec<String> = (0..22).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let rank = |r| memory(&keys).shard(r, 2);
    // Rank 0 stops after 2 batches of epoch 0 and saves.
    let mut r0 = rank(0).build().unwrap();
    let state = {
        let mut e = r0.next_epoch();
        e.next().unwrap().unwrap();
        e.next().unwrap().unwrap().state()
    };
    assert_eq!((state.epoch, state.batch), (0, 2));
    // Rank 1 resumes from it: what an uninterrupted rank 1 yields from
    // batch 2 on.
    let mut resumed = rank(1).resume(state.clone()).build().unwrap();
    let mut full = rank(1).build().unwrap();
    let reference: Vec<_> = rest(&mut full).into_iter().skip(2).collect();
    assert_eq!(rest(&mut resumed), reference);
    // And the states agree on both ranks.
    let mut r1 = rank(1).build().unwrap();
    let s1 = {
        let mut e = r1.next_epoch();
        e.next().unwrap().unwrap();
        e.next().unwrap().unwrap().state()
    };
    assert_eq!(s1, state);
}

#[test]
fn epoch_e_after_a_resume_continues_the_saved_epoch() {
    let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut first = memory(&keys).build().unwrap();
    let state = {
        let mut e = first.epoch(0);
        e.next().unwrap().unwrap();
        e.next().unwrap().unwrap().state()
    };
    assert_eq!((state.epoch, state.batch), (0, 2));
    let mut l = memory(&keys).resume(state).build().unwrap();
    // `for e in 0..n { loader.epoch(e) }`: epoch 0 resumes at batch 2.
    let got: Vec<usize> = l.epoch(0).map(|b| b.unwrap().index).collect();
    assert_eq!(got, [2, 3]);
    // Then epochs start from their first batch, also epoch 0 again.
    assert_eq!(l.epoch(0).count(), 4);
}
