//! Megatron indexed datasets written by Megatron-Core's own
//! `IndexedDatasetBuilder` (tests/fixtures/megatron_writer.py) read
//! token-exact through the loader: windows packed across documents (with
//! and without an end token between them) and inside documents (padded,
//! with `tokens_len`), `u16` and `i32` corpora, several prefixes, a
//! resumed epoch, the same corpus from a URL, and a damaged index or data
//! file is an error naming it.

use candle_wick::map::TokenWindowsMap;
use candle_wick::source::{DocumentWindows, Megatron, TokenType};
use candle_wick::{Loader, Source};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const SEQ: usize = 12;

/// Documents of 1 to 3 sequences of 0 to 40 tokens, from `seed`, tokens
/// from `base` (over 65,535 for an `i32` corpus).
fn documents(count: usize, seed: u32, base: u32) -> Vec<Vec<Vec<u32>>> {
    let mut x = seed;
    let mut next = move || {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        x >> 8
    };
    (0..count)
        .map(|_| {
            (0..1 + next() % 3)
                .map(|_| (0..next() % 41).map(|_| base + next() % 1000).collect())
                .collect()
        })
        .collect()
}

/// Writes the corpus with Megatron-Core's builder; `None` when it is not
/// installed (and not required).
fn write(dir: &Path, name: &str, dtype: &str, docs: &[Vec<Vec<u32>>]) -> Option<PathBuf> {
    let json = dir.join(format!("{name}.json"));
    std::fs::write(&json, serde_json::to_string(docs).unwrap()).unwrap();
    let prefix = dir.join(name);
    tests::python_fixture(
        "megatron_writer.py",
        &[
            "write",
            prefix.to_str().unwrap(),
            dtype,
            json.to_str().unwrap(),
        ],
    )?;
    Some(prefix)
}

/// Each window's tokens by source index, from the loader: every index
/// exactly once, with `tokens_len` applied to padded windows.
fn epoch(m: &Megatron, seed: u64, epoch: u64) -> BTreeMap<usize, Vec<u32>> {
    let mut loader = Loader::builder(m.clone())
        .map(TokenWindowsMap::megatron(m))
        .batch_size(4)
        .shuffle(seed)
        .build()
        .unwrap();
    let mut out = BTreeMap::new();
    for b in loader.epoch(epoch) {
        let b = b.unwrap();
        let rows = b.get("tokens").unwrap().to_vec2::<u32>().unwrap();
        let lens = match b.get("tokens_len") {
            Ok(t) => t.to_vec1::<u32>().unwrap(),
            Err(_) => vec![SEQ as u32 + 1; rows.len()],
        };
        let x = b.get("input").unwrap().to_vec2::<u32>().unwrap();
        for (((&i, mut row), n), x) in b.indices.iter().zip(rows).zip(lens).zip(x) {
            assert_eq!(x, row[..SEQ]);
            row.truncate(n as usize);
            assert!(out.insert(i, row).is_none(), "window {i} twice");
        }
    }
    assert_eq!(out.len(), m.len());
    out
}

/// Windows of `SEQ + 1` tokens, `SEQ` apart, over `stream`.
fn cut(stream: &[u32]) -> Vec<Vec<u32>> {
    (0..(stream.len() - 1) / SEQ)
        .map(|k| stream[k * SEQ..k * SEQ + SEQ + 1].to_vec())
        .collect()
}

fn flat(doc: &[Vec<u32>]) -> Vec<u32> {
    doc.iter().flatten().copied().collect()
}

#[test]
fn packed_windows_are_the_documents_back_to_back() {
    let dir = tempfile::tempdir().unwrap();
    for (dtype, base, ty) in [
        ("uint16", 0, TokenType::U16),
        ("int32", 100_000, TokenType::I32),
    ] {
        let docs = documents(60, 7, base);
        let Some(prefix) = write(dir.path(), dtype, dtype, &docs) else {
            return;
        };
        let stream: Vec<u32> = docs.iter().flat_map(|d| flat(d)).collect();
        let m = Megatron::open([&prefix], SEQ, DocumentWindows::Packed { eos: None }).unwrap();
        assert_eq!(m.token_types(), [ty]);
        assert_eq!(m.documents(), docs.len());
        assert_eq!(m.tokens(), stream.len() as u64);
        let got: Vec<Vec<u32>> = epoch(&m, 3, 0).into_values().collect();
        assert_eq!(got, cut(&stream), "{dtype}");

        // With an end token after each document.
        let eos = 99_999_999;
        let stream: Vec<u32> = docs
            .iter()
            .flat_map(|d| flat(d).into_iter().chain([eos]))
            .collect();
        let m = Megatron::open([&prefix], SEQ, DocumentWindows::Packed { eos: Some(eos) }).unwrap();
        let got: Vec<Vec<u32>> = epoch(&m, 3, 1).into_values().collect();
        assert_eq!(got, cut(&stream), "{dtype} with eos");
    }
}

