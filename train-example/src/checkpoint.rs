//! Checkpoints: the model's weights, the optimizer's moments, the step and
//! the loader's state, written so that a kill at any moment leaves the
//! previous checkpoint or the new one, never a mix.
//!
//! Layout of a checkpoint directory:
//!
//! ```text
//! DIR/step-000000120/model.safetensors      the VarMap (weights and batch-norm statistics)
//! DIR/step-000000120/optimizer.safetensors  AdamW's moments (`m.<name>`, `v.<name>`)
//! DIR/step-000000120/state.json             {"step": 120, "loader": LoaderState}
//! DIR/latest                             "step-000000120"
//! ```
//!
//! A checkpoint is written into `step-N.tmp`, its files synced, the folder
//! renamed to `step-N` and the rename synced, and only then `latest`
//! replaced (written aside, synced, renamed over, synced). Older
//! checkpoints are removed after. A step saved again while its folder is
//! there (the live one) goes to a free name, `step-N.1`: the folder
//! `latest` names is removed only once `latest` names another.
//!
//! AdamW's step count is the training step (one update a step). With the
//! moments saved (`optim.rs`: candle-nn's `AdamW` keeps them private), a
//! resumed run on the CPU ends with the same weights, bit for bit, as a run
//! never stopped (tests/checkpoint.rs).

use crate::optim::AdamW;
use candle_nn::VarMap;
use candle_wick::LoaderState;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The optimizer's file in a checkpoint folder.
pub(crate) const OPTIMIZER: &str = "optimizer.safetensors";

/// What a checkpoint holds beside the weights.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Saved {
    /// Training steps completed.
    pub(crate) step: u64,
    /// The loader's state after the last step's batch.
    pub(crate) loader: LoaderState,
}

/// Writes `bytes` to `path` and syncs it to disk.
fn write_synced(path: &Path, bytes: &[u8]) -> Res<()> {
    let mut f = std::fs::File::create(path)?;
    at("write")?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Syncs a directory, so the renames in it are on disk.
fn sync_dir(dir: &Path) -> Res<()> {
    at("sync dir")?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// The directory holding `path` (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Replaces the file at `path` with `bytes` so that a kill or a power cut
/// at any point leaves the old file or the new one: written aside, synced,
/// renamed over, and the rename synced.
fn replace_synced(path: &Path, bytes: &[u8]) -> Res<()> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".tmp");
    let aside = PathBuf::from(aside);
    write_synced(&aside, bytes)?;
    at("rename")?;
    std::fs::rename(&aside, path)?;
    sync_dir(parent(path))
}

/// A folder name for checkpoint `step` (`step-000000120`) that nothing in
/// `dir` has: `step-000000120.1`, `.2` ... when it is taken. Saving a step
/// saved before (the live checkpoint, which `latest` names) so never
/// touches that folder: a folder cannot be renamed over a full one, and
/// removing it first would leave `latest` naming nothing until the rename.
fn free_name(dir: &Path, step: u64) -> String {
    let base = format!("step-{step:09}");
    let mut name = base.clone();
    let mut k = 0;
    while dir.join(&name).exists() {
        k += 1;
        name = format!("{base}.{k}");
    }
    name
}

/// Saves checkpoint `saved` with the weights of `varmap` and the moments
/// of `opt` in `dir`, as the module docs say; returns its folder.
pub(crate) fn save(dir: &Path, varmap: &VarMap, opt: &AdamW, saved: &Saved) -> Res<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let name = free_name(dir, saved.step);
    let tmp = dir.join(format!("{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir(&tmp)?;
    let model = tmp.join("model.safetensors");
    varmap.save(&model)?;
    std::fs::File::open(&model)?.sync_all()?;
    let moments = tmp.join(OPTIMIZER);
    opt.save(&moments)?;
    std::fs::File::open(&moments)?.sync_all()?;
    write_synced(&tmp.join("state.json"), &serde_json::to_vec_pretty(saved)?)?;
    sync_dir(&tmp)?;
    let done = dir.join(&name);
    at("rename folder")?;
    std::fs::rename(&tmp, &done)?;
    // The folder's rename on disk before `latest` names it: a file system
    // that wrote the second rename first would lose both after a power cut.
    sync_dir(dir)?;
    replace_synced(&dir.join("latest"), name.as_bytes())?;
    // Older checkpoints (the one this replaces included) and leftovers of
    // interrupted saves, now that `latest` names the new one on disk.
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if file.starts_with("step-") && file != name {
            at("remove")?;
            std::fs::remove_dir_all(&path)?;
        }
    }
    Ok(done)
}

