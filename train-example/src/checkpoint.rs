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
//! renamed to `step-N`, and only then `latest` replaced (written aside,
//! synced, renamed over). Older checkpoints are removed after.
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
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Syncs a directory, so the renames in it are on disk.
fn sync_dir(dir: &Path) -> Res<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Saves checkpoint `saved` with the weights of `varmap` and the moments
/// of `opt` in `dir`, as the module docs say; returns its folder.
pub(crate) fn save(dir: &Path, varmap: &VarMap, opt: &AdamW, saved: &Saved) -> Res<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let name = format!("step-{:09}", saved.step);
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
    if done.exists() {
        std::fs::remove_dir_all(&done)?;
    }
    std::fs::rename(&tmp, &done)?;
    let latest_tmp = dir.join("latest.tmp");
    write_synced(&latest_tmp, name.as_bytes())?;
    std::fs::rename(&latest_tmp, dir.join("latest"))?;
    sync_dir(dir)?;
    // Older checkpoints and leftovers of interrupted saves.
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if file.starts_with("step-") && file != name {
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
    write_synced(path, kept.as_bytes())
}
