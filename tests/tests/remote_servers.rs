//! Object storage against real servers on 127.0.0.1, started here:
//! `moto_server` (PyPI `moto[server]`, an S3 API) and nginx (HTTP with
//! range requests). Every format read over the S3 API and over HTTP gives
//! the local batches (Parquet in the Hub's layout too, found by
//! listing the bucket); a killed server is retried and then named, and one
//! restarted in time lets the epoch finish with nothing lost; a paused S3
//! server resumed in time too; 4 rank processes read an S3 dataset with
//! credentials and endpoint from the environment; a Megatron corpus reads
//! the same from S3 by its prefix or its folder.
//!
//! `.ci/run` installs both servers and sets `WICK_REQUIRE_SERVERS=1`, so a
//! missing one fails there; elsewhere a test without its server says so
//! on stderr and passes.

use candle_wick::write::{convert, ConvertOptions, ShardFormat};
use candle_wick::{open_path, Loader, Output};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tests::{image_folder, labels, pixels};

type Batches = Vec<(Vec<usize>, Vec<u32>, Vec<u8>)>;

/// A server process, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16) {
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "server on {port} not up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `program` runs; panics when it does not and CI requires it.
fn have(program: &str) -> bool {
    let ok = Command::new(program)
        .arg(if program == "nginx" { "-v" } else { "--help" })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("WICK_REQUIRE_SERVERS").is_none(),
            "{program} is not installed (.ci/run installs it)"
        );
        eprintln!("skipped: {program} is not installed");
    }
    ok
}

fn moto(port: u16) -> Server {
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto_server");
    let s = Server { child, port };
    wait_port(port);
    s
}

/// nginx serving `root` on `port`, its files under `prefix`.
fn nginx(port: u16, root: &Path, prefix: &Path) -> Server {
    std::fs::create_dir_all(prefix).unwrap();
    // As root, nginx's workers would run as `nobody` and not read a
    // private temporary folder.
    let is_root = std::env::var("USER").is_ok_and(|u| u == "root")
        || Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let conf = format!(
        "{user}master_process off; daemon off; pid {p}/nginx.pid; error_log {p}/error.log;
         events {{ worker_connections 64; }}
         http {{ access_log off; client_body_temp_path {p}/body; proxy_temp_path {p}/proxy;
           fastcgi_temp_path {p}/fcgi; uwsgi_temp_path {p}/uwsgi; scgi_temp_path {p}/scgi;
           server {{ listen 127.0.0.1:{port}; root {root};
             location /private/ {{ return 403; }} }} }}",
        user = if is_root { "user root; " } else { "" },
        p = prefix.display(),
        root = root.display()
    );
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let child = Command::new("nginx")
        .args(["-p"])
        .arg(prefix)
        .arg("-c")
        .arg(&conf_path)
        .stdout(Stdio::null())
        .spawn()
        .expect("start nginx");
    let s = Server { child, port };
    wait_port(port);
    s
}

/// The object-store options that reach the moto server on `port`.
fn moto_options(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("aws_endpoint", format!("http://127.0.0.1:{port}")),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", "test".into()),
        ("aws_secret_access_key", "test".into()),
        ("aws_region", "us-east-1".into()),
    ]
}

/// Creates `bucket` on the S3 server and uploads every file under `dir`
/// with its relative path as the key (boto3, which moto installs).
fn upload(port: u16, bucket: &str, dir: &Path) {
    let script = r#"
import boto3, os, sys
port, bucket, root = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
s3.create_bucket(Bucket=bucket)
for d, _, files in os.walk(root):
    for f in files:
        p = os.path.join(d, f)
        s3.upload_file(p, bucket, os.path.relpath(p, root))
"#;
    let status = Command::new("python3")
        .args(["-c", script, &port.to_string(), bucket])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "upload to moto failed");
}

