//! Local files: whole sample files, shard files and positioned reads, and
//! the shard files of a folder or a prefix.

use crate::error::{shard_error, Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Largest sample file a file-backed source reads (512 MiB): a larger one
/// is an error rather than an allocation of its size.
pub(crate) const MAX_FILE_BYTES: u64 = 512 << 20;

/// Reads a whole sample file into `bytes` (cleared first; its capacity is
/// reused), naming the file on failure.
pub(crate) fn read_file_into(path: &Path, mut bytes: Vec<u8>) -> Result<Vec<u8>> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_FILE_BYTES {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!("sample file is {len} bytes, over the {MAX_FILE_BYTES}-byte limit"),
            source: None,
        });
    }
    bytes.clear();
    bytes.reserve(len as usize);
    // `take` bounds the read even if the file grows after the size check.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&mut file, MAX_FILE_BYTES + 1),
        &mut bytes,
    )
    .map_err(io)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            reason: format!("sample file grew over the {MAX_FILE_BYTES}-byte limit while read"),
            source: None,
        });
    }
    if bytes.is_empty() {
        return Err(Error::EmptyFile {
            key: path.display().to_string(),
        });
    }
    Ok(bytes)
}

/// Raises this process's soft limit on open files to its hard limit, once
/// (Linux). A sharded source holds a file open for each local shard, and
/// the soft limit most shells and services start with, 1,024, ended an
/// open of more shards with "Too many open files"; the hard limit is
/// mostly far higher (524,288 or more on Linux distributions and in
/// containers), and raising the soft one needs no privilege. Python's
/// data loaders do the same for the same reason. A hard limit of 1,024
/// still stops at about 1,000 local shards.
pub(crate) fn raise_open_files_limit() {
    #[cfg(target_os = "linux")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: getrlimit and setrlimit read and write one rlimit,
            // a plain struct on this stack frame.
            unsafe {
                let mut limit: libc::rlimit = std::mem::zeroed();
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
                    && limit.rlim_cur < limit.rlim_max
                {
                    limit.rlim_cur = limit.rlim_max;
                    libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                }
            }
        });
    }
}

/// A local shard file for positioned reads, held open while few files
/// are: past [`open_files_budget`] open ones, the least recently read are
/// closed, and each is opened again at its next read, checked to be the
/// same file (device, inode, size and modification time), so that 41,000
/// local shards read under a hard limit of 1,024 open files. A file
/// replaced or changed while closed is an error naming it, never its new
/// bytes at the old offsets.
#[derive(Debug, Clone)]
pub(crate) struct LocalFile(Arc<Held>);

#[derive(Debug)]
struct Held {
    path: PathBuf,
    same: Identity,
    file: Mutex<Option<Arc<File>>>,
    /// [`CLOCK`] at its last read.
    used: AtomicU64,
}

/// What says a reopened path is still the file first opened.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    #[cfg(unix)]
    dev_ino: (u64, u64),
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Identity {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            #[cfg(unix)]
            dev_ino: {
                use std::os::unix::fs::MetadataExt;
                (meta.dev(), meta.ino())
            },
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

/// Reads of held files so far: their last-use stamps.
static CLOCK: AtomicU64 = AtomicU64::new(0);

/// The held files that are open (some entries may have closed since).
static OPEN: Mutex<Vec<Weak<Held>>> = Mutex::new(Vec::new());

/// Local shard files held open at most: three quarters of the soft limit
/// on open files (after [`raise_open_files_limit`]) less 64, at least 64,
/// leaving the rest to sockets, sample files and the user's own.
pub(crate) fn open_files_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        raise_open_files_limit();
        #[cfg(target_os = "linux")]
        {
            // SAFETY: getrlimit writes one rlimit, on this stack frame.
            let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
                let soft = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
                return (soft / 4 * 3).saturating_sub(64).max(64);
            }
        }
        4_096
    })
}

impl LocalFile {
    /// Opens `path`, naming it on failure, and returns it with its length.
    pub(crate) fn open(path: &Path) -> Result<(Self, u64)> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let held = Arc::new(Held {
            path: path.to_path_buf(),
            same: Identity::of(&meta),
            file: Mutex::new(None),
            used: AtomicU64::new(CLOCK.fetch_add(1, Ordering::Relaxed)),
        });
        hold(&held, Arc::new(file));
        Ok((Self(held), meta.len()))
    }

    /// The open file: held, or opened again and checked to be the same.
    pub(crate) fn file(&self) -> Result<Arc<File>> {
        let held = &self.0;
        held.used
            .store(CLOCK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        if let Some(file) = crate::sync::lock(&held.file).clone() {
            return Ok(file);
        }
        let io = |source| Error::Io {
            path: held.path.clone(),
            source,
        };
        let file = File::open(&held.path).map_err(io)?;
        if Identity::of(&file.metadata().map_err(io)?) != held.same {
            return Err(Error::Dataset {
                path: held.path.clone(),
                reason: "the file changed since the dataset was opened (another file, size or \
                         modification time): open the dataset again"
                    .into(),
                source: None,
            });
        }
        let file = Arc::new(file);
        hold(held, file.clone());
        Ok(file)
    }
}

/// Keeps `file` open in `held`, closing the least recently read held
/// files (a quarter of the budget at once) when over the budget.
fn hold(held: &Arc<Held>, file: Arc<File>) {
    let budget = open_files_budget();
    let mut open = crate::sync::lock(&OPEN);
    if open.len() >= budget {
        let mut live: Vec<(u64, Arc<Held>)> = open
            .drain(..)
            .filter_map(|w| w.upgrade())
            .filter(|h| crate::sync::lock(&h.file).is_some())
            .map(|h| (h.used.load(Ordering::Relaxed), h))
            .collect();
        if live.len() >= budget {
            live.sort_unstable_by_key(|(used, _)| *used);
            let close = live.len() + 1 - budget + budget / 4;
            for (_, h) in live.drain(..close.min(live.len())) {
                // Reads under way keep their `Arc<File>`; it closes after them.
                *crate::sync::lock(&h.file) = None;
            }
        }
        open.extend(live.iter().map(|(_, h)| Arc::downgrade(h)));
    }
    *crate::sync::lock(&held.file) = Some(file);
    open.push(Arc::downgrade(held));
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
