//! A Hugging Face dataset's split as Parquet files: the Hub's layouts in a
//! folder (a clone, a snapshot, a URL prefix), and the local Hugging Face
//! hub cache, read offline.
//!
//! Layouts, tried in this order:
//! - `push_to_hub`: `data/{split}-NNNNN-of-NNNNN[-hash].parquet` (or
//!   `{config}/{split}-...` for a named config). The `-of-NNNNN` count is
//!   checked: a missing shard is an error, never a smaller split.
//! - the auto-converter's `refs/convert/parquet`: `{config}/{split}/NNNN.parquet`.
//!   A split larger than the converter's limit is written only in part,
//!   as `{config}/partial-{split}/` (its first ~5 GB): refused unless
//!   [`HubOptions::allow_partial`], saying so.
//!
//! The hub cache is found by [`crate::formats::hf_cache`].

use super::{Parquet, ParquetOptions};
use crate::error::{Error, Result};
use crate::formats::hf_cache::{cached_snapshot, hf_hub_cache};
use std::path::{Path, PathBuf};

/// Which split of a Hub dataset to read, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct HubOptions {
    /// The config (subset): `None` for the only one or `default`.
    pub config: Option<String>,
    /// For the cache: the branch, tag or commit. Default `main`; the
    /// auto-converted files are `refs/convert/parquet`.
    pub revision: String,
    /// Read an auto-converted `partial-{split}` (only the first ~5 GB of
    /// the split). Default `false`: an error that says so.
    pub allow_partial: bool,
    /// How the files are read.
    pub parquet: ParquetOptions,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            config: None,
            revision: "main".into(),
            allow_partial: false,
            parquet: ParquetOptions::default(),
        }
    }
}

/// Where [`Parquet::hub`] found a split.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HubLayout {
    /// `data/{split}-NNNNN-of-NNNNN.parquet` (`push_to_hub`).
    PushToHub,
    /// `{config}/{split}/NNNN.parquet` (`refs/convert/parquet`).
    Converted,
    /// `{config}/partial-{split}/NNNN.parquet`: the first ~5 GB only.
    Partial,
}

/// The files of one split, and their layout.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HubFiles {
    /// The Parquet files, in order.
    pub files: Vec<PathBuf>,
    /// Where they were found.
    pub layout: HubLayout,
}

/// Every file under `root` (local or a URL prefix), as paths relative to
/// it with `/`, sorted.
fn listing(root: &Path) -> Result<Vec<String>> {
    if crate::storage::is_url(root) {
        let base = crate::storage::url_of(root)
            .trim_end_matches('/')
            .to_string();
        let all = crate::storage::list_all(&base, &[".parquet"])?;
        return Ok(all
            .into_iter()
            .filter_map(|u| u.strip_prefix(&format!("{base}/")).map(String::from))
            .collect());
    }
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>, depth: usize) -> Result<()> {
        let io = |source| Error::Io {
            path: dir.to_path_buf(),
            source,
        };
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            // Links are followed (a snapshot's files link into blobs/);
            // the depth bounds a link loop.
            let path = entry.path();
            if path.is_dir() && depth < 4 {
                walk(&path, &rel, out, depth + 1)?;
            } else if path.is_file() {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, "", &mut out, 0)?;
    out.sort();
    Ok(out)
}

