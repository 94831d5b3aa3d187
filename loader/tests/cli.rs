//! `wick bench` runs over an ImageFolder and a file list and reports JSON.
#![cfg(feature = "cli")]

use image::{ImageFormat, Rgb, RgbImage};
use std::process::Command;

fn write_png(path: &std::path::Path, shade: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    RgbImage::from_pixel(20, 18, Rgb([shade, 10, 200]))
        .save_with_format(path, ImageFormat::Png)
        .unwrap();
}

fn bench_json(data: &std::path::Path) -> serde_json::Value {
    bench_json_with(
        data,
        &["--image-size", "16", "--epochs", "2", "--workers", "2"],
    )
}

#[test]
fn bench_reports_throughput_for_a_folder_and_a_list() {
    let dir = tempfile::tempdir().unwrap();
    let mut list = String::new();
    for i in 0..10u8 {
        let rel = format!("c{}/{i}.png", i % 2);
        write_png(&dir.path().join("folder").join(&rel), i * 20);
        list += &format!("folder/{rel},{}\n", i % 2);
    }
    let list_path = dir.path().join("list.csv");
    std::fs::write(&list_path, list).unwrap();

    for data in [dir.path().join("folder"), list_path] {
        let r = bench_json(&data);
        assert_eq!(r["samples"], 10, "{r}");
        assert_eq!(r["epoch_images_per_sec"].as_array().unwrap().len(), 2);
        assert!(r["median_images_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["decoded_mb_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn bench_names_a_missing_dataset() {
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["bench", "/nonexistent/wick-data.csv"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/wick-data.csv"), "{err}");
}

#[test]
fn convert_writes_every_format_and_bench_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10u8 {
        write_png(
            &dir.path().join(format!("folder/c{}/{i}.png", i % 2)),
            i * 20,
        );
    }
    for (format, stream) in [
        ("tfrecord", false),
        ("wds", true),
        ("safetensors", false),
        ("safetensors-pixels", true),
    ] {
        let dst = dir.path().join(format);
        let out = succeed(
            Command::new(env!("CARGO_BIN_EXE_wick"))
                .arg("convert")
                .arg(dir.path().join("folder"))
                .arg(&dst)
                .args([
                    "--format",
                    format,
                    "--shard-size",
                    "4",
                    "--pixels-size",
                    "12",
                ]),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("wrote 10 records in 3 shards"), "{stdout}");
        let mut args = vec!["--image-size", "8", "--epochs", "1"];
        if stream {
            args.extend(["--interleave", "2,1", "--shuffle-buffer", "3"]);
        }
        let r = bench_json_with(&dst, &args);
        assert_eq!(r["samples"], 10, "{format}: {r}");
    }
}

/// `wick convert --format wds` indexes what it writes; a WebDataset
/// without a manifest still opens, and says in one line how to index it;
/// `wick index` writes the manifest and an index file per shard, after
/// which opening reads no shard (and says nothing).
#[test]
fn index_writes_a_manifest_that_opening_uses() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10u8 {
        write_png(
            &dir.path().join(format!("folder/c{}/{i}.png", i % 2)),
            i * 20,
        );
    }
    let dst = dir.path().join("wds");
    succeed(
        Command::new(env!("CARGO_BIN_EXE_wick"))
            .arg("convert")
            .arg(dir.path().join("folder"))
            .arg(&dst)
            .args(["--format", "wds", "--shard-size", "4"]),
    );
    let manifest = dst.join("wick-manifest.json");
    assert!(manifest.exists() && dst.join("data-000002.tar.wickidx").exists());
    std::fs::remove_file(&manifest).unwrap();
    let bench = |dst: &std::path::Path| {
        succeed(
            Command::new(env!("CARGO_BIN_EXE_wick"))
                .arg("bench")
                .arg(dst)
                .args([
                    "--batch-size",
                    "4",
                    "--json",
                    "--image-size",
                    "8",
                    "--epochs",
                    "1",
                ]),
        )
    };
    let stderr = String::from_utf8_lossy(&bench(&dst).stderr).into_owned();
    assert!(
        stderr.contains("indexing 3 WebDataset shard(s)") && stderr.contains("wick index"),
        "{stderr}"
    );
    let out = succeed(
        Command::new(env!("CARGO_BIN_EXE_wick"))
            .arg("index")
            .arg(&dst),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("indexed 3 shards (10 samples"), "{stdout}");
    assert!(manifest.exists());
    let out = bench(&dst);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("wick index"), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["samples"], 10, "{r}");
    // Split in parts (each machine a part), then merged reading nothing.
    std::fs::remove_file(&manifest).unwrap();
    let index = |args: &[&str]| {
        let out = succeed(
            Command::new(env!("CARGO_BIN_EXE_wick"))
                .arg("index")
                .arg(&dst)
                .args(args),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let a = index(&["--part", "0/2"]);
    assert!(
        a.contains("indexed 2 shards") && a.contains("part-0-of-2"),
        "{a}"
    );
    assert!(index(&["--part", "1/2"]).contains("indexed 1 shards"));
    let merged = index(&[]);
    assert!(
        merged.contains("0 read (0.0 MB of shards); 3 listed unchanged by 2 part manifest(s)"),
        "{merged}"
    );
    assert!(manifest.exists());
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .args(["index", "--part", "2/2"])
        .arg(&dst)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("K/N"), "{stderr}");
    // A folder of another kind is refused, naming what it holds.
    let out = Command::new(env!("CARGO_BIN_EXE_wick"))
        .arg("index")
        .arg(dir.path().join("folder"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("image folder"),
        "{stderr}"
    );
}

/// `wick convert`, `wick inspect` and `wick bench` take URLs: shards
/// uploaded to a `file://` URL (the object-store path `s3://` takes after
/// its store; tests/remote_servers.rs writes to S3) are inspected and
/// benched there, as is an image folder at a URL.
#[cfg(feature = "remote")]
#[test]
fn convert_inspect_and_bench_take_urls() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10u8 {
        write_png(
            &dir.path().join(format!("folder/c{}/{i}.png", i % 2)),
            i * 20,
        );
    }
    let url = |p: &std::path::Path| format!("file://{}/", p.display());
    let up = url(&dir.path().join("up"));
    let out = succeed(
        Command::new(env!("CARGO_BIN_EXE_wick"))
            .arg("convert")
            .arg(dir.path().join("folder"))
            .arg(&up)
            .args(["--format", "tfrecord", "--shard-size", "4"]),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("wrote 10 records in 3 shards to file://"),
        "{stdout}"
    );
    let mut uploaded: Vec<String> = std::fs::read_dir(dir.path().join("up"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    uploaded.sort();
    // Each shard with its `.idx`, and the manifest, uploaded last.
    assert_eq!(uploaded.len(), 7, "{uploaded:?}");
    assert!(uploaded[0].ends_with("-of-00003.tfrecord"), "{uploaded:?}");
    assert!(
        uploaded[1].ends_with("-of-00003.tfrecord.idx"),
        "{uploaded:?}"
    );
    assert_eq!(uploaded[6], "wick-manifest.json");
    for data in [up.clone(), url(&dir.path().join("folder"))] {
        let out = succeed(
            Command::new(env!("CARGO_BIN_EXE_wick"))
                .args(["inspect", "--json"])
                .arg(&data),
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["images"], 10, "{data}: {r}");
        let r = bench_json_with(
            std::path::Path::new(&data),
            &["--image-size", "8", "--epochs", "1"],
        );
        assert_eq!(r["samples"], 10, "{data}: {r}");
    }
}

/// `wick bench DATA --batch-size 4 --json` plus `extra`.
fn bench_json_with(data: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let out = succeed(
        Command::new(env!("CARGO_BIN_EXE_wick"))
            .arg("bench")
            .arg(data)
            .args(["--batch-size", "4", "--json"])
            .args(extra),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `cmd` and checks that it succeeded, showing its stderr if not.
fn succeed(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
