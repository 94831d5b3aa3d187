thread_local! {
    /// Prefixes listed by this thread.
    pub(super) static LISTED_PREFIXES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Detecting a dataset under a prefix probes one suffix after another
/// (TFRecord, tar, safetensors, Parquet, ...), then the open lists it
/// again: over one listing. The sizes and versions of the shards are kept
/// for their opens (no HEAD each), whatever the listing's length, and of
/// nothing else.
#[test]
fn a_prefix_is_listed_once_and_only_its_shards_are_remembered() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        let mut tar = tar::Builder::new(Vec::new());
        for ext in ["jpg", "cls"] {
            let mut h = tar::Header::new_ustar();
            h.set_size(1);
            h.set_cksum();
            tar.append_data(&mut h, format!("{i}.{ext}"), &b"1"[..])
                .unwrap();
        }
        std::fs::write(
            dir.path().join(format!("s-{i}.tar")),
            tar.into_inner().unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join(format!("preview-{i}.jpg")), b"x").unwrap();
    }
    let prefix = format!("file://{}/", dir.path().display());
    let before = LISTED_PREFIXES.with(|n| n.get());
    let source = crate::formats::open_path(&prefix).unwrap();
    assert_eq!(source.len(), 3);
    assert_eq!(LISTED_PREFIXES.with(|n| n.get()) - before, 1, "one listing");
    let url = |name: &str| {
        format!(
            "file:///{}",
            dir.path()
                .join(name)
                .display()
                .to_string()
                .trim_start_matches('/')
        )
    };
    // Listed again outside the detection: a new listing.
    crate::storage::list_urls(&prefix, &[".tar"]).unwrap();
    assert_eq!(LISTED_PREFIXES.with(|n| n.get()) - before, 2);
    let kept = crate::sync::lock(super::listed());
    assert!(kept.contains_key(&url("s-1.tar")), "a shard's size is kept");
    assert!(
        !kept.contains_key(&url("preview-1.jpg")),
        "a jpg is not a shard"
    );
}

/// `configure("s3://data", ..)` is for that bucket, not
/// `s3://data-public`.
#[test]
fn options_apply_under_their_prefix_at_a_boundary() {
    use super::stores::under;
    assert!(under("s3://data/x.tar", "s3://data"));
    assert!(under("s3://data", "s3://data"));
    assert!(under("s3://data/train/x", "s3://data/"));
    assert!(!under("s3://data-public/x.tar", "s3://data"));
    assert!(!under("s3://datasets/x", "s3://data"));
    assert!(under("https://host/a/b", "https://host/a"));
    assert!(!under("https://host/ab", "https://host/a"));
}

/// A listing's entity tag may not be the reads' (an S3 API listed, its
/// objects served by a proxy or CDN: the bench's nginx in front of
/// s3rver): the first read's version is the one later reads require,
/// and a rewrite after it is refused.
#[test]
fn reads_require_the_version_their_first_read_got() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.bin");
    std::fs::write(&path, [1u8; 4096]).unwrap();
    let url = format!("file://{}", path.display());
    let listed_as = super::Version {
        e_tag: Some("\"a-tag-another-server-gave\"".into()),
        modified: None,
    };
    crate::sync::lock(super::listed()).insert(url.clone(), (4096, listed_as));
    let o = super::Object::open(&url).unwrap();
    assert_eq!(o.get_range(0..10).unwrap().len(), 10);
    assert_eq!(o.get_range(100..200).unwrap().len(), 100);
    std::fs::write(&path, [2u8; 4096]).unwrap();
    let e = o.get_range(0..10).unwrap_err();
    assert!(e.to_string().contains("changed"), "{e}");
}

/// After a transient failure every read of the store waits, the wait
/// doubling with each failure up to 5 s; a success ends it; answers
/// about the object (not found, changed) do not count.
#[test]
fn a_store_backs_off_for_all_its_reads_after_a_failure() {
    use super::{backoff_note, backoffs, BACKOFF_MOST};
    let root = "s3://backoff-test";
    let failed = || -> Result<(), object_store::Error> {
        Err(object_store::Error::Generic {
            store: "S3",
            source: "503 SlowDown".into(),
        })
    };
    let wait = || {
        let b = crate::sync::lock(backoffs());
        b.get(root)
            .and_then(|b| b.until)
            .map(|u| u.saturating_duration_since(std::time::Instant::now()))
    };
    backoff_note(root, &failed());
    let first = wait().expect("a back-off");
    backoff_note(root, &failed());
    let second = wait().expect("a back-off");
    assert!(second > first, "{second:?} after {first:?}");
    for _ in 0..20 {
        backoff_note(root, &failed());
    }
    assert!(wait().unwrap() <= BACKOFF_MOST);
    let not_found = Err::<(), _>(object_store::Error::NotFound {
        path: "x".into(),
        source: "gone".into(),
    });
    backoff_note(root, &not_found);
    assert!(wait().is_some(), "a missing object is not the store's load");
    backoff_note(root, &Ok::<(), object_store::Error>(()));
    assert_eq!(wait(), None);
}

/// The store's `Debug` prints an Azure SAS token (object_store derives
/// it); an object's does not.
#[test]
fn an_object_prints_no_credentials() {
    super::configure(
        "az://wickdebug",
        vec![
            ("azure_storage_account_name".into(), "acct".into()),
            (
                "azure_storage_sas_key".into(),
                "sv=2024-01-01&sig=TOPSECRETSIGNATURE".into(),
            ),
        ],
    );
    let (store, path) = super::store("az://wickdebug/x.parquet").unwrap();
    assert!(format!("{store:?}").contains("TOPSECRET"), "the probe");
    let o = super::Object {
        store,
        root: "az://wickdebug".into(),
        path,
        url: "az://wickdebug/x.parquet".into(),
        len: 1,
        pinned: Default::default(),
        key: "k".into(),
        opened: Default::default(),
    };
    let shown = format!("{o:?} {:?}", crate::storage::Blob::Remote(o.clone()));
    assert!(!shown.contains("TOPSECRET"), "{shown}");
    assert!(shown.contains("az://wickdebug/x.parquet"), "{shown}");
}

/// An upload in one PUT and in parts (small limits here) writes the
/// file's bytes, and an upload to a bad URL names it.
#[test]
fn uploads_write_the_file_whole_and_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("shard.bin");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    for (name, limits) in [("one", (1 << 20, 1 << 20)), ("parts", (1000, 7000))] {
        let url = format!("file://{}/up/{name}.bin", dir.path().display());
        super::upload::upload_in(&local, &url, limits).unwrap();
        let got = std::fs::read(dir.path().join("up").join(format!("{name}.bin"))).unwrap();
        assert!(got == data, "{name}");
    }
    let err = super::upload(&local, "nope://x/y").unwrap_err();
    assert!(err.to_string().contains("nope://x/y"), "{err}");
}
