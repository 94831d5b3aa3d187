use super::*;

/// Writes `prefix.bin` + `prefix.idx` of `docs` (documents of
/// sequences) as `u16` tokens, in Megatron's layout; `tweak` edits
/// the index bytes.
fn write(dir: &Path, name: &str, docs: &[Vec<Vec<u16>>], tweak: impl Fn(&mut Vec<u8>)) -> PathBuf {
    let prefix = dir.join(name);
    let mut bin = Vec::new();
    let (mut lengths, mut pointers, mut bounds) = (Vec::new(), Vec::new(), vec![0i64]);
    for doc in docs {
        for seq in doc {
            pointers.push(bin.len() as i64);
            lengths.push(seq.len() as i32);
            bin.extend(seq.iter().flat_map(|t| t.to_le_bytes()));
        }
        bounds.push(lengths.len() as i64);
    }
    let mut idx = MAGIC.to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(8);
    idx.extend((lengths.len() as u64).to_le_bytes());
    idx.extend((bounds.len() as u64).to_le_bytes());
    idx.extend(lengths.iter().flat_map(|v| v.to_le_bytes()));
    idx.extend(pointers.iter().flat_map(|v| v.to_le_bytes()));
    idx.extend(bounds.iter().flat_map(|v| v.to_le_bytes()));
    tweak(&mut idx);
    std::fs::write(prefix.with_extension("bin"), bin).unwrap();
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
    prefix
}

fn docs() -> Vec<Vec<Vec<u16>>> {
    vec![
        vec![vec![1, 2, 3], vec![4, 5]],
        vec![vec![6, 7, 8, 9]],
        vec![vec![10]],
        vec![],
        vec![vec![11, 12, 13, 14, 15, 16, 17]],
    ]
}

fn windows(m: &Megatron) -> Vec<Vec<u32>> {
    (0..m.len())
        .map(|i| {
            let mut out = vec![0; m.seq_len() + 1];
            let n = m.read_window(i, &mut out).unwrap();
            out.truncate(n);
            out
        })
        .collect()
}

#[test]
fn packed_windows_cross_documents_with_and_without_eos() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "c", &docs(), |_| {});
    let m = Megatron::open([&p], 3, DocumentWindows::Packed { eos: None }).unwrap();
    assert_eq!((m.documents(), m.tokens()), (5, 17));
    assert_eq!(
        windows(&m),
        [
            vec![1, 2, 3, 4],
            vec![4, 5, 6, 7],
            vec![7, 8, 9, 10],
            vec![10, 11, 12, 13],
            vec![13, 14, 15, 16],
        ]
    );
    let m = Megatron::open([&p], 4, DocumentWindows::Packed { eos: Some(0) }).unwrap();
    // The stream: 1 2 3 4 5 0 6 7 8 9 0 10 0 0 11 .. 17 0 (22 tokens).
    assert_eq!(
        windows(&m),
        [
            vec![1, 2, 3, 4, 5],
            vec![5, 0, 6, 7, 8],
            vec![8, 9, 0, 10, 0],
            vec![0, 0, 11, 12, 13],
            vec![13, 14, 15, 16, 17],
        ]
    );
    assert_eq!(m.key(1), format!("{}@4", p.display()));
}

#[test]
fn windows_inside_documents_end_short_and_skip_single_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "c", &docs(), |_| {});
    let m = Megatron::open([&p], 3, DocumentWindows::WithinDocument { pad: 0 }).unwrap();
    assert_eq!(
        windows(&m),
        [
            vec![1, 2, 3, 4],
            vec![4, 5],
            vec![6, 7, 8, 9],
            vec![11, 12, 13, 14],
            vec![14, 15, 16, 17],
        ]
    );
    assert_eq!(m.key(4), format!("{}#doc4@3", p.display()));
    let record = m.read_parts(1, &Parts::All, Vec::new()).unwrap();
    assert_eq!(record.part("tokens"), Some(&Value::Tokens(vec![4, 5])));
}

#[test]
fn several_prefixes_count_on_and_never_share_a_window() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "a", &docs(), |_| {});
    let b = write(dir.path(), "b", &[vec![vec![20, 21, 22, 23, 24]]], |_| {});
    let m = Megatron::open([&a, &b], 3, DocumentWindows::Packed { eos: None }).unwrap();
    let w = windows(&m);
    assert_eq!(w.len(), 6);
    assert_eq!(w[5], [20, 21, 22, 23]);
    assert!(m.key(5).starts_with(&b.display().to_string()));
    assert_ne!(
        m.digest(),
        Megatron::open([&b, &a], 3, DocumentWindows::Packed { eos: None })
            .unwrap()
            .digest()
    );
}

