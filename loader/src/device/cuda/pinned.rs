//! Page-locked host batch buffers: allocated once, written by the decode
//! workers, read by the copy stream, and never rewritten before that copy
//! is done ([`Guard::Pinned`]).

use super::{Event, On};
use crate::device::ring::{Guard, Guards};
use crate::device::HostBuf;
use crate::error::{Error, Result};
use crate::layout::HostLayout;
use candle_core::cuda::cudarc::driver::{PinnedHostSlice, ValidAsZeroBits};
use candle_core::CudaDevice;

/// A page-locked host batch buffer of `T` with room for the batch's labels.
#[derive(Debug)]
pub(crate) struct Pinned<T> {
    pub(super) images: PinnedHostSlice<T>,
    pub(super) labels: PinnedHostSlice<u32>,
    /// Recorded on the copy stream after the last copy out of this buffer.
    pub(super) copied: Option<Event>,
    pub(super) guard: bool,
}

impl<T: ValidAsZeroBits> Pinned<T> {
    /// The elements, once the last copy out of the buffer has completed.
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait_writable()?;
        // cudarc's own event of the slice is never recorded after the
        // allocation (the loader copies through raw pointers): no wait here.
        self.images
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

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        // cuMemFreeHost must not run under a copy still reading the buffer.
        if let Some(e) = &self.copied {
            let _ = e.synchronize();
        }
    }
}

/// Allocates one zeroed page-locked `T` buffer of `elems` plus `labels` u32.
pub(super) fn pinned<T: candle_core::cuda::cudarc::driver::DeviceRepr + ValidAsZeroBits>(
    dev: &CudaDevice,
    elems: usize,
    labels: usize,
    guard: bool,
) -> Result<Pinned<T>> {
    let ctx = dev.cuda_stream().context().clone();
    // SAFETY: flags 0 is plain page-locked memory (not write-combined, so
    // the CPU can also read it fast). The memory is uninitialized; it is
    // zeroed right below, before any reference to it exists.
    let mut images = unsafe { ctx.alloc_pinned_with_flags::<T>(elems, 0) }
        .on("allocating page-locked host memory")?;
    // SAFETY: as above, for the labels.
    let mut label_buf = unsafe { ctx.alloc_pinned_with_flags::<u32>(labels.max(1), 0) }
        .on("allocating page-locked host memory")?;
    let p = images
        .as_mut_ptr()
        .on("allocating page-locked host memory")?;
    // SAFETY: `p` points to `elems` elements just allocated and not yet
    // shared; all-zero bits are a valid `T` (`ValidAsZeroBits`).
    unsafe { std::ptr::write_bytes(p, 0, elems) };
    let l = label_buf
        .as_mut_ptr()
        .on("allocating page-locked host memory")?;
    // SAFETY: as above, `labels.max(1)` u32.
    unsafe { std::ptr::write_bytes(l, 0, labels.max(1)) };
    Ok(Pinned {
        images,
        labels: label_buf,
        copied: None,
        guard,
    })
}

/// Allocates one pinned host batch buffer for `output`: `elems` image
/// elements and room for `labels` labels.
pub(crate) fn pinned_buffer(
    dev: &CudaDevice,
    elems: usize,
    labels: usize,
    output: HostLayout,
    guards: Guards,
) -> Result<HostBuf> {
    let guard = guards.on(Guard::Pinned);
    Ok(match output {
        HostLayout::U8Nhwc => HostBuf::PinnedU8(pinned::<u8>(dev, elems, labels, guard)?),
        HostLayout::F32Nchw { .. } => HostBuf::PinnedF32(pinned::<f32>(dev, elems, labels, guard)?),
    })
}

/// A host buffer as the copy sees it: raw addresses and sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostRef {
    pub(super) images: *const u8,
    pub(super) image_bytes: usize,
    pub(super) labels: *const u32,
    pub(super) label_count: usize,
}

/// Writes the labels into `p`'s label region and returns the copy's view
/// of the first `len` image elements and the labels.
pub(super) fn host_ref<T: ValidAsZeroBits>(
    p: &mut Pinned<T>,
    labels: &[u32],
    len: usize,
) -> Result<HostRef> {
    p.wait_writable()?;
    let room = p.labels.as_mut_slice().on("reading a pinned buffer")?;
    let capacity = room.len();
    let room = room.get_mut(..labels.len()).ok_or_else(|| {
        Error::InvalidConfig(format!("{} labels for a batch of {capacity}", labels.len()))
    })?;
    room.copy_from_slice(labels);
    let images = p.images.as_mut_slice().on("reading a pinned buffer")?;
    if len > images.len() {
        return Err(Error::InvalidConfig(format!(
            "batch of {len} elements in a buffer of {}",
            images.len()
        )));
    }
    Ok(HostRef {
        images: images.as_ptr().cast(),
        image_bytes: len * std::mem::size_of::<T>(),
        labels: p
            .labels
            .as_mut_slice()
            .on("reading a pinned buffer")?
            .as_ptr(),
        label_count: labels.len(),
    })
}
