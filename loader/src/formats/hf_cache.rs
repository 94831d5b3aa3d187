//! The local Hugging Face hub cache, read offline, for every format kept
//! there (Parquet datasets, Megatron corpora, token files).
//!
//! The hub cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`
//! (resolved here: the `hf-hub` crate no longer reads these variables). A
//! dataset `org/name` lives in `datasets--org--name/`: `refs/{revision}`
//! names a commit, `snapshots/{commit}/` holds its files (symbolic links
//! into `blobs/`), as `huggingface-cli download` and the `datasets`
//! library leave them.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The hub cache folder: `$HF_HUB_CACHE`, `$HF_HOME/hub`,
/// `$XDG_CACHE_HOME/huggingface/hub` or `~/.cache/huggingface/hub`.
pub fn hf_hub_cache() -> Option<PathBuf> {
    hub_cache_from(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
}

fn hub_cache_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(dir) = var("HF_HUB_CACHE") {
        return Some(dir.into());
    }
    if let Some(home) = var("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(xdg).join("huggingface").join("hub"));
    }
    var("HOME").map(|h| {
        PathBuf::from(h)
            .join(".cache")
            .join("huggingface")
            .join("hub")
    })
}

/// The snapshot folder of dataset `repo` (`org/name`) at `revision` in
/// the hub cache `cache`.
pub fn cached_snapshot(cache: &Path, repo: &str, revision: &str) -> Result<PathBuf> {
    let folder = cache.join(format!("datasets--{}", repo.replace('/', "--")));
    if !folder.is_dir() {
        return Err(Error::Dataset {
            path: folder,
            reason: format!(
                "dataset {repo:?} is not in the Hugging Face cache (download it first, e.g. \
                 `huggingface-cli download --repo-type dataset {repo}`)"
            ),
            source: None,
        });
    }
    let reference = folder.join("refs").join(revision);
    let is_commit = revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit());
    let commit = match std::fs::read_to_string(&reference) {
        Ok(c) => c.trim().to_string(),
        Err(_) if is_commit => revision.to_string(),
        // `datasets` and `huggingface_hub` download by commit and write no
        // ref when asked for one: the default revision is then the newest
        // snapshot (the only one, mostly).
        Err(e) if revision == "main" => newest_snapshot(&folder).ok_or(Error::Io {
            path: reference,
            source: e,
        })?,
        Err(e) => {
            return Err(Error::Io {
                path: reference,
                source: e,
            })
        }
    };
    let snapshot = folder.join("snapshots").join(&commit);
    if !snapshot.is_dir() {
        return Err(Error::Dataset {
            path: snapshot,
            reason: format!("revision {revision:?} is commit {commit}, which has no snapshot"),
            source: None,
        });
    }
    Ok(snapshot)
}

/// The commit of the most recently written snapshot of a cached dataset
/// (`folder`: `datasets--org--name`), if it has any.
fn newest_snapshot(folder: &Path) -> Option<String> {
    std::fs::read_dir(folder.join("snapshots"))
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let modified = e.metadata().and_then(|m| m.modified()).ok()?;
            Some((modified, e.file_name().to_string_lossy().into_owned()))
        })
        .max()
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_folder_follows_the_variables_in_order() {
        let vars = |set: &'static [(&'static str, &'static str)]| {
            move |k: &str| set.iter().find(|v| v.0 == k).map(|v| v.1.into())
        };
        const ALL: &[(&str, &str)] = &[
            ("HF_HUB_CACHE", "/a"),
            ("HF_HOME", "/b"),
            ("XDG_CACHE_HOME", "/c"),
            ("HOME", "/d"),
        ];
        let all = ALL;
        assert_eq!(hub_cache_from(vars(all)), Some("/a".into()));
        assert_eq!(hub_cache_from(vars(&all[1..])), Some("/b/hub".into()));
        assert_eq!(
            hub_cache_from(vars(&all[2..])),
            Some("/c/huggingface/hub".into())
        );
        assert_eq!(
            hub_cache_from(vars(&all[3..])),
            Some("/d/.cache/huggingface/hub".into())
        );
        assert_eq!(hub_cache_from(vars(&[])), None);
    }
}
