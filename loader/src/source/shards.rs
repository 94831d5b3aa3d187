//! What the sharded sources (TFRecord, WebDataset tar, safetensors) share:
//! the shard table, positioned reads and the damage report.

use crate::error::{BoxError, Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// One shard of a sharded source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard file.
    pub path: PathBuf,
    /// Records in the shard (after any damaged tail was left out).
    pub records: usize,
    /// Index of the shard's first record in the source.
    pub first: usize,
}

/// A region of a shard that was left out because it is damaged; see
/// [`ShardOptions::skip_damaged`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The shard file.
    pub path: PathBuf,
    /// Byte offset where the damage starts.
    pub offset: u64,
    /// What is wrong there.
    pub reason: String,
}

/// Options every sharded source takes.
#[derive(Debug, Clone, Default)]
pub struct ShardOptions {
    /// When opening finds a shard damaged past repair (a truncated record,
    /// a record length whose checksum fails, a bad tar header), keep the
    /// records before the damage and list it in [`crate::Source::damage`]
    /// instead of failing. Default `false`: opening fails with an error
    /// naming the shard and the byte offset. A record whose payload is
    /// damaged but whose extent is known (a bad data checksum) is found
    /// when it is read and handled by [`crate::BadSamples`].
    pub skip_damaged: bool,
}

/// The shard table of a source: which shard holds global record `i`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShardSet {
    pub(crate) infos: Vec<ShardInfo>,
    pub(crate) damage: Vec<Damage>,
}

/// Shards opened at once when they are remote (each open waits on the
/// network: a HEAD request, an index pass).
const OPEN_AT_ONCE: usize = 16;

/// `open` applied to every path, results in the paths' order: one after
/// another for local files, up to [`OPEN_AT_ONCE`] at a time on threads of
/// their own when any path is a URL (opening 1,000 objects one round trip
/// after another would take minutes).
pub(crate) fn open_each<T: Send>(
    paths: &[PathBuf],
    open: impl Fn(&Path) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    if !paths.iter().any(|p| crate::storage::is_url(p)) {
        return paths.iter().map(|p| open(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Result<T>>> = paths.iter().map(|_| None).collect();
    let slots: Vec<std::sync::Mutex<&mut Option<Result<T>>>> =
        out.iter_mut().map(std::sync::Mutex::new).collect();
    std::thread::scope(|scope| {
        for _ in 0..OPEN_AT_ONCE.min(paths.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(path) = paths.get(i) else { break };
                let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open(path)))
                    .unwrap_or_else(|_| {
                        Err(shard_error(
                            path,
                            0,
                            "opening the shard panicked".to_string(),
                        ))
                    });
                **crate::lock(&slots[i]) = Some(opened);
            });
        }
    });
    drop(slots);
    out.into_iter()
        .zip(paths)
        .map(|(r, p)| r.unwrap_or_else(|| Err(shard_error(p, 0, "not opened".to_string()))))
        .collect()
}

impl ShardSet {
    /// Appends a shard of `records` records.
    pub(crate) fn push(&mut self, path: &Path, records: usize) {
        let first = self.len();
        self.infos.push(ShardInfo {
            path: path.to_path_buf(),
            records,
            first,
        });
    }

    /// Total records.
    pub(crate) fn len(&self) -> usize {
        self.infos.last().map_or(0, |s| s.first + s.records)
    }

    /// `(shard, record within the shard)` of global record `index`.
    pub(crate) fn locate(&self, index: usize) -> Result<(usize, usize)> {
        crate::source::check_index(index, self.len())?;
        let shard = self.infos.partition_point(|s| s.first + s.records <= index);
        Ok((shard, index - self.infos[shard].first))
    }

    /// The key of global record `index`: `<shard path>#<record number>`.
    pub(crate) fn key(&self, index: usize) -> String {
        match self.locate(index) {
            Ok((s, n)) => format!("{}#{n}", self.infos[s].path.display()),
            Err(_) => format!("#{index}"),
        }
    }

