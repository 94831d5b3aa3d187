//! The async side of object storage: one small tokio runtime on its own
//! threads (`wick-io`), made on first use, that runs every request while
//! the caller blocks on its result, and the TLS crypto provider.

use crate::error::{Error, Result};
use std::sync::OnceLock;

/// Threads of the I/O runtime: requests wait on the network, not the CPU.
const IO_THREADS: usize = 2;

pub(super) fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(IO_THREADS)
            .thread_name("wick-io")
            .enable_time()
            .enable_io()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::InvalidConfig(format!("cannot start the object-store I/O runtime: {e}")))
}

/// reqwest's rustls is built without a crypto provider (no C build of
/// aws-lc): installs ring's before the first client is made, unless the
/// program installed one (a program that wants rustls's post-quantum key
/// exchange installs aws-lc-rs's provider before the first remote read).
pub(super) fn crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[allow(deprecated)] // ring's provider lacks post-quantum key exchange only
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Runs `f` on the I/O runtime and waits for it.
pub(crate) fn block_on<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T> {
    let rt = runtime()?;
    // From inside a runtime (a user's async code calling the loader),
    // `block_on` would panic: run the future on the I/O threads instead.
    let (tx, rx) = crossbeam_channel::bounded(1);
    rt.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .map_err(|_| Error::InvalidConfig("the object-store I/O runtime stopped".into()))
}