/// The files of `split` in the Hub folder `root` (module docs).
pub fn hub_files(root: &Path, split: &str, opts: &HubOptions) -> Result<HubFiles> {
    let bad = |reason: String| Error::Dataset {
        path: root.to_path_buf(),
        reason,
        source: None,
    };
    let all = listing(root)?;
    let parquet: Vec<&String> = all.iter().filter(|f| f.ends_with(".parquet")).collect();
    let join = |rel: &str| -> PathBuf {
        if crate::storage::is_url(root) {
            format!(
                "{}/{rel}",
                crate::storage::url_of(root).trim_end_matches('/')
            )
            .into()
        } else {
            root.join(rel)
        }
    };
    // push_to_hub: `{dir}/{split}-NNNNN-of-NNNNN[-hash].parquet`.
    let dir = opts.config.as_deref().unwrap_or("data");
    let prefix = format!("{dir}/{split}-");
    let shards: Vec<&String> = parquet
        .iter()
        .copied()
        .filter(|f| f.starts_with(&prefix) && !f[prefix.len()..].contains('/'))
        .collect();
    if !shards.is_empty() {
        let mut numbered = Vec::new();
        for f in &shards {
            let rest = &f[prefix.len()..];
            let nums: Vec<&str> = rest.trim_end_matches(".parquet").splitn(4, '-').collect();
            if let [i, "of", n, ..] = nums.as_slice() {
                if let (Ok(i), Ok(n)) = (i.parse::<usize>(), n.parse::<usize>()) {
                    numbered.push((i, n, f.as_str()));
                    continue;
                }
            }
            numbered.push((numbered.len(), 0, f.as_str()));
        }
        numbered.sort();
        if let Some(&(_, n, _)) = numbered.iter().find(|s| s.1 > 0) {
            let have: Vec<usize> = numbered.iter().map(|s| s.0).collect();
            if have != (0..n).collect::<Vec<_>>() {
                let missing: Vec<usize> = (0..n).filter(|i| !have.contains(i)).collect();
                return Err(bad(format!(
                    "split {split:?} is {n} shards ({prefix}NNNNN-of-{n:05}), and shards \
                     {missing:?} are missing (or repeated): the split would be incomplete"
                )));
            }
        }
        return Ok(HubFiles {
            files: numbered.into_iter().map(|s| join(s.2)).collect(),
            layout: HubLayout::PushToHub,
        });
    }
    // refs/convert/parquet: `{config}/{split}/NNNN.parquet`.
    let configs: Vec<&str> = {
        let mut c: Vec<&str> = parquet
            .iter()
            .filter_map(|f| {
                let parts: Vec<&str> = f.split('/').collect();
                (parts.len() == 3).then_some(parts[0])
            })
            .collect();
        c.dedup();
        c
    };
    let config = match &opts.config {
        Some(c) => c.as_str(),
        None if configs.contains(&"default") => "default",
        None if configs.len() == 1 => configs[0],
        None if configs.is_empty() => {
            return Err(bad(format!(
                "no Parquet files of split {split:?}: neither data/{split}-*.parquet nor \
                 CONFIG/{split}/*.parquet"
            )))
        }
        None => {
            return Err(bad(format!(
                "the dataset has configs {configs:?}: say which (HubOptions::config)"
            )))
        }
    };
    let in_dir = |d: &str| -> Vec<PathBuf> {
        let prefix = format!("{config}/{d}/");
        parquet
            .iter()
            .filter(|f| f.starts_with(&prefix) && !f[prefix.len()..].contains('/'))
            .map(|f| join(f))
            .collect()
    };
    let files = in_dir(split);
    if !files.is_empty() {
        return Ok(HubFiles {
            files,
            layout: HubLayout::Converted,
        });
    }
    let partial = in_dir(&format!("partial-{split}"));
    if !partial.is_empty() {
        if !opts.allow_partial {
            return Err(bad(format!(
                "split {split:?} of config {config:?} is only partly converted \
                 ({config}/partial-{split}/: the Hub's Parquet converter wrote the first ~5 GB \
                 of it): set HubOptions::allow_partial to read that part, or read the full \
                 split from the dataset's own files"
            )));
        }
        return Ok(HubFiles {
            files: partial,
            layout: HubLayout::Partial,
        });
    }
    Err(bad(format!(
        "config {config:?} has no split {split:?} (looked for {config}/{split}/ and \
         {config}/partial-{split}/)"
    )))
}

impl Parquet {
    /// Split `split` of the Hugging Face dataset in `root`: a clone, a
    /// snapshot, or a URL prefix of one (module docs for the layouts).
    pub fn hub(root: impl AsRef<Path>, split: &str, opts: &HubOptions) -> Result<Self> {
        let found = hub_files(root.as_ref(), split, opts)?;
        Self::open_with(found.files, opts.parquet.clone())
    }

    /// Split `split` of dataset `repo` (`org/name`) from the local
    /// Hugging Face hub cache, at [`HubOptions::revision`]: no network.
    pub fn from_hf_cache(repo: &str, split: &str, opts: &HubOptions) -> Result<Self> {
        let cache = hf_hub_cache().ok_or_else(|| {
            Error::InvalidConfig("no Hugging Face cache: set HF_HUB_CACHE, HF_HOME or HOME".into())
        })?;
        Self::from_hf_cache_in(&cache, repo, split, opts)
    }

    /// [`from_hf_cache`](Self::from_hf_cache) with the hub cache folder
    /// `cache` given.
    pub fn from_hf_cache_in(
        cache: &Path,
        repo: &str,
        split: &str,
        opts: &HubOptions,
    ) -> Result<Self> {
        Self::hub(cached_snapshot(cache, repo, &opts.revision)?, split, opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_and_missing_or_partial_splits() {
        let dir = tempfile::tempdir().unwrap();
        let touch = |rel: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        };
        let opts = HubOptions::default();
        touch("data/train-00000-of-00003.parquet");
        touch("data/train-00002-of-00003.parquet");
        let e = hub_files(dir.path(), "train", &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains("[1] are missing"), "{e}");
        touch("data/train-00001-of-00003.parquet");
        let f = hub_files(dir.path(), "train", &opts).unwrap();
        assert_eq!((f.files.len(), f.layout), (3, HubLayout::PushToHub));
        assert!(f.files[1].ends_with("data/train-00001-of-00003.parquet"));

        touch("default/test/0000.parquet");
        touch("default/partial-validation/0000.parquet");
        let f = hub_files(dir.path(), "test", &opts).unwrap();
        assert_eq!((f.files.len(), f.layout), (1, HubLayout::Converted));
        let e = hub_files(dir.path(), "validation", &opts)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("partial-validation") && e.contains("5 GB"),
            "{e}"
        );
        let partial = HubOptions {
            allow_partial: true,
            ..HubOptions::default()
        };
        let f = hub_files(dir.path(), "validation", &partial).unwrap();
        assert_eq!(f.layout, HubLayout::Partial);
    }
}
