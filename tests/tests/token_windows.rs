//! Language-model token windows through the loader: every window is its
//! file's slice at its offset, targets are inputs shifted by one, a
//! non-overlapping epoch uses every token as an input once, ranks get
//! disjoint equal shares, random windows are reproducible, and a bad token
//! file is an error naming it.

use candle_wick::map::TokenWindowsMap;
use candle_wick::source::{TokenFile, TokenSource, WindowOrder};
use candle_wick::{Loader, Result, Source};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

const SEQ: usize = 16;

fn tokens(n: usize, salt: u16) -> Vec<u16> {
    (0..n)
        .map(|i| (i as u16).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// A raw `u16` file and an llm.c shard.
fn files(dir: &Path) -> Vec<PathBuf> {
    let raw = dir.join("train.bin");
    let t = tokens(1000, 7);
    std::fs::write(
        &raw,
        t.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>(),
    )
    .unwrap();
    let llmc = dir.join("shard_000.bin");
    let t = tokens(555, 9000);
    let mut header = [0i32; 256];
    header[..3].copy_from_slice(&[20240520, 1, t.len() as i32]);
    let mut bytes: Vec<u8> = header.iter().flat_map(|h| h.to_le_bytes()).collect();
    bytes.extend(t.iter().flat_map(|t| t.to_le_bytes()));
    std::fs::write(&llmc, bytes).unwrap();
    vec![raw, llmc]
}

fn source(dir: &Path, order: WindowOrder) -> TokenSource {
    let files = files(dir)
        .iter()
        .map(TokenFile::open)
        .collect::<Result<_>>()
        .unwrap();
    TokenSource::new(files, SEQ, order).unwrap()
}

/// `(source index, input, target)` of every sample of rank `rank`'s epoch.
fn run(
    src: &TokenSource,
    rank: usize,
    world: usize,
    epoch: u64,
) -> Vec<(usize, Vec<u32>, Vec<u32>)> {
    let mut loader = Loader::builder(src.clone())
        .map(TokenWindowsMap::new(src))
        .batch_size(8)
        .shuffle(5)
        .shard(rank, world)
        .drop_last(true)
        .build()
        .unwrap();
    let mut out = Vec::new();
    for b in loader.epoch(epoch) {
        let b = b.unwrap();
        assert_eq!(b.get("input").unwrap().dims(), [8, SEQ]);
        assert_eq!(b.get("target").unwrap().dims(), [8, SEQ]);
        // One window of SEQ + 1 tokens a row; input and target are its
        // views.
        let t = b.get("tokens").unwrap().to_vec2::<u32>().unwrap();
        let x = b.get("input").unwrap().to_vec2::<u32>().unwrap();
        let y = b.get("target").unwrap().to_vec2::<u32>().unwrap();
        for ((t, x), y) in t.iter().zip(&x).zip(&y) {
            assert_eq!((&t[..SEQ], &t[1..]), (&x[..], &y[..]));
        }
        let names: Vec<&str> = b.fields().map(|(n, _)| n).collect();
        assert_eq!(names, ["tokens", "input", "target"]);
        for ((&i, x), y) in b.indices.iter().zip(x).zip(y) {
            out.push((i, x, y));
        }
    }
    out
}

fn check_slices(src: &TokenSource, seed: u64, epoch: u64, got: &[(usize, Vec<u32>, Vec<u32>)]) {
    for (i, x, y) in got {
        let w = src.window(seed, epoch, *i).unwrap();
        let mut want = vec![0u32; SEQ + 1];
        src.files()[w.file].read_into(w.token, &mut want).unwrap();
        assert_eq!(x, &want[..SEQ], "window {i} input");
        assert_eq!(y, &want[1..], "window {i} target");
    }
}

#[test]
fn a_non_overlapping_epoch_uses_every_token_once_and_ranks_split_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), WindowOrder::NonOverlapping);
    let all = run(&src, 0, 1, 0);
    check_slices(&src, 5, 0, &all);
    // 999 / 16 = 62 windows and 554 / 16 = 34: 96, all in 12 full batches.
    assert_eq!(src.len(), 96);
    assert_eq!(all.len(), 96);
    let mut used: Vec<Vec<u8>> = src.files().iter().map(|f| vec![0; f.len()]).collect();
    for (i, _, _) in &all {
        let w = src.window(5, 0, *i).unwrap();
        for c in &mut used[w.file][w.token..w.token + SEQ] {
            *c += 1;
        }
    }
    for (f, u) in used.iter().enumerate() {
        let whole = (u.len() - 1) / SEQ * SEQ;
        assert!(
            u[..whole].iter().all(|&c| c == 1),
            "file {f}: each token once"
        );
        assert!(
            u[whole..].iter().all(|&c| c == 0),
            "file {f}: the tail unused"
        );
    }
    // The order is shuffled, and differs by epoch.
    let order: Vec<usize> = all.iter().map(|s| s.0).collect();
    assert_ne!(order, (0..96).collect::<Vec<_>>());
    let next: Vec<usize> = run(&src, 0, 1, 1).iter().map(|s| s.0).collect();
    assert_ne!(order, next);
    // Three ranks: equal, disjoint shares.
    let shares: Vec<HashSet<usize>> = (0..3)
        .map(|r| run(&src, r, 3, 0).iter().map(|s| s.0).collect())
        .collect();
    assert!(shares
        .iter()
        .all(|s| s.len() == shares[0].len() && s.len() >= 24));
    for a in 0..3 {
        for b in a + 1..3 {
            assert!(shares[a].is_disjoint(&shares[b]), "ranks {a} and {b}");
        }
    }
}

#[test]
fn random_windows_are_slices_from_the_seed_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), WindowOrder::Random);
    let a = run(&src, 0, 1, 4);
    check_slices(&src, 5, 4, &a);
    assert_eq!(a, run(&src, 0, 1, 4), "the same epoch again");
    let starts: HashSet<(usize, usize)> = a
        .iter()
        .map(|(i, _, _)| {
            let w = src.window(5, 4, *i).unwrap();
            (w.file, w.token)
        })
        .collect();
    assert!(
        starts.iter().any(|&(_, t)| t % SEQ != 0),
        "offsets are not the fixed grid"
    );
    assert_ne!(a, run(&src, 0, 1, 5), "another epoch, other windows");
}

#[test]
fn a_bad_token_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad_000.bin");
    let mut header = [0i32; 256];
    header[..3].copy_from_slice(&[20240520, 1, 1000]);
    let mut bytes: Vec<u8> = header.iter().flat_map(|h| h.to_le_bytes()).collect();
    bytes.extend([0u8; 100]); // 50 tokens, not the 1000 claimed
    std::fs::write(&path, bytes).unwrap();
    let e = TokenFile::open(&path).unwrap_err().to_string();
    assert!(e.contains("bad_000.bin"), "{e}");
}
