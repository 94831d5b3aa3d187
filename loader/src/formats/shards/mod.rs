//! What the sharded sources (TFRecord, WebDataset tar, safetensors) share:
//! the shard table, positioned reads and the damage report.

pub(crate) mod manifest;
pub(crate) mod safetensors;
pub(crate) mod tfrecord;
pub(crate) mod webdataset;
pub(crate) mod webdataset_index;

pub use safetensors::SafetensorsShards;
pub use tfrecord::{Compression, TfRecord, TfRecordOptions};
pub use webdataset::{WebDataset, WebDatasetOptions};

use crate::contract::{check_index, Damage, ShardInfo};
use crate::error::{shard_error, Cause, Error, Result};
use std::path::{Path, PathBuf};

/// The shard paths a sharded source's `open` was given, in order.
pub(crate) fn owned(paths: impl IntoIterator<Item = impl AsRef<Path>>) -> Vec<PathBuf> {
    paths
        .into_iter()
        .map(|p| p.as_ref().to_path_buf())
        .collect()
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

/// `open` applied to every path, results in the paths' order, on threads
/// of their own: up to [`OPEN_AT_ONCE`] at a time when any path is a URL
/// (opening 1,000 objects one round trip after another would take
/// minutes), else one per core (a local index pass is CPU work: 13 µs a
/// WebDataset sample, 1.5 h a rank for LAION-400M one shard after another).
pub(crate) fn open_each<T: Send>(
    paths: &[PathBuf],
    open: impl Fn(&Path) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    // Each local shard stays open: more than the usual soft limit of
    // 1,024 files need the hard limit.
    crate::storage::local::raise_open_files_limit();
    let at_once = if paths.iter().any(|p| crate::storage::is_url(p)) {
        OPEN_AT_ONCE
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    if at_once <= 1 || paths.len() <= 1 {
        return paths.iter().map(|p| open(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Result<T>>> = paths.iter().map(|_| None).collect();
    let slots: Vec<std::sync::Mutex<&mut Option<Result<T>>>> =
        out.iter_mut().map(std::sync::Mutex::new).collect();
    std::thread::scope(|scope| {
        for _ in 0..at_once.min(paths.len()) {
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
                **crate::sync::lock(&slots[i]) = Some(opened);
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
        check_index(index, self.len())?;
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

    /// Appends shard `path` as a manifest lists it (`listed`), with the
    /// damage its index pass left out handled as `opts` says (an error,
    /// or skipped and noted); returns its record count.
    pub(crate) fn push_listed(
        &mut self,
        opts: &ShardOptions,
        path: &Path,
        listed: &manifest::Listed,
    ) -> Result<usize> {
        for (offset, reason) in &listed.damage {
            self.damaged(opts, path, *offset, reason.clone())?;
        }
        let records = listed.records as usize;
        self.push(path, records);
        Ok(records)
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
            Some(s) => format!("{reason}: {}", crate::error::error_chain(s.as_ref())),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Opened at once, finishing in any order: the results are in the
    /// paths' order, and a panic in one open is that path's error.
    #[test]
    fn opens_at_once_keep_the_paths_order() {
        let paths: Vec<PathBuf> = (0..40).map(|i| PathBuf::from(format!("s{i}"))).collect();
        let got = open_each(&paths, |p| {
            let i: u64 = p.to_str().unwrap()[1..].parse().unwrap();
            std::thread::sleep(std::time::Duration::from_millis((i * 7) % 5));
            if i == 13 {
                panic!("a broken shard");
            }
            Ok(i)
        });
        for (i, r) in got.into_iter().enumerate() {
            match r {
                Ok(v) => assert_eq!(v, i as u64),
                Err(e) => assert!(i == 13 && e.to_string().contains("s13"), "{e}"),
            }
        }
    }

    /// More local shards than the limit on open files open and read:
    /// the soft limit is raised to the hard one, and past the budget the
    /// least recently read shard files are closed and opened again when
    /// read. In a child process (the limits are the process's) whose soft
    /// and hard limits are both 1,024, 1,500 WebDataset shards open and
    /// every sample reads, twice over; a shard replaced while
    /// its file was closed is an error naming it.
    #[cfg(target_os = "linux")]
    #[test]
    fn more_shards_than_the_hard_limit_on_open_files_open_and_read() {
        const NAME: &str =
            "formats::shards::tests::more_shards_than_the_hard_limit_on_open_files_open_and_read";
        const SHARDS: usize = 1_500;
        if std::env::var_os("WICK_NOFILE_CHILD").is_some() {
            let limit = libc::rlimit {
                rlim_cur: 1_024,
                rlim_max: 1_024,
            };
            // SAFETY: setrlimit reads one rlimit, on this stack frame.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
            use crate::contract::Source;
            use crate::write::{ShardSample, ShardWriter, WebDatasetWriter};
            let dir = tempfile::tempdir().unwrap();
            let write = |path: &Path, byte: u8, label: u32| {
                let mut w = WebDatasetWriter::create(path).unwrap();
                let sample = ShardSample {
                    key: "k",
                    ext: "jpg",
                    bytes: &[byte, 2, 3],
                    label,
                };
                w.write(sample).unwrap();
                w.finish().unwrap();
            };
            let paths: Vec<PathBuf> = (0..SHARDS)
                .map(|i| {
                    let path = dir.path().join(format!("s-{i:05}.tar"));
                    write(&path, 1, (i % 7) as u32);
                    path
                })
                .collect();
            let source = WebDataset::open(&paths).unwrap();
            assert_eq!(source.len(), SHARDS);
            for i in (0..SHARDS).chain(0..SHARDS) {
                let r = source.read(i).unwrap();
                assert_eq!((r.label, r.bytes[0]), ((i % 7) as u32, 1), "sample {i}");
            }
            // Shard 0 was read long ago: its file is closed. Replaced (a
            // new file under its name), it is refused, never read.
            let replaced = &paths[0];
            std::fs::remove_file(replaced).unwrap();
            write(replaced, 9, 0);
            let e = source.read(0).unwrap_err().to_string();
            assert!(e.contains("s-00000.tar") && e.contains("changed"), "{e}");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads=1", "--nocapture"])
            .env("WICK_NOFILE_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "the child failed: {text}\n{err}"
        );
    }

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