#[test]
fn windows_inside_documents_are_padded_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let docs = documents(50, 11, 5);
    let Some(prefix) = write(dir.path(), "c", "uint16", &docs) else {
        return;
    };
    let pad = 4242;
    let m = Megatron::open([&prefix], SEQ, DocumentWindows::WithinDocument { pad }).unwrap();
    let mut want = Vec::new();
    for doc in &docs {
        let t = flat(doc);
        let mut off = 0;
        while off + 1 < t.len() {
            want.push(t[off..(off + SEQ + 1).min(t.len())].to_vec());
            off += SEQ;
        }
    }
    assert!(
        want.iter().any(|w| w.len() < SEQ + 1),
        "some windows are short"
    );
    let got: Vec<Vec<u32>> = epoch(&m, 5, 0).into_values().collect();
    assert_eq!(got, want);

    // The padding is the pad token.
    let mut loader = Loader::builder(m.clone())
        .map(TokenWindowsMap::megatron(&m))
        .batch_size(m.len())
        .build()
        .unwrap();
    let b = loader.epoch(0).next().unwrap().unwrap();
    let rows = b.get("tokens").unwrap().to_vec2::<u32>().unwrap();
    let lens = b.get("tokens_len").unwrap().to_vec1::<u32>().unwrap();
    for (row, n) in rows.iter().zip(lens) {
        assert!(row[n as usize..].iter().all(|&t| t == pad));
    }
}

#[test]
fn prefixes_resume_and_urls_read_the_same_windows() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (documents(30, 1, 0), documents(20, 2, 2000));
    let Some(pa) = write(dir.path(), "a", "uint16", &a) else {
        return;
    };
    let pb = write(dir.path(), "b", "int32", &b).unwrap();
    let open =
        |ps: [&Path; 2]| Megatron::open(ps, SEQ, DocumentWindows::Packed { eos: Some(0) }).unwrap();
    let m = open([pa.as_path(), pb.as_path()]);
    let all = epoch(&m, 9, 2);
    // Prefix a's windows first, then b's; none crosses from a to b.
    let with_eos = |docs: &[Vec<Vec<u32>>]| -> Vec<u32> {
        docs.iter()
            .flat_map(|d| flat(d).into_iter().chain([0]))
            .collect()
    };
    let mut want = cut(&with_eos(&a));
    want.extend(cut(&with_eos(&b)));
    assert_eq!(all.values().cloned().collect::<Vec<_>>(), want);

    // A resumed epoch yields the rest of the uninterrupted one.
    let build = |m: &Megatron| {
        Loader::builder(m.clone())
            .map(TokenWindowsMap::megatron(m))
            .batch_size(4)
            .shuffle(9)
    };
    let mut full = build(&m).build().unwrap();
    let whole: Vec<Vec<usize>> = full.epoch(2).map(|b| b.unwrap().indices).collect();
    let mut first = build(&m).build().unwrap();
    let state = {
        let mut e = first.epoch(2);
        e.next().unwrap().unwrap();
        e.next().unwrap().unwrap().state()
    };
    let mut resumed = build(&m).resume(state).build().unwrap();
    let rest: Vec<Vec<usize>> = resumed.next_epoch().map(|b| b.unwrap().indices).collect();
    assert_eq!(rest, whole[2..]);
    // A state saved over another corpus is refused.
    let other = open([pb.as_path(), pa.as_path()]);
    let state = full.state();
    assert!(build(&other).resume(state).build().is_err());

    // The same prefixes as file:// URLs (fetched through the object store).
    let url = |p: &Path| PathBuf::from(format!("file://{}", p.canonicalize().unwrap().display()));
    let (ua, ub) = (
        url(&pa.with_extension("bin")),
        url(&pb.with_extension("bin")),
    );
    let remote = open([ua.as_path(), ub.as_path()]);
    assert_eq!(epoch(&remote, 9, 2), all);
}

#[test]
fn a_damaged_index_or_data_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let docs = documents(10, 3, 0);
    let Some(prefix) = write(dir.path(), "c", "uint16", &docs) else {
        return;
    };
    let idx = prefix.with_extension("idx");
    let bin = prefix.with_extension("bin");
    let good_idx = std::fs::read(&idx).unwrap();
    let good_bin = std::fs::read(&bin).unwrap();
    let open = || {
        let e = Megatron::open([&prefix], SEQ, DocumentWindows::Packed { eos: None }).unwrap_err();
        candle_wick::error_chain(&e)
    };
    let mut bad = good_idx.clone();
    bad[..7].copy_from_slice(b"NOTIDX!");
    std::fs::write(&idx, &bad).unwrap();
    let e = open();
    assert!(
        e.contains("c.idx") && e.contains("not a Megatron index"),
        "{e}"
    );

    let mut bad = good_idx.clone();
    bad[18] += 1; // one sequence more than the arrays hold
    std::fs::write(&idx, &bad).unwrap();
    let e = open();
    assert!(e.contains("c.idx") && e.contains("the header says"), "{e}");

    std::fs::write(&idx, &good_idx).unwrap();
    std::fs::write(&bin, &good_bin[..good_bin.len() - 2]).unwrap();
    let e = open();
    assert!(e.contains("c.bin") && e.contains("its index"), "{e}");

    std::fs::write(&bin, &good_bin[..good_bin.len() - 1]).unwrap();
    let e = open();
    assert!(e.contains("c.bin") && e.contains("whole number"), "{e}");
}
