//! How the loader retries reads that fail with a transient error: the
//! policy ([`Retry`]), the loop ([`retrying`], [`read_retrying`]) and its
//! waits, for the workers, the read-ahead and the shard streams alike.

use crate::contract::{Parts, Record, Source};
use crate::error::{Error, Result};

/// How the loader retries reads that fail with a transient error
/// ([`Error::is_transient`]) in the streaming mode: see [`read_retrying`].
#[derive(Clone)]
pub(crate) struct Retry {
    pub(crate) retries: u32,
    pub(crate) cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(crate) on_retry: std::sync::Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Retry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retry")
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// `source.read_parts(index, parts, bytes)`, tried up to `retries` more
/// times while it fails with a transient error ([`Error::is_transient`]),
/// waiting as [`retry_wait`] says, calling `on_retry` for each retry. An
/// error after retries says how many tries there were ([`Error::Retried`]).
/// Once `cancel` is set (the epoch is dropped) no more tries are made: the
/// last error comes back at once (the sample is not delivered, so what it
/// says matters to no one, and a read that keeps failing may take seconds
/// a try).
pub(crate) fn read_retrying(
    source: &dyn Source,
    (index, parts, bytes): (usize, &Parts, Vec<u8>),
    retries: u32,
    cancel: &std::sync::atomic::AtomicBool,
    on_retry: &dyn Fn(),
) -> Result<Record> {
    let mut bytes = Some(bytes);
    retrying(retries, cancel, on_retry, || {
        source.read_parts(index, parts, bytes.take().unwrap_or_default())
    })
}

/// Runs `attempt` until it succeeds, fails with an error that is not
/// transient, was tried `retries` more times, or `cancel` is set: waiting
/// as [`retry_wait`] says and calling `on_retry` before each retry. The
/// error after more than one try says how many ([`Error::Retried`]). A
/// source's reads ([`read_retrying`]) and a map's run are retried so.
pub(crate) fn retrying<T>(
    retries: u32,
    cancel: &std::sync::atomic::AtomicBool,
    on_retry: &dyn Fn(),
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    use std::sync::atomic::Ordering;
    let mut result = attempt();
    let mut attempts = 1;
    while let Err(e) = &result {
        if attempts > retries || !e.is_transient() {
            break;
        }
        retry_wait(attempts, cancel);
        if cancel.load(Ordering::Relaxed) {
            break;
        }
        on_retry();
        attempts += 1;
        result = attempt();
    }
    result.map_err(|e| tried(e, attempts))
}

/// The longest wait between two tries of a read.
const RETRY_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(200);

/// The wait before retry number `attempts` of a read: 10, 20, 40, 80,
/// 160, then 200 ms ([`RETRY_WAIT_MAX`]).
fn retry_delay(attempts: u32) -> std::time::Duration {
    let doubled = 10u64 << attempts.saturating_sub(1).min(5);
    std::time::Duration::from_millis(doubled).min(RETRY_WAIT_MAX)
}

/// Waits before retry number `attempts` of a read as [`retry_delay`]
/// says, cut short by `cancel`.
pub(crate) fn retry_wait(attempts: u32, cancel: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let until = Instant::now() + retry_delay(attempts);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if cancel.load(Ordering::Relaxed) || left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(2)));
    }
}

/// A read's error after `attempts` tries: [`Error::Retried`] when there
/// was more than one.
pub(crate) fn tried(e: Error, attempts: u32) -> Error {
    match attempts {
        0 | 1 => e,
        attempts => Error::Retried {
            attempts,
            source: Box::new(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waits double from 10 ms up to the documented 200 ms.
    #[test]
    fn retry_waits_double_up_to_200_ms() {
        let waits: Vec<u128> = (1..=8).map(|a| retry_delay(a).as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 200, 200, 200]);
    }
}
