//! Host batch buffers: what kind of memory a batch is filled in (ordinary
//! heap memory, or page-locked memory the CUDA copy stream reads), decided
//! here by the device, so the pool and the pipeline never ask.

use super::cuda::Pinned;
use crate::error::Result;
use crate::layout::{HostLayout, Slot};

/// The storage of one batch's images.
#[derive(Debug)]
pub(crate) enum HostBuf {
    U8(Vec<u8>),
    F32(Vec<f32>),
    /// Page-locked memory for asynchronous copies to a CUDA device (an
    /// uninhabited stub without the `cuda` feature).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    PinnedU8(Pinned<u8>),
    /// As `PinnedU8`, for float output.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    PinnedF32(Pinned<f32>),
}

/// A buffer's elements, borrowed for writing.
enum View<'a> {
    U8(&'a mut [u8]),
    F32(&'a mut [f32]),
}

impl HostBuf {
    /// The elements; for a pinned buffer this first waits until the copy
    /// that last read it has completed.
    fn view(&mut self) -> Result<View<'_>> {
        Ok(match self {
            HostBuf::U8(v) => View::U8(v),
            HostBuf::F32(v) => View::F32(v),
            HostBuf::PinnedU8(p) => View::U8(p.as_mut_slice()?),
            HostBuf::PinnedF32(p) => View::F32(p.as_mut_slice()?),
        })
    }

    /// Waits until the buffer may be written (a pinned buffer's last copy
    /// to the device has completed). Called by the feeder, so decode workers
    /// never block on the device.
    pub(crate) fn wait_writable(&mut self) -> Result<()> {
        self.view().map(|_| ())
    }

    /// The first `n` slots, one per sample, for parallel filling.
    pub(crate) fn slots(&mut self, n: usize, slot_len: usize) -> Result<Vec<Slot<'_>>> {
        Ok(match self.view()? {
            View::U8(v) => v[..n * slot_len]
                .chunks_exact_mut(slot_len)
                .map(Slot::U8)
                .collect(),
            View::F32(v) => v[..n * slot_len]
                .chunks_exact_mut(slot_len)
                .map(Slot::F32)
                .collect(),
        })
    }

    /// Moves slot `from` to slot `to` (`to < from`), closing a gap left by a
    /// skipped sample.
    pub(crate) fn move_slot(&mut self, from: usize, to: usize, slot_len: usize) -> Result<()> {
        let src = from * slot_len..(from + 1) * slot_len;
        match self.view()? {
            View::U8(v) => v.copy_within(src, to * slot_len),
            View::F32(v) => v.copy_within(src, to * slot_len),
        }
        Ok(())
    }
}

/// Asks the kernel to back the 2 MiB-aligned part of `v` with transparent
/// huge pages (Linux; a no-op elsewhere or when THP is off).
fn advise_huge_pages<T>(v: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(v);
        let first = start.next_multiple_of(HUGE);
        let last = end & !(HUGE - 1);
        if last > first {
            // SAFETY: [first, last) lies inside `v`'s allocation, which we
            // borrow mutably; MADV_HUGEPAGE only changes how the kernel backs
            // those pages, never their contents, so no Rust invariant changes.
            // A failure (THP disabled) is harmless and ignored.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// A new zeroed buffer. Large zeroed allocations are fresh mappings whose
/// pages are faulted in by the first write; asking for huge pages makes
/// that 512x fewer faults, which matters on the CPU where every batch is
/// a new buffer (it becomes the tensor).
pub(crate) fn heap(output: HostLayout, elems: usize) -> HostBuf {
    match output {
        HostLayout::U8Nhwc => {
            let mut v = vec![0u8; elems];
            advise_huge_pages(&mut v);
            HostBuf::U8(v)
        }
        HostLayout::F32Nchw { .. } => {
            let mut v = vec![0f32; elems];
            advise_huge_pages(&mut v);
            HostBuf::F32(v)
        }
    }
}
