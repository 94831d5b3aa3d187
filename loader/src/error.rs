//! The one error type of the crate.

use std::path::PathBuf;

/// A cause kept as an error's `source()`: any error type, boxed, so no
/// dependency's type is part of wick's API.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `": cause"` for a message, or nothing.
fn suffix(source: &Option<BoxError>) -> String {
    source
        .as_ref()
        .map(|e| format!(": {}", redact(&e.to_string())))
        .unwrap_or_default()
}

/// `path` as messages show it: quoted, a URL without its credentials
/// ([`redact`]).
fn shown(path: &std::path::Path) -> String {
    format!("{:?}", redact(&path.to_string_lossy()))
}

/// `text` with what a URL in it may carry as a secret replaced by `***`:
/// the user and password before a host's `@`, and a query string
/// (a presigned URL's signature, an Azure SAS token). Every message that
/// names a path or a URL shows it through this; the stores never see such
/// a URL (they refuse it), but a message may name one a user gave.
pub(crate) fn redact(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        // The authority ends at the path, or where the URL ends.
        let end = rest
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(rest.len());
        match rest[..end].rfind('@') {
            Some(userinfo) => {
                out.push_str("***");
                out.push_str(&rest[userinfo..end]);
            }
            None => out.push_str(&rest[..end]),
        }
        rest = &rest[end..];
        // A query string, up to the URL's end.
        let url_end = rest
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(rest.len());
        if let Some(q) = rest[..url_end].find('?') {
            out.push_str(&rest[..q]);
            out.push_str("?***");
            rest = &rest[url_end..];
        }
    }
    out.push_str(rest);
    out.into()
}