/// The latest checkpoint in `dir`: its folder and what it holds.
pub(crate) fn latest(dir: &Path) -> Res<(PathBuf, Saved)> {
    let latest = dir.join("latest");
    let name = std::fs::read_to_string(&latest).map_err(|e| {
        format!(
            "no checkpoint in {}: {}: {e}",
            dir.display(),
            latest.display()
        )
    })?;
    let folder = dir.join(name.trim());
    let state = folder.join("state.json");
    let text = std::fs::read_to_string(&state)
        .map_err(|e| format!("checkpoint {}: {e}", state.display()))?;
    let saved =
        serde_json::from_str(&text).map_err(|e| format!("checkpoint {}: {e}", state.display()))?;
    Ok((folder, saved))
}

/// Drops the lines of keys log `path` ("epoch\tstep\tkey") of steps from
/// `step` on (and any line cut short by a kill): what a resumed run trains
/// again.
pub(crate) fn truncate_keys_log(path: &Path, step: u64) -> Res<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("keys log {}: {e}", path.display()).into()),
    };
    let kept: String = text
        .split_inclusive('\n')
        .filter(|line| {
            let mut cols = line.split('\t');
            let s = cols.nth(1).and_then(|s| s.parse::<u64>().ok());
            line.ends_with('\n') && s.is_some_and(|s| s < step)
        })
        .collect();
    // Not rewritten in place: a kill then would leave it empty or cut.
    replace_synced(path, kept.as_bytes())
}

/// A point in a save or a rewrite where a kill could come: the unit tests
/// fail the operation there to see what it leaves.
#[cfg(test)]
fn at(stage: &'static str) -> Res<()> {
    tests::HOOK.with(|h| match h.borrow_mut().as_mut() {
        Some(hook) => hook(stage),
        None => Ok(()),
    })
}

