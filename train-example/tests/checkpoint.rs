//! The training example resumes exactly: a run killed with SIGKILL at a
//! point it does not choose, or stopped with Ctrl-C (SIGINT: it finishes
//! the step, checkpoints and exits 0), and resumed with `--resume`, trains
//! on the same samples in the same order as a run never interrupted, and
//! ends with the same weights and optimizer moments, bit for bit (the CPU's
//! arithmetic is deterministic; the checkpoint holds AdamW's moments).

use image::{Rgb, RgbImage};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// 3 classes of 16 small JPEGs each: 6 batches of 8 an epoch.
fn data(root: &Path) -> PathBuf {
    let dir = root.join("data");
    for c in 0..3u8 {
        let class = dir.join(format!("class{c}"));
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..16u8 {
            let img = RgbImage::from_fn(20, 20, |x, y| {
                Rgb([c * 80, (x as u8) * 12 + i, (y as u8) * 12])
            });
            img.save(class.join(format!("{i:02}.jpg"))).unwrap();
        }
    }
    dir
}

/// The example on `data`, logging keys to `keys`; `extra` flags are added,
/// and replace the defaults of the same name.
fn example(data: &Path, keys: &Path, extra: &[&str]) -> Command {
    let defaults = [
        ("--epochs", "3"),
        ("--batch-size", "8"),
        ("--image-size", "16"),
        ("--depth", "8"),
        ("--width", "4"),
        ("--workers", "2"),
        ("--seed", "5"),
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_train-example"));
    cmd.args(["--data", data.to_str().unwrap(), "--cpu"])
        .args(["--keys-log", keys.to_str().unwrap()]);
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            cmd.args([flag, value]);
        }
    }
    cmd.args(extra).stdout(std::process::Stdio::null());
    cmd
}

/// The keys log's lines.
fn keys(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until the keys log of `child` lists at least `steps` steps (of 8
/// samples), or the child exits.
fn wait_for_steps(child: &mut Child, log: &Path, steps: usize) {
    let t = Instant::now();
    while keys(log).len() < steps * 8 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        assert!(t.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The folder `latest` names in `dir`.
fn latest(dir: &Path) -> String {
    let latest = std::fs::read_to_string(dir.join("latest")).expect("a checkpoint");
    latest.trim().to_owned()
}

/// The step of the latest checkpoint in `dir` (`step-N`, or `step-N.k`
/// for a step saved again).
fn saved_step(dir: &Path) -> usize {
    let name = latest(dir);
    let step = name.trim_start_matches("step-").split('.').next();
    step.and_then(|s| s.parse().ok()).expect("a step folder")
}

/// The uninterrupted run's keys: 3 epochs of 48 samples.
fn uninterrupted(dir: &Path, data: &Path) -> Vec<String> {
    let log = dir.join("full.txt");
    let status = example(data, &log, &[]).status().unwrap();
    assert!(status.success());
    let keys = keys(&log);
    assert_eq!(keys.len(), 3 * 48);
    keys
}

/// Copies checkpoint folder `from` (its files and step folders) to `to`.
fn copy_checkpoints(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_checkpoints(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

/// The final (step 18) checkpoints in `a` and `b` hold the same bytes:
/// weights, moments and state.
fn same_final_checkpoint(a: &Path, b: &Path) {
    assert_eq!((saved_step(a), saved_step(b)), (18, 18));
    let last = |d: &Path| d.join(latest(d));
    for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        let x = std::fs::read(last(a).join(file)).unwrap();
        let y = std::fs::read(last(b).join(file)).unwrap();
        assert!(x == y, "{file} differs between the two runs");
    }
}

#[test]
fn a_run_killed_with_sigkill_resumes_with_the_uninterrupted_runs_samples() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let full = uninterrupted(dir.path(), &data);
    // Killed twice, at points it does not choose, each time resumed.
    let (log, ckpt) = (dir.path().join("killed.txt"), dir.path().join("ckpt"));
    let ckpt_arg = ckpt.to_str().unwrap();
    let mut child = example(
        &data,
        &log,
        &["--checkpoint", ckpt_arg, "--checkpoint-every", "2"],
    )
    .spawn()
    .unwrap();
    wait_for_steps(&mut child, &log, 5);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        (2..18).contains(&saved_step(&ckpt)),
        "killed mid-run, after a checkpoint"
    );
    // A copy of this checkpoint (and of the keys log) resumed once and
    // never stopped: what the run killed again must end with.
    let (ref_log, ref_ckpt) = (dir.path().join("ref.txt"), dir.path().join("ref"));
    copy_checkpoints(&ckpt, &ref_ckpt);
    std::fs::copy(&log, &ref_log).unwrap();
    let status = example(&data, &ref_log, &["--resume", ref_ckpt.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut child = example(
        &data,
        &log,
        &["--resume", ckpt_arg, "--checkpoint-every", "3"],
    )
    .spawn()
    .unwrap();
    // Past the end of the first epoch (6 steps) into the second.
    wait_for_steps(&mut child, &log, 8);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!((6..18).contains(&saved_step(&ckpt)), "killed mid-run again");
    let status = example(&data, &log, &["--resume", ckpt_arg])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(keys(&log), full, "the resumed run trained on other samples");
    assert_eq!(keys(&ref_log), full);
    same_final_checkpoint(&ref_ckpt, &ckpt);
}

#[test]
fn ctrl_c_finishes_the_step_checkpoints_and_exits_0_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let full = uninterrupted(dir.path(), &data);
    let (log, ckpt) = (dir.path().join("stopped.txt"), dir.path().join("ckpt"));
    let ckpt_arg = ckpt.to_str().unwrap();
    // No periodic checkpoint: only the one Ctrl-C writes.
    let mut child = example(
        &data,
        &log,
        &["--checkpoint", ckpt_arg, "--checkpoint-every", "0"],
    )
    .spawn()
    .unwrap();
    wait_for_steps(&mut child, &log, 3);
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "Ctrl-C exits 0, got {status}");
    assert_eq!(
        keys(&log).len(),
        saved_step(&ckpt) * 8,
        "the checkpoint is at the last finished step"
    );
    let status = example(&data, &log, &["--resume", ckpt_arg])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(keys(&log), full);
}

/// A run whose last step is a periodic checkpoint's saves it once, and
/// leaves that one checkpoint.
#[test]
fn the_last_step_is_saved_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let (log, ckpt) = (dir.path().join("a.txt"), dir.path().join("ckpt"));
    let ckpt_arg = ckpt.to_str().unwrap();
    let args = ["--checkpoint", ckpt_arg, "--checkpoint-every", "2"];
    let status = example(&data, &log, &[&args[..], &["--epochs", "1"]].concat())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(latest(&ckpt), "step-000000006");
    let mut names: Vec<_> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["latest", "step-000000006"]);
}

#[test]
fn a_resume_with_other_settings_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let (log, ckpt) = (dir.path().join("a.txt"), dir.path().join("ckpt"));
    let ckpt_arg = ckpt.to_str().unwrap();
    let status = example(&data, &log, &["--checkpoint", ckpt_arg, "--epochs", "1"])
        .status()
        .unwrap();
    assert!(status.success());
    let out = example(&data, &log, &["--resume", ckpt_arg, "--batch-size", "4"])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("batch size: the state has 8, this loader 4"),
        "{err}"
    );
}