/// The data set: an image folder, a file list over it, and TFRecord,
/// WebDataset, safetensors and Hub-layout Parquet shards of it (4 shards
/// each; Parquet row groups of 2 rows, so a block shuffle spans groups).
fn dataset(dir: &Path) {
    let folder = dir.join("folder");
    image_folder(&folder, 3, 7);
    let mut rows = String::new();
    for c in 0..3 {
        for e in std::fs::read_dir(folder.join(format!("class{c}"))).unwrap() {
            let name = e.unwrap().file_name();
            rows.push_str(&format!("folder/class{c}/{},{c}\n", name.to_string_lossy()));
        }
    }
    std::fs::write(dir.join("list.csv"), rows).unwrap();
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    for (name, format) in [
        ("tfrecord", ShardFormat::TfRecord),
        ("wds", ShardFormat::WebDataset),
        ("st", ShardFormat::SafetensorsEncoded),
        ("parquet", ShardFormat::Parquet { row_group: 2 }),
    ] {
        let opts = ConvertOptions {
            format,
            shard_size: 6,
            classes: Some(source.classes().to_vec()),
            ..Default::default()
        };
        convert(&source, &dir.join(name), &opts, &|_| {}).unwrap();
    }
    // A second split beside train: a dataset folder or bucket prefix
    // opens as its train split, never both.
    let hub = dir.join("parquet/data");
    std::fs::copy(
        hub.join("train-00000-of-00004.parquet"),
        hub.join("validation-00000-of-00001.parquet"),
    )
    .unwrap();
}

/// `(local path, path under an S3 bucket or HTTP root, streaming)` of each
/// case; HTTP lists nothing, so shards are named by a brace range.
fn cases(dir: &Path, http: bool) -> Vec<(PathBuf, String, bool)> {
    let mut out = vec![
        (dir.join("list.csv"), "list.csv".to_string(), false),
        (
            dir.join("tfrecord"),
            "tfrecord/data-{00000..00003}-of-00004.tfrecord".into(),
            false,
        ),
        (
            dir.join("wds"),
            "wds/data-{000000..000003}.tar".into(),
            false,
        ),
        (
            dir.join("st"),
            "st/data-{00000..00003}.safetensors".into(),
            false,
        ),
        (
            dir.join("parquet"),
            "parquet/data/train-{00000..00003}-of-00004.parquet".into(),
            false,
        ),
        (
            dir.join("tfrecord"),
            "tfrecord/data-{00000..00003}-of-00004.tfrecord".into(),
            true,
        ),
        (
            dir.join("wds"),
            "wds/data-{000000..000003}.tar".into(),
            true,
        ),
    ];
    if !http {
        // S3 lists: a folder and shard prefixes are found by listing.
        out.push((dir.join("folder"), "folder".into(), false));
        for (_, remote, _) in &mut out {
            if remote.contains('{') {
                *remote = remote.split('/').next().unwrap().to_string();
            }
        }
    }
    out
}

fn batches(path: &Path, stream: bool, retries: u32) -> candle_wick::Result<Batches> {
    let mut b = Loader::builder(open_path(path)?)
        .batch_size(5)
        .image_size(16)
        .output(Output::U8Nhwc)
        .shuffle(4)
        .workers(2)
        .retry(retries);
    if stream {
        b = b.interleave(2, 1);
    }
    let mut loader = b.build()?;
    let mut out = Vec::new();
    for b in loader.epoch(1) {
        let b = b?;
        out.push((b.indices.clone(), labels(&b), pixels(&b)));
    }
    Ok(out)
}

#[test]
fn s3_and_http_give_the_local_batches_for_every_format() {
    if !have("moto_server") || !have("nginx") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    dataset(&data);
    let s3 = moto(free_port());
    upload(s3.port, "wick-same", &data);
    candle_wick::storage::configure("s3://wick-same", moto_options(s3.port));
    let http = nginx(free_port(), &data, &dir.path().join("nginx"));
    for (root, is_http) in [
        ("s3://wick-same".to_string(), false),
        (format!("http://127.0.0.1:{}", http.port), true),
    ] {
        for (local, remote, stream) in cases(&data, is_http) {
            let url = PathBuf::from(format!("{root}/{remote}"));
            let want = batches(&local, stream, 0).unwrap();
            let got = batches(&url, stream, 0).unwrap_or_else(|e| {
                panic!("{url:?}: {}", candle_wick::error_chain(&e));
            });
            assert_eq!(got, want, "{url:?} stream {stream}");
        }
    }
    // The Hub layout found by listing the bucket, as Parquet::hub does
    // for a dataset folder: the same split, rows and class names.
    let opts = candle_wick::source::HubOptions::default();
    let local = candle_wick::source::Parquet::hub(data.join("parquet"), "train", &opts).unwrap();
    let remote =
        candle_wick::source::Parquet::hub("s3://wick-same/parquet", "train", &opts).unwrap();
    assert!(local.classes().is_some_and(|c| c.len() == 3));
    assert_eq!(remote.classes(), local.classes());
    assert_eq!(remote.row_groups(), local.row_groups());
    let read = |s: candle_wick::source::Parquet| {
        let mut loader = Loader::builder(s)
            .batch_size(4)
            .image_size(16)
            .output(Output::U8Nhwc)
            .shuffle(2)
            .build()
            .unwrap();
        let mut out = Vec::new();
        for b in loader.epoch(3) {
            let b = b.unwrap();
            out.push((b.indices.clone(), labels(&b), pixels(&b)));
        }
        out
    };
    assert_eq!(read(remote), read(local));
}

