//! Page-locked host batch buffers: allocated once, written by the decode
//! workers, read by the copy stream, and never rewritten before that copy
//! is done ([`Guard::Pinned`]). One allocation per batch buffer holds every
//! field's region at its packed offset ([`Schema`]), 256-byte aligned.

use super::{Event, On};
use crate::device::ring::{Guard, Guards};
use crate::device::HostBuf;
use crate::error::{Error, Result};
use crate::fields::Schema;
use candle_core::cuda::cudarc::driver::PinnedHostSlice;
use candle_core::CudaDevice;

/// A page-locked host batch buffer of every field's region.
#[derive(Debug)]
pub(crate) struct Pinned {
    pub(super) bytes: PinnedHostSlice<u8>,
    /// Recorded on the copy stream after the last copy out of this buffer.
    pub(super) copied: Option<Event>,
    pub(super) guard: bool,
}

impl Pinned {
    /// The bytes, once the last copy out of the buffer has completed.
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.wait_writable()?;
        // cudarc's own event of the slice is never recorded after the
        // allocation (the loader copies through raw pointers): no wait here.
        self.bytes
            .as_mut_slice()
            .on("waiting for a copy out of a pinned buffer")
    }

    /// Blocks until the last copy out of the buffer has completed
    /// ([`Guard::Pinned`]).
    pub(crate) fn wait_writable(&mut self) -> Result<()> {
        if let (true, Some(e)) = (self.guard, &self.copied) {
            e.synchronize()
                .on("waiting for a copy out of a pinned buffer")?;
        }
        Ok(())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // cuMemFreeHost must not run under a copy still reading the buffer.
        if let Some(e) = &self.copied {
            let _ = e.synchronize();
        }
    }
}

/// Allocates one zeroed page-locked host batch buffer of `bytes` (a
/// schema's packed size).
pub(crate) fn pinned_buffer(dev: &CudaDevice, bytes: usize, guards: Guards) -> Result<HostBuf> {
    let ctx = dev.cuda_stream().context().clone();
    // SAFETY: flags 0 is plain page-locked memory (not write-combined, so
    // the CPU can also read it fast). The memory is uninitialized; it is
    // zeroed right below, before any reference to it exists.
    let mut slice = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) }
        .on("allocating page-locked host memory")?;
    let p = slice
        .as_mut_ptr()
        .on("allocating page-locked host memory")?;
    // SAFETY: `p` points to `bytes.max(1)` bytes just allocated and not yet
    // shared.
    unsafe { std::ptr::write_bytes(p, 0, bytes.max(1)) };
    Ok(HostBuf::Pinned(Pinned {
        bytes: slice,
        copied: None,
        guard: guards.on(Guard::Pinned),
    }))
}

/// A host buffer as the copy sees it: its base address and, per field,
/// the byte offset and the bytes the batch's samples fill.
#[derive(Debug, Clone)]
pub(crate) struct HostRef {
    pub(super) base: *const u8,
    pub(super) regions: Vec<(usize, usize)>,
}

/// The copy's view of the first `n` samples of every field of `p`.
pub(super) fn host_ref(p: &mut Pinned, n: usize, schema: &Schema) -> Result<HostRef> {
    let bytes = p.as_mut_slice()?;
    if n > schema.batch || bytes.len() < schema.packed_bytes {
        return Err(Error::InvalidConfig(format!(
            "a batch of {n} in a pinned buffer of {} bytes laid out for {} samples in {}",
            bytes.len(),
            schema.batch,
            schema.packed_bytes
        )));
    }
    Ok(HostRef {
        base: bytes.as_ptr(),
        regions: schema
            .fields
            .iter()
            .map(|f| (f.offset, n * f.sample_bytes))
            .collect(),
    })
}