/// An elastic resume: 2 ranks (torchrun's variables) train one step each
/// and stop; only rank 0 writes the checkpoint; one process resumes it
/// and trains the rest of the epoch. Between them they train on every
/// sample of the epoch once (the example resumed with `epoch_from(e,
/// batch)` before, which ignores the resume point the state gives another
/// world size, and every rank wrote the checkpoint).
#[test]
fn a_resume_on_another_world_size_trains_the_rest_of_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let ckpt = dir.path().join("ckpt");
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let log = dir.path().join(format!("rank{rank}.txt"));
            let ckpt_dir = ckpt.to_str().unwrap();
            let mut cmd = example(
                &data,
                &log,
                &["--epochs", "1", "--steps", "1", "--checkpoint", ckpt_dir],
            );
            cmd.env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", "2");
            (log, cmd.spawn().unwrap())
        })
        .collect();
    let mut seen = Vec::new();
    for (log, mut child) in ranks {
        assert!(child.wait().unwrap().success());
        seen.extend(keys(&log));
    }
    assert_eq!(seen.len(), 16, "one step of 8 on each rank");
    assert_eq!(saved_step(&ckpt), 1, "rank 0's checkpoint");
    let rest = dir.path().join("rest.txt");
    let status = example(
        &data,
        &rest,
        &["--epochs", "1", "--resume", ckpt.to_str().unwrap()],
    )
    .status()
    .unwrap();
    assert!(status.success());
    seen.extend(keys(&rest));
    let mut samples: Vec<String> = seen
        .iter()
        .map(|l| l.rsplit('\t').next().unwrap().to_string())
        .collect();
    samples.sort();
    let total = samples.len();
    samples.dedup();
    assert_eq!((total, samples.len()), (48, 48), "each of 48 samples once");
}