/// Reads the WebDataset shards over HTTP while the server is killed after
/// the first batch: restarted within a second, the epoch finishes equal to
/// the local one; never restarted, the error names the object's URL.
#[test]
fn a_killed_http_server_is_retried_and_a_restarted_one_loses_nothing() {
    if !have("nginx") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let folder = data.join("folder");
    image_folder(&folder, 4, 15);
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    let opts = ConvertOptions {
        format: ShardFormat::WebDataset,
        shard_size: 15,
        ..Default::default()
    };
    convert(&source, &data.join("wds"), &opts, &|_| {}).unwrap();
    let port = free_port();
    let prefix = dir.path().join("nginx");
    let local = batches(&data.join("wds"), false, 0).unwrap();
    let url = PathBuf::from(format!(
        "http://127.0.0.1:{port}/wds/data-{{000000..000003}}.tar"
    ));
    for restart in [true, false] {
        let mut server = Some(nginx(port, &data, &prefix));
        let mut loader = Loader::builder(open_path(&url).unwrap())
            .batch_size(5)
            .image_size(16)
            .output(Output::U8Nhwc)
            .shuffle(4)
            .workers(1)
            .prefetch(1)
            .batches_in_flight(1)
            .retry(if restart { 30 } else { 2 })
            .build()
            .unwrap();
        let mut got = Vec::new();
        let mut failed = None;
        for (i, b) in loader.epoch(1).enumerate() {
            match b {
                Ok(b) => got.push((b.indices.clone(), labels(&b), pixels(&b))),
                Err(e) => {
                    failed = Some(candle_wick::error_chain(&e));
                    break;
                }
            }
            if i == 0 {
                drop(server.take());
                if restart {
                    std::thread::sleep(Duration::from_millis(800));
                    server = Some(nginx(port, &data, &prefix));
                }
            }
        }
        if restart {
            assert_eq!(failed, None);
            assert_eq!(got, local, "restarted: nothing lost");
        } else {
            let msg = failed.expect("a dead server fails the epoch");
            assert!(
                msg.contains(&format!("127.0.0.1:{port}/wds/data-"))
                    && msg.contains("after 3 tries"),
                "{msg}"
            );
        }
        drop(server);
    }
}

