//! The bad-samples log ("quarantine"): one JSON line per bad sample,
//! written so that kills, restarts and several writers leave a file every
//! line of which parses.

use crate::error::{Error, Result};
use std::sync::Mutex;

/// Lines one loader writes to its bad-samples log at most, and keys it
/// takes from the file at open at most: past it, one summary line and no
/// more.
const QUARANTINE_LIMIT: usize = 10_000;

/// The quarantine file ([`LoaderBuilder::bad_samples_log`](crate::LoaderBuilder::bad_samples_log)): one JSON
/// line per bad sample, each key once however many epochs meet it, and
/// once across runs: the keys the file lists when it is opened are not
/// listed again (deduplicated by key, whatever the reason: a key's reason
/// can change from run to run, a transient one from try to try, and the
/// list is of samples to fix).
///
/// Each line goes out as one `write` to a file opened for appending, which
/// Linux makes atomic with respect to other appenders to a local file: a
/// kill leaves no line cut short, and loaders or processes given the same
/// path (a train and a val loader, data-parallel ranks) never mix inside a
/// line. A line cut short before (by a kill of an older version, a full
/// disk) stays a line of its own. Bounded: a loader writes at most
/// [`QUARANTINE_LIMIT`] lines, then one `{"truncated": true, "limit": ...}`
/// line, then none; it keeps at most that many keys from the file and
/// that many of its own.
#[derive(Debug)]
pub(super) struct Quarantine {
    path: std::path::PathBuf,
    listed: Mutex<Listed>,
}

/// What a [`Quarantine`] has written, under its lock.
#[derive(Debug)]
struct Listed {
    file: std::fs::File,
    /// The keys listed: those in the file at open, and those written.
    seen: std::collections::HashSet<String>,
    /// Lines this loader wrote.
    written: usize,
    /// Whether the summary line is written: nothing more is.
    capped: bool,
    /// Whether a write failed (said once).
    failed: bool,
}

/// A line of the log, as far as the keys go (others have no key).
#[derive(serde::Deserialize)]
struct Entry {
    key: String,
}

impl Quarantine {
    /// Opens `path` for appending (created if missing), ends a line cut
    /// short at its end, and takes the keys it lists.
    pub(super) fn open(path: &std::path::Path) -> Result<Self> {
        use std::io::Write;
        let failed = |e: std::io::Error| Error::Dataset {
            path: path.into(),
            reason: "cannot open the bad-samples log".into(),
            source: Some(Box::new(e)),
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(failed)?;
        // Not a pipe or a terminal (`/dev/stderr`): reading one would wait
        // for input, or take the reader's.
        let regular = file.metadata().map_err(failed)?.is_file();
        let (seen, cut) = match regular {
            true => Self::listed(path).map_err(failed)?,
            false => Default::default(),
        };
        if cut {
            file.write_all(b"\n").map_err(failed)?;
        }
        Ok(Self {
            path: path.into(),
            listed: Mutex::new(Listed {
                file,
                seen,
                written: 0,
                capped: false,
                failed: false,
            }),
        })
    }

    /// The keys the log lists (the first [`QUARANTINE_LIMIT`]; a line that
    /// is not an entry is passed over), and whether its last line is cut
    /// short (no `\n` at the end).
    fn listed(
        path: &std::path::Path,
    ) -> std::io::Result<(std::collections::HashSet<String>, bool)> {
        use std::io::{BufRead, Read, Seek, SeekFrom};
        let file = &mut std::fs::File::open(path)?;
        let mut cut = false;
        if file.metadata()?.len() > 0 {
            let mut last = [0u8];
            file.seek(SeekFrom::End(-1))?;
            file.read_exact(&mut last)?;
            cut = last[0] != b'\n';
            file.seek(SeekFrom::Start(0))?;
        }
        let mut seen = std::collections::HashSet::new();
        let mut lines = std::io::BufReader::new(file).split(b'\n');
        while seen.len() < QUARANTINE_LIMIT {
            let Some(line) = lines.next() else { break };
            if let Ok(entry) = serde_json::from_slice::<Entry>(&line?) {
                seen.insert(entry.key);
            }
        }
        Ok((seen, cut))
    }

    /// Lists sample `key` (source index `index`, met in `epoch`) with
    /// `error`'s whole cause chain, unless it is listed already or the
    /// log is full. A failed write is said once on stderr: the log is a
    /// report, and the batch goes on as the policy says.
    pub(super) fn log(&self, key: &str, epoch: u64, index: usize, error: &Error) {
        use std::io::Write;
        let mut guard = crate::sync::lock(&self.listed);
        let listed = &mut *guard;
        if listed.capped || listed.seen.contains(key) {
            return;
        }
        let pid = std::process::id();
        let line = if listed.written < QUARANTINE_LIMIT {
            listed.seen.insert(key.to_owned());
            listed.written += 1;
            serde_json::json!({
                "key": key,
                "reason": crate::error::error_chain(error),
                "epoch": epoch,
                "index": index,
                "pid": pid,
            })
        } else {
            listed.capped = true;
            listed.seen = Default::default();
            serde_json::json!({
                "truncated": true,
                "limit": QUARANTINE_LIMIT,
                "epoch": epoch,
                "pid": pid,
            })
        };
        // One write a line: a line is never cut or mixed with another
        // writer's (see the type's docs).
        let mut text = line.to_string();
        text.push('\n');
        if let Err(e) = listed.file.write_all(text.as_bytes()) {
            if !std::mem::replace(&mut listed.failed, true) {
                eprintln!(
                    "wick: cannot write the bad-samples log {}: {e}",
                    self.path.display()
                );
            }
        }
    }
}