/// Everything that can go wrong while building a loader or producing a batch.
///
/// Each variant carries what a user needs to act on it: the file, the
/// record key, the line of a file list. The underlying cause is kept as the
/// error's `source()` and shown in its message too, so whatever prints an
/// error (a `Skipped`, an `Err` batch, the CLI) shows why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder setting is out of range; the message says what to change.
    #[error("invalid loader config: {0}")]
    InvalidConfig(String),

    /// A read that failed with a transient error every time it was tried
    /// ([`LoaderBuilder::retry`](crate::LoaderBuilder::retry)): the last
    /// error, and how many tries there were.
    #[error("after {attempts} tries: {source}")]
    Retried {
        /// Reads tried, the first one included.
        attempts: u32,
        /// The last one's error.
        #[source]
        source: Box<Error>,
    },

    /// An image's header declares more pixels, or more decoded bytes, than
    /// the loader allows: refused before anything is allocated for it.
    #[error("{key:?} is {width}x{height}: {reason}")]
    ImageTooLarge {
        /// The sample's key.
        key: String,
        /// Width its header declares.
        width: u32,
        /// Height its header declares.
        height: u32,
        /// Which limit, and how to raise it.
        reason: String,
    },

    /// A [`LoaderState`](crate::state::LoaderState) given to
    /// [`resume`](crate::LoaderBuilder::resume) was saved by a loader with
    /// another source or other settings (or another format version).
    #[error("cannot resume from this state: {}", .differences.join("; "))]
    StateMismatch {
        /// Each setting that differs, with both values.
        differences: Vec<String>,
    },

    /// A dataset (folder, file list) could not be opened or listed.
    #[error("cannot open dataset {}: {reason}{}", shown(.path), suffix(.source))]
    Dataset {
        /// The folder or file that was being opened.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// A line of a file list could not be parsed.
    #[error("file list {} line {line}: {reason}{}", shown(.path), suffix(.source))]
    FileList {
        /// The list file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong with the line.
        reason: String,
        /// The parser's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// An I/O error while listing or reading a dataset path.
    #[error("cannot read {}: {}", shown(.path), redact(&.source.to_string()))]
    Io {
        /// The file or folder that could not be read.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A shard (TFRecord, tar, safetensors) is damaged or not in the format
    /// it claims: a bad checksum, a truncated record, a header that lies.
    #[error("shard {} at byte {offset}: {reason}{}", shown(.path), suffix(.source))]
    Shard {
        /// The shard file.
        path: PathBuf,
        /// Byte offset of the damaged record or header in the shard (in the
        /// decompressed stream for a compressed shard).
        offset: u64,
        /// What is wrong there.
        reason: String,
        /// The parser's or decompressor's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// A sample's file holds no bytes.
    #[error("{key:?} is an empty file")]
    EmptyFile {
        /// The sample's key (its path for file-backed sources).
        key: String,
    },

    /// A sample's bytes are not a decodable image.
    #[error("decode failed for {key:?}: {source}")]
    Decode {
        /// The sample's key (its path for file-backed sources).
        key: String,
        /// The decoder's error.
        #[source]
        source: BoxError,
    },

    /// Resizing a decoded sample failed (for example a zero-sized image).
    #[error("transform failed for {key:?}: {reason}{}", suffix(.source))]
    Transform {
        /// The sample's key.
        key: String,
        /// What went wrong.
        reason: String,
        /// The underlying error (an encoder's), when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// A source's index is out of range.
    #[error("sample index {index} is out of range for a source of {len} samples")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The source's length.
        len: usize,
    },

    /// Code run for a sample (a source or a transform) panicked; the panic
    /// was caught on the worker and turned into this error.
    #[error("worker panicked while processing {key:?}: {message}")]
    WorkerPanic {
        /// The sample's key, or its index when the key was not known yet.
        key: String,
        /// The panic payload, when it was a string.
        message: String,
    },

    /// A loader thread could not be started.
    #[error("cannot start loader thread {name}: {source}")]
    Spawn {
        /// The thread's name.
        name: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The decode thread pool could not be built.
    #[error("cannot start the decode thread pool: {source}")]
    ThreadPool {
        /// The thread pool's error.
        #[source]
        source: BoxError,
    },

    /// A loader thread stopped before the epoch was complete. This is a bug
    /// in wick; please report it.
    #[error("loader thread stopped unexpectedly after {delivered} of {expected} batches")]
    PipelineStopped {
        /// Batches delivered before the stop.
        delivered: usize,
        /// Batches the epoch should have had.
        expected: usize,
    },

    /// A request to object storage (S3, GCS, Azure, HTTP) failed: the
    /// object or bucket is missing, access was refused, or the network or
    /// server failed (transient: [`retry`](crate::LoaderBuilder::retry)
    /// tries it again).
    #[error("cannot read {:?}: {reason}: {}", redact(.url), redact(&.source.to_string()))]
    Remote {
        /// The object's URL.
        url: String,
        /// What failed.
        reason: String,
        /// Whether trying again may succeed (a network or server error).
        transient: bool,
        /// The object store's error.
        #[source]
        source: BoxError,
    },

    /// A device operation failed: making a batch's tensors, copying them,
    /// normalizing or converting them, or setting up the upload.
    #[error("device error while {what}: {source}")]
    Device {
        /// What the loader was doing.
        what: &'static str,
        /// Candle's (or the driver's) error.
        #[source]
        source: BoxError,
    },
}

/// `Result` with wick's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
pub(crate) fn shard_error(path: &std::path::Path, offset: u64, cause: impl Into<Cause>) -> Error {
    let Cause { reason, source } = cause.into();
    Error::Shard {
        path: path.to_path_buf(),
        offset,
        reason,
        source,
    }
}

impl Error {
    /// A sample's error, as a [`Map`](crate::map::Map) reports one: an
    /// [`Error::Transform`] naming the sample's `key` and the `reason`.
    pub fn sample(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Transform {
            key: key.into(),
            reason: reason.into(),
            source: None,
        }
    }

    /// Whether the error is about one sample or record (unreadable, empty,
    /// undecodable, damaged, or the code run for it panicked): from an
    /// epoch, the batch holding it failed, and a tolerant loop can go on
    /// with the next one (or build with `BadSamples::Skip`); the loader
    /// itself is fine. (An I/O error while a source is opened is one too:
    /// there it means the dataset cannot be read.)
    pub fn is_sample_error(&self) -> bool {
        matches!(
            self,
            Error::Io { .. }
                | Error::Remote { .. }
                | Error::Shard { .. }
                | Error::EmptyFile { .. }
                | Error::Decode { .. }
                | Error::Transform { .. }
                | Error::ImageTooLarge { .. }
                | Error::Retried { .. }
                | Error::IndexOutOfRange { .. }
                | Error::WorkerPanic { .. }
        )
    }

    /// Whether the loader cannot go on: a thread could not start or
    /// stopped, or the device failed. Stop the run (and report a
    /// `PipelineStopped`: it is a bug in wick).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::Spawn { .. }
                | Error::ThreadPool { .. }
                | Error::PipelineStopped { .. }
                | Error::Device { .. }
        )
    }

    /// Whether the error is in the settings or the dataset as opened
    /// (`build` or a source's constructor): fix them and start again.
    pub fn is_config_error(&self) -> bool {
        matches!(
            self,
            Error::InvalidConfig(_)
                | Error::StateMismatch { .. }
                | Error::Dataset { .. }
                | Error::FileList { .. }
        )
    }

    /// Whether trying the same read again may succeed: somewhere in the
    /// cause chain is an I/O error that says so (interrupted, would block,
    /// timed out, a connection reset or aborted, `EIO`, `EAGAIN`, `EINTR`,
    /// `EBUSY`, `ETIMEDOUT`), not one about the data (missing, corrupt).
    ///
    /// `EIO` counts as transient on purpose. Network and FUSE file systems
    /// (NFS soft mounts, Lustre, s3fs, gcsfuse) report a lost server or a
    /// backend timeout as `EIO`, and a page-in fault of a mapped token
    /// file comes back as `EIO` too, so those are the errors
    /// [`retry`](crate::LoaderBuilder::retry) is for. On a local disk
    /// `EIO` is usually a media error that no retry cures: each read of
    /// that sample then makes `n` more tries, with their waits (at most
    /// 200 ms each), before it is bad; nothing is retried unless
    /// `retry(n)` is set.
    pub fn is_transient(&self) -> bool {
        use std::io::ErrorKind::*;
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(Error::Remote { transient, .. }) = e.downcast_ref::<Error>() {
                return *transient;
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                // A wick error carried through a reader (`io::Error::other`),
                // whose `source` skips it.
                if io
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<Error>())
                    .is_some_and(Error::is_transient)
                {
                    return true;
                }
                let transient_kind = matches!(
                    io.kind(),
                    Interrupted | WouldBlock | TimedOut | ConnectionReset | ConnectionAborted
                );
                // EINTR, EIO, EAGAIN, EBUSY, ETIMEDOUT (Linux numbering;
                // the kinds above cover them elsewhere).
                let transient_os = cfg!(target_os = "linux")
                    && matches!(io.raw_os_error(), Some(4 | 5 | 11 | 16 | 110));
                if transient_kind || transient_os {
                    return true;
                }
            }
            cur = e.source();
        }
        false
    }

    /// The key of the sample this error is about, when it is about one.
    pub fn sample_key(&self) -> Option<&str> {
        match self {
            Error::Retried { source, .. } => source.sample_key(),
            Error::EmptyFile { key }
            | Error::Decode { key, .. }
            | Error::Transform { key, .. }
            | Error::ImageTooLarge { key, .. }
            | Error::WorkerPanic { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// An error and its whole cause chain on one line, `": "`-joined
/// (`cannot read "a.jpg": No such file or directory`): what wick prints and
/// keeps in [`crate::stats::Stats`].
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = redact(&e.to_string()).into_owned();
    let mut cur = e.source();
    while let Some(c) = cur {
        // wick's errors show their cause already; others may not.
        let cause = redact(&c.to_string()).into_owned();
        if !s.ends_with(&cause) {
            s += ": ";
            s += &cause;
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_show_their_cause_once() {
        let e = Error::Io {
            path: "a.jpg".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "No such file"),
        };
        assert_eq!(e.to_string(), "cannot read \"a.jpg\": No such file");
        let e = Error::Io {
            path: "http://alice:S3CR3T@host:9/a.tar".into(),
            source: std::io::Error::other("failed on http://alice:S3CR3T@host:9/a.tar?sig=X y"),
        };
        assert_eq!(
            error_chain(&e),
            "cannot read \"http://***@host:9/a.tar\": failed on http://***@host:9/a.tar?*** y"
        );
        assert_eq!(error_chain(&e), e.to_string());
        let e = Error::Decode {
            key: "x.bmp".into(),
            source: Box::new(image::ImageError::IoError(std::io::Error::other(
                "cut short",
            ))),
        };
        assert!(e.is_sample_error() && !e.is_fatal() && !e.is_config_error());
        assert!(e.to_string().ends_with(": cut short"), "{e}");
        assert_eq!(
            error_chain(&e).matches("cut short").count(),
            1,
            "{}",
            error_chain(&e)
        );
    }
}