/// `convert` writes shards (and a TFRecord's index) to S3, and they read
/// back as the same shards converted to local disk.
#[test]
fn convert_uploads_shards_to_s3() {
    if !have("moto_server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    image_folder(&folder, 3, 9);
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    let s3 = moto(free_port());
    upload(s3.port, "wick-up", &folder);
    candle_wick::storage::configure("s3://wick-up", moto_options(s3.port));
    for (name, format) in [
        ("tf", ShardFormat::TfRecord),
        ("wds", ShardFormat::WebDataset),
        ("st", ShardFormat::SafetensorsEncoded),
    ] {
        let opts = ConvertOptions {
            format,
            shard_size: 7,
            ..Default::default()
        };
        let local = dir.path().join(name);
        convert(&source, &local, &opts, &|_| {}).unwrap();
        let url = PathBuf::from(format!("s3://wick-up/shards/{name}/"));
        let written = convert(&source, &url, &opts, &|_| {}).unwrap();
        assert_eq!(written.len(), 4, "{written:?}");
        assert!(written[0]
            .to_string_lossy()
            .starts_with("s3://wick-up/shards/"));
        for stream in [false, true] {
            let want = batches(&local, stream, 0).unwrap();
            assert_eq!(
                batches(&url, stream, 0).unwrap(),
                want,
                "{name} stream {stream}"
            );
        }
    }
}

/// A bucket that does not exist (S3) and an object the server refuses
/// (HTTP 403) fail at once, not after retries, with errors that name the
/// URL and say what is wrong.
#[test]
fn a_missing_bucket_and_a_refused_object_are_named() {
    if !have("moto_server") || !have("nginx") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("private")).unwrap();
    std::fs::write(data.join("private/data-000000.tar"), [0u8; 1024]).unwrap();
    let s3 = moto(free_port());
    upload(s3.port, "wick-exists", &data);
    // Each bucket its own prefix: the other tests' buckets keep theirs.
    for bucket in ["s3://wick-exists", "s3://wick-no-such-bucket"] {
        candle_wick::storage::configure(bucket, moto_options(s3.port));
    }
    let http = nginx(free_port(), &data, &dir.path().join("nginx"));
    let refused = format!(
        "http://127.0.0.1:{}/private/data-{{000000..000000}}.tar",
        http.port
    );
    for (url, says) in [
        (
            "s3://wick-no-such-bucket/train/data-000000.tar".to_string(),
            "not found",
        ),
        ("s3://wick-exists/private/nope.tar".to_string(), "not found"),
        (refused, "permission denied"),
    ] {
        let t = Instant::now();
        let err = match open_path(&url) {
            Ok(_) => panic!("{url} opened"),
            Err(e) => e,
        };
        let msg = candle_wick::error_chain(&err);
        let named = url.replace("{000000..000000}", "000000");
        assert!(msg.contains(&named) && msg.contains(says), "{url}: {msg}");
        assert!(!err.is_transient(), "{url}: {msg}");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{url}: {:?}",
            t.elapsed()
        );
    }
}

/// `kill -STOP` / `-CONT` on a server.
fn signal(server: &Server, sig: &str) {
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

/// An S3 server paused mid-epoch (SIGSTOP: connections open, no answer):
/// requests time out and are retried; resumed within a second, the epoch
/// finishes with the local batches; left paused, it fails with an error
/// naming the object, in bounded time. Random access (read ahead) and
/// streaming both.
#[test]
fn a_paused_s3_server_is_waited_for_and_then_named() {
    if !have("moto_server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let folder = data.join("folder");
    image_folder(&folder, 4, 15);
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    let opts = ConvertOptions {
        format: ShardFormat::WebDataset,
        shard_size: 15,
        ..Default::default()
    };
    convert(&source, &data.join("wds"), &opts, &|_| {}).unwrap();
    let s3 = moto(free_port());
    upload(s3.port, "wick-paused", &data);
    // A short request timeout, so a pause is seen within seconds.
    let mut opts = moto_options(s3.port);
    opts.push(("timeout", "1s".into()));
    candle_wick::storage::configure("s3://wick-paused", opts);
    for stream in [true, false] {
        let local = batches(&data.join("wds"), stream, 0).unwrap();
        for resume in [false, true] {
            let url = PathBuf::from("s3://wick-paused/wds/");
            let mut b = Loader::builder(open_path(&url).unwrap())
                .batch_size(5)
                .image_size(16)
                .output(Output::U8Nhwc)
                .shuffle(4)
                .workers(1)
                .prefetch(1)
                .batches_in_flight(1)
                .retry(if resume { 20 } else { 1 });
            if stream {
                b = b.interleave(2, 1);
            }
            let mut loader = b.build().unwrap();
            let mut got = Vec::new();
            let mut failed = None;
            let t = Instant::now();
            // Paused (and resumed 0.7 s later, on a thread): a stream as its
            // epoch starts (its shards' reads buffer the rest of this small
            // set at once), random access after the first batch.
            let pause = || {
                signal(&s3, "-STOP");
                let pid = s3.child.id().to_string();
                resume.then(|| {
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(700));
                        Command::new("kill").args(["-CONT", &pid]).status()
                    })
                })
            };
            let mut resumer = stream.then(pause).flatten();
            for (i, b) in loader.epoch(1).enumerate() {
                match b {
                    Ok(b) => got.push((b.indices.clone(), labels(&b), pixels(&b))),
                    Err(e) => {
                        failed = Some(candle_wick::error_chain(&e));
                        break;
                    }
                }
                if i == 0 && !stream {
                    resumer = pause();
                }
            }
            if let Some(r) = resumer {
                r.join().unwrap().unwrap();
            }
            signal(&s3, "-CONT");
            let case = format!("stream {stream}, resumed {resume}");
            if resume {
                assert_eq!(failed, None, "{case}");
                assert_eq!(got, local, "{case}: nothing lost");
            } else {
                let msg =
                    failed.unwrap_or_else(|| panic!("{case}: a paused server fails the epoch"));
                assert!(msg.contains("s3://wick-paused/wds/data-"), "{case}: {msg}");
                assert!(
                    t.elapsed() < Duration::from_secs(120),
                    "{case}: {:?}",
                    t.elapsed()
                );
            }
        }
    }
}