    /// Handles damage found while opening `path`: an error, or (skipping)
    /// a note in the damage list.
    pub(crate) fn damaged(
        &mut self,
        opts: &ShardOptions,
        path: &Path,
        offset: u64,
        cause: impl Into<Cause>,
    ) -> Result<()> {
        let e = shard_error(path, offset, cause);
        if !opts.skip_damaged {
            return Err(e);
        }
        let Error::Shard { reason, source, .. } = e else {
            unreachable!("shard_error makes a Shard error")
        };
        // The damage list is a report: the cause is kept as its text.
        let reason = match source {
            Some(s) => format!("{reason}: {}", crate::error_chain(s.as_ref())),
            None => reason,
        };
        self.damage.push(Damage {
            path: path.to_path_buf(),
            offset,
            reason,
        });
        Ok(())
    }
}

/// What is wrong with a shard at some offset: a description, and the
/// parser's or decompressor's error when there is one (kept as the
/// [`Error::Shard`]'s source, never flattened into the text).
#[derive(Debug)]
pub(crate) struct Cause {
    pub(crate) reason: String,
    pub(crate) source: Option<BoxError>,
}

impl Cause {
    /// `reason`, caused by `source`.
    pub(crate) fn new(
        reason: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            reason: reason.into(),
            source: Some(Box::new(source)),
        }
    }
}

impl From<String> for Cause {
    fn from(reason: String) -> Self {
        Self {
            reason,
            source: None,
        }
    }
}

impl From<&str> for Cause {
    fn from(reason: &str) -> Self {
        reason.to_string().into()
    }
}

/// The error for damage at `offset` of `path`.
pub(crate) fn shard_error(path: &Path, offset: u64, cause: impl Into<Cause>) -> Error {
    let Cause { reason, source } = cause.into();
    Error::Shard {
        path: path.to_path_buf(),
        offset,
        reason,
        source,
    }
}

/// Opens a shard file, naming it on failure, and returns it with its length.
pub(crate) fn open_shard(path: &Path) -> Result<(File, u64)> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    Ok((file, len))
}

/// Fills `buf` from `file` at `offset` without moving a shared cursor, so
/// decode workers read one shard concurrently.
pub(crate) fn read_exact_at(file: &File, path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
    #[cfg(unix)]
    let r = std::os::unix::fs::FileExt::read_exact_at(file, buf, offset);
    #[cfg(windows)]
    let r = {
        let mut done = 0;
        loop {
            if done == buf.len() {
                break Ok(());
            }
            match std::os::windows::fs::FileExt::seek_read(
                file,
                &mut buf[done..],
                offset + done as u64,
            ) {
                Ok(0) => break Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        }
    };
    r.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            shard_error(
                path,
                offset,
                format!("file ends inside a {}-byte record", buf.len()),
            )
        } else {
            Error::Io {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })
}

/// The shard files of `path` whose names end with one of `suffixes`: the
/// file itself, or the files in the folder `path`, sorted by name. An error
/// when there are none.
///
/// A URL (`s3://bucket/train/`) is listed the same way: the object itself,
/// a brace range (`https://host/train-{0000..0099}.tar`), or every object
/// under the prefix.
pub fn shard_paths(path: &Path, suffixes: &[&str]) -> Result<Vec<PathBuf>> {
    if crate::storage::is_url(path) {
        return crate::storage::list_urls(crate::storage::url_of(path), suffixes);
    }
    let matches = |p: &Path| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        suffixes.iter().any(|s| name.ends_with(s))
    };
    if !path.is_dir() {
        return if matches(path) {
            Ok(vec![path.to_path_buf()])
        } else {
            Err(Error::Dataset {
                path: path.to_path_buf(),
                reason: format!("not a shard file ending in {suffixes:?}"),
                source: None,
            })
        };
    }
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.is_file() && matches(&p) {
            out.push(p);
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!("no shard files ending in {suffixes:?}"),
            source: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_finds_the_shard_and_skips_empty_ones() {
        let mut s = ShardSet::default();
        s.push(Path::new("a"), 3);
        s.push(Path::new("b"), 0);
        s.push(Path::new("c"), 2);
        assert_eq!(s.len(), 5);
        assert_eq!(s.locate(0).unwrap(), (0, 0));
        assert_eq!(s.locate(2).unwrap(), (0, 2));
        assert_eq!(s.locate(3).unwrap(), (2, 0));
        assert_eq!(s.locate(4).unwrap(), (2, 1));
        assert!(s.locate(5).is_err());
    }
}