#[cfg(not(test))]
fn at(_: &'static str) -> Res<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use std::cell::RefCell;

    type Hook = Box<dyn FnMut(&'static str) -> Res<()>>;

    thread_local! {
        /// Called at each [`at`] of this thread.
        pub(super) static HOOK: RefCell<Option<Hook>> = RefCell::new(None);
    }

    fn set_hook(hook: Option<Hook>) {
        HOOK.with(|h| *h.borrow_mut() = hook);
    }

    /// The stages [`at`] meets while `f` runs.
    fn stages(f: impl FnOnce()) -> Vec<&'static str> {
        let seen = std::rc::Rc::new(RefCell::new(Vec::new()));
        let log = seen.clone();
        set_hook(Some(Box::new(move |s| {
            log.borrow_mut().push(s);
            Ok(())
        })));
        f();
        set_hook(None);
        let seen = seen.borrow().clone();
        seen
    }

    /// Runs `f` with the `n`th stage it meets failing (a kill there: what
    /// the operation wrote before stays, nothing after happens).
    fn failing_at<T>(n: usize, f: impl FnOnce() -> Res<T>) -> Res<T> {
        let mut count = 0;
        set_hook(Some(Box::new(move |s| {
            count += 1;
            if count == n {
                return Err(format!("killed before {s}").into());
            }
            Ok(())
        })));
        let r = f();
        set_hook(None);
        r
    }

    /// A one-variable model, its optimizer and a loader state to save.
    fn model() -> (VarMap, AdamW, LoaderState) {
        let varmap = VarMap::new();
        let init = candle_nn::Init::Const(0.5);
        varmap
            .get((2, 3), "w", init, DType::F32, &Device::Cpu)
            .unwrap();
        let opt = AdamW::new(&varmap, candle_nn::ParamsAdamW::default()).unwrap();
        let mut png = Vec::new();
        image::RgbImage::new(8, 8)
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let records = vec![candle_wick::source::Record::encoded("a.png", png, 0)];
        let mut loader =
            candle_wick::Loader::builder(candle_wick::source::MemorySource::new(records))
                .batch_size(1)
                .image_size(8)
                .build()
                .unwrap();
        let state = loader.epoch(0).next().unwrap().unwrap().state();
        (varmap, opt, state)
    }

    /// `latest` names a complete checkpoint of step `step`.
    fn loads(dir: &Path, step: u64) -> std::result::Result<(), String> {
        let (folder, saved) = latest(dir).map_err(|e| e.to_string())?;
        for file in ["model.safetensors", OPTIMIZER, "state.json"] {
            if !folder.join(file).is_file() {
                return Err(format!("{} has no {file}", folder.display()));
            }
        }
        match saved.step == step {
            true => Ok(()),
            false => Err(format!("step {} instead of {step}", saved.step)),
        }
    }

    /// Step folders left in `dir`.
    fn folders(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("step-"))
            .collect();
        names.sort();
        names
    }

    /// Saving a step saved already (the run's last step, saved by the
    /// periodic save and again at the end) and killed at any point leaves
    /// `latest` naming a complete checkpoint; the next save cleans up.
    #[test]
    fn a_kill_while_saving_a_step_again_leaves_a_complete_checkpoint() {
        let (varmap, opt, state) = model();
        let saved = |step| Saved {
            step,
            loader: state.clone(),
        };
        let scratch = tempfile::tempdir().unwrap();
        save(scratch.path(), &varmap, &opt, &saved(4)).unwrap();
        let second = stages(|| {
            save(scratch.path(), &varmap, &opt, &saved(4)).unwrap();
        });
        let mut broken = Vec::new();
        for (n, stage) in (1..).zip(&second) {
            let dir = tempfile::tempdir().unwrap();
            save(dir.path(), &varmap, &opt, &saved(4)).unwrap();
            let killed = failing_at(n, || save(dir.path(), &varmap, &opt, &saved(4)));
            assert!(killed.is_err(), "{stage} (stage {n}) is met");
            if let Err(e) = loads(dir.path(), 4) {
                broken.push(format!("killed before {stage} (stage {n}): {e}"));
            }
            // The next save (the resumed run's) leaves one checkpoint.
            save(dir.path(), &varmap, &opt, &saved(6)).unwrap();
            loads(dir.path(), 6).unwrap();
            assert_eq!(folders(dir.path()), ["step-000000006"]);
        }
        assert!(broken.is_empty(), "{broken:#?}");
    }

    /// The folder's rename is on disk before `latest` names it.
    #[test]
    fn the_folder_is_synced_between_the_two_renames() {
        let (varmap, opt, state) = model();
        let dir = tempfile::tempdir().unwrap();
        let saved = Saved {
            step: 2,
            loader: state,
        };
        let all = stages(|| {
            save(dir.path(), &varmap, &opt, &saved).unwrap();
        });
        let at = |s| all.iter().position(|x| *x == s).unwrap();
        let synced = all[at("rename folder")..at("rename")].contains(&"sync dir");
        assert!(synced, "{all:?}");
    }

    /// A kill while the keys log is rewritten leaves the old log or the
    /// new one, never an empty or partial one.
    #[test]
    fn a_kill_while_the_keys_log_is_rewritten_keeps_a_whole_log() {
        let old = "0\t0\ta\n0\t1\tb\n0\t2\tc\n";
        let new = "0\t0\ta\n0\t1\tb\n";
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("keys.txt");
        std::fs::write(&log, old).unwrap();
        let all = stages(|| truncate_keys_log(&log, 2).unwrap());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), new);
        for n in 1..=all.len() {
            std::fs::write(&log, old).unwrap();
            assert!(failing_at(n, || truncate_keys_log(&log, 2)).is_err());
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(
                text == old || text == new,
                "killed before {}: {text:?}",
                all[n - 1]
            );
        }
    }
}