/// 4 rank processes (torchrun variables) read WebDataset shards from S3,
/// endpoint and credentials from the `AWS_*` variables: disjoint, complete
/// and equal shares.
#[test]
fn four_rank_processes_read_s3_with_credentials_from_the_environment() {
    if !have("moto_server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let folder = data.join("folder");
    image_folder(&folder, 3, 15);
    let source = candle_wick::source::ImageFolder::new(&folder).unwrap();
    let opts = ConvertOptions {
        format: ShardFormat::WebDataset,
        shard_size: 7,
        ..Default::default()
    };
    convert(&source, &data.join("wds"), &opts, &|_| {}).unwrap();
    let s3 = moto(free_port());
    upload(s3.port, "wick-ranks", &data);
    let children: Vec<_> = (0..4)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_rank"))
                .args(["s3://wick-ranks/wds/", "shuffle=2", "epoch=0"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "4")
                .env("LOCAL_RANK", rank.to_string())
                .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", s3.port))
                .env("AWS_ALLOW_HTTP", "true")
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test")
                .env("AWS_REGION", "us-east-1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut seen = std::collections::BTreeMap::<u64, usize>::new();
    let mut counts = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let batches: Vec<Vec<u64>> = serde_json::from_value(line["batches"].clone()).unwrap();
        counts.push(batches.len());
        for i in batches.into_iter().flatten() {
            *seen.entry(i).or_default() += 1;
        }
    }
    assert!(counts.windows(2).all(|w| w[0] == w[1]), "{counts:?}");
    assert_eq!(seen.len(), 45);
    assert!(seen.values().all(|&c| c == 1));
}

/// A Megatron corpus (written by Megatron-Core's builder) read from the
/// S3 server, named by its prefix or by the folder holding it, gives the
/// local windows.
#[test]
fn a_megatron_corpus_reads_the_same_from_s3() {
    use candle_wick::map::TokenWindowsMap;
    use candle_wick::source::{detect, DatasetKind, DocumentWindows, Megatron};
    if !have("moto_server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let docs: Vec<Vec<Vec<u32>>> = (0..40u32)
        .map(|d| vec![(0..(d * 7) % 53 + 1).map(|t| d * 100 + t).collect()])
        .collect();
    let json = dir.path().join("docs.json");
    std::fs::write(&json, serde_json::to_string(&docs).unwrap()).unwrap();
    let prefix = data.join("web_text_document");
    let args = [
        "write",
        prefix.to_str().unwrap(),
        "uint16",
        json.to_str().unwrap(),
    ];
    if tests::python_fixture("megatron_writer.py", &args).is_none() {
        return;
    }
    let s3 = moto(free_port());
    upload(s3.port, "wick-tokens", &data);
    candle_wick::storage::configure("s3://wick-tokens", moto_options(s3.port));
    let windows = |path: &Path| {
        let found = detect(path).unwrap();
        assert_eq!(found.kind, DatasetKind::Megatron, "{path:?}: {}", found.why);
        let m = Megatron::open(found.paths, 16, DocumentWindows::Packed { eos: Some(0) }).unwrap();
        let mut loader = Loader::builder(m.clone())
            .map(TokenWindowsMap::megatron(&m))
            .batch_size(8)
            .shuffle(5)
            .build()
            .unwrap();
        let mut out = Vec::new();
        for b in loader.epoch(1) {
            let b = b.unwrap();
            out.push((
                b.indices.clone(),
                b.get("tokens").unwrap().to_vec2::<u32>().unwrap(),
            ));
        }
        out
    };
    let want = windows(&prefix);
    assert!(want.len() > 3);
    assert_eq!(
        windows(Path::new("s3://wick-tokens/web_text_document")),
        want
    );
    assert_eq!(
        windows(Path::new("s3://wick-tokens/web_text_document.idx")),
        want
    );
    assert_eq!(windows(Path::new("s3://wick-tokens")), want);
}
