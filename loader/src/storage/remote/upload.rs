//! Writing objects: one PUT, or a multipart upload aborted on failure.

use super::runtime::block_on;
use super::stores::{remote_error, store};
use crate::error::{Error, Result};
use object_store::{ObjectStoreExt, WriteMultipart};

/// Bytes over which an upload goes in parts (S3 multipart and the like).
const ONE_PUT: u64 = 32 << 20;

/// Writes the local file `local` as the object `url`: one PUT, or a
/// multipart upload of 16 MiB parts (4 in flight) for a larger file.
pub(crate) fn upload(local: &std::path::Path, url: &str) -> Result<()> {
    upload_in(local, url, (ONE_PUT, 16 << 20))
}

/// File work of an upload, run off the I/O threads: bytes read, and the
/// file to read on from.
type FileJob = Box<dyn FnOnce() -> std::io::Result<(Vec<u8>, Option<std::fs::File>)> + Send>;

/// [`upload()`] with the one-PUT limit and the part size given. A failed
/// multipart upload is aborted, so no parts are left behind (and billed).
pub(super) fn upload_in(
    local: &std::path::Path,
    url: &str,
    (one_put, part): (u64, usize),
) -> Result<()> {
    let (store, path) = store(url)?;
    let (local, owned_url) = (local.to_path_buf(), url.to_string());
    block_on(async move {
        let io = |source| Error::Io {
            path: local.clone(),
            source,
        };
        let failed = |e| remote_error(&owned_url, "cannot write the object", e);
        // File reads run off the I/O threads, which every request shares.
        let blocking = |f: FileJob| async move {
            tokio::task::spawn_blocking(f)
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
        };
        let len = std::fs::metadata(&local).map_err(io)?.len();
        if len <= one_put {
            let l = local.clone();
            let (bytes, _) = blocking(Box::new(move || Ok((std::fs::read(l)?, None))))
                .await
                .map_err(io)?;
            store.put(&path, bytes.into()).await.map_err(failed)?;
            return Ok(());
        }
        let parts = store.put_multipart(&path).await.map_err(failed)?;
        let mut w = WriteMultipart::new_with_chunk_size(parts, part);
        let mut file = Some(std::fs::File::open(&local).map_err(io)?);
        let size = part.div_ceil(2);
        let written: Result<()> = async {
            loop {
                let mut f = file.take();
                let (buf, f) = blocking(Box::new(move || {
                    let mut buf = vec![0; size];
                    let n = match &mut f {
                        Some(f) => std::io::Read::read(f, &mut buf)?,
                        None => 0,
                    };
                    buf.truncate(n);
                    Ok((buf, f))
                }))
                .await
                .map_err(io)?;
                file = f;
                if buf.is_empty() {
                    return Ok(());
                }
                w.wait_for_capacity(4).await.map_err(failed)?;
                w.write(&buf);
            }
        }
        .await;
        match written {
            Ok(()) => w.finish().await.map_err(failed).map(drop),
            Err(e) => {
                let _ = w.abort().await;
                Err(e)
            }
        }
    })?
}