#[test]
fn a_bad_index_or_bin_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    type Tweak = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Tweak, &str)> = vec![
        ("magic", Box::new(|i| i[0] = b'X'), "not a Megatron index"),
        ("version", Box::new(|i| i[9] = 2), "version 2"),
        ("float", Box::new(|i| i[17] = 7), "floats are not tokens"),
        ("code", Box::new(|i| i[17] = 9), "unknown type code 9"),
        (
            "count",
            Box::new(|i| i[18] += 1),
            "the header says 6 sequences",
        ),
        (
            "short",
            Box::new(|i| {
                i.pop();
            }),
            "the file has",
        ),
        // Sequence 1's offset (after 5 lengths, one pointer).
        (
            "pointer",
            Box::new(|i| i[34 + 20 + 8] += 2),
            "sequence 1 starts at byte 8",
        ),
        (
            "length",
            Box::new(|i| i[34 + 3] = 0x80),
            "sequence 0 has length",
        ),
        // The last boundary.
        (
            "bound",
            Box::new(|i| {
                let n = i.len();
                i[n - 8] = 4;
            }),
            "not the end (5)",
        ),
        (
            "order",
            Box::new(|i| i[34 + 60 + 16] = 1),
            "never decreasing",
        ),
    ];
    for (name, tweak, says) in cases {
        let p = write(dir.path(), name, &docs(), tweak);
        let e = Megatron::open([&p], 2, DocumentWindows::Packed { eos: None }).unwrap_err();
        let text = crate::error::error_chain(&e);
        assert!(text.contains(&format!("{name}.idx")), "{name}: {text}");
        assert!(text.contains(says), "{name}: {text}");
    }
    // A `.bin` that does not hold the tokens the index says.
    let p = write(dir.path(), "bin", &docs(), |_| {});
    let mut bin = std::fs::read(p.with_extension("bin")).unwrap();
    bin.extend([0, 0]);
    std::fs::write(p.with_extension("bin"), bin).unwrap();
    let e = Megatron::open([&p], 2, DocumentWindows::Packed { eos: None }).unwrap_err();
    let text = crate::error::error_chain(&e);
    assert!(
        text.contains("bin.bin") && text.contains("holds 18"),
        "{text}"
    );
}

/// The `.idx` is read in place: cut short while it is mapped, a window
/// whose document lies past the cut is an error naming the index, never
/// tokens read at zeroed offsets (or a crash), and the damaged mapping is
/// not read again.
#[cfg(target_os = "linux")]
#[test]
fn an_index_cut_while_mapped_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let many: Vec<Vec<Vec<u16>>> = (0..2000u16).map(|d| vec![vec![d, d, d]]).collect();
    let p = write(dir.path(), "c", &many, |_| {});
    let m = Megatron::open([&p], 2, DocumentWindows::WithinDocument { pad: 0 }).unwrap();
    assert_eq!(m.len(), 2000);
    let mut out = vec![0; 3];
    assert_eq!(m.read_window(1999, &mut out).unwrap(), 3);
    assert_eq!(out, [1999; 3]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(p.with_extension("idx"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let e = m.read_window(1999, &mut out).unwrap_err().to_string();
    assert!(e.contains("c.idx") && e.contains("cut short"), "{e}");
    let e = m.read_window(3, &mut out).unwrap_err().to_string();
    assert!(e.contains("c.idx") && e.contains("cut short"), "{e}");
}

/// Windows inside documents over many strides of documents of every
/// length (empty and single-token ones give none) are the documents'
/// windows in order, as counting through every document gives them.
#[test]
fn windows_inside_many_documents_are_found_from_the_kept_counts() {
    let dir = tempfile::tempdir().unwrap();
    let many: Vec<Vec<Vec<u16>>> = (0..1500u16)
        .map(|d| match d % 9 {
            8 => vec![],
            n => vec![(0..n).map(|t| d.wrapping_mul(7).wrapping_add(t)).collect()],
        })
        .collect();
    let p = write(dir.path(), "c", &many, |_| {});
    let seq_len = 2;
    let mut want = Vec::new();
    for doc in &many {
        let tokens: Vec<u32> = doc.iter().flatten().map(|&t| u32::from(t)).collect();
        let mut at = 0;
        while at + 1 < tokens.len() {
            want.push(tokens[at..(at + seq_len + 1).min(tokens.len())].to_vec());
            at += seq_len;
        }
    }
    let m = Megatron::open([&p], seq_len, DocumentWindows::WithinDocument { pad: 0 }).unwrap();
    assert_eq!(m.documents(), 1500);
    assert_eq!(windows(&m), want);
}
