//! CUDA: page-locked batch buffers and a copy stream ahead of compute.
//!
//! Each batch is copied host-to-device with `cuMemcpyHtoDAsync` on the
//! loader's own non-blocking stream. cudarc records the pinned buffer's
//! event after the copy; [`Pinned::as_mut_slice`] waits on that event, so a
//! buffer is never written while its copy is in flight. The compute stream of
//! the device the user passed (which may be a `new_cuda_with_stream` stream or
//! the per-thread default stream of `new_cuda`) waits on an event recorded
//! after the copy, and candle's event tracking orders every later use of the
//! device slice, on any stream, after it.

use crate::error::Result;
use crate::pool::HostBuf;
use crate::transform::Output;
use candle_core::cuda::cudarc::driver::{CudaStream, PinnedHostSlice, ValidAsZeroBits};
use candle_core::cuda::{CudaDType, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Shape, Storage, Tensor};
use std::sync::Arc;

/// A page-locked host buffer of `T`.
#[derive(Debug)]
pub(crate) struct Pinned<T>(PinnedHostSlice<T>);

impl<T: ValidAsZeroBits> Pinned<T> {
    /// The elements, once the last copy out of the buffer has completed.
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        Ok(self.0.as_mut_slice().w()?)
    }
}

/// Allocates `count` zeroed page-locked buffers of `elems` elements.
pub(crate) fn pinned_buffers(
    dev: &CudaDevice,
    count: usize,
    elems: usize,
    output: Output,
) -> Result<Vec<HostBuf>> {
    let ctx = dev.cuda_stream().context().clone();
    (0..count)
        .map(|_| {
            Ok(match output {
                Output::U8Nhwc => {
                    // SAFETY: flags 0 is plain page-locked memory (not write-
                    // combined, so the CPU can also read it fast). The memory
                    // is uninitialized; it is zeroed right below, before any
                    // reference to it exists.
                    let mut p = unsafe { ctx.alloc_pinned_with_flags::<u8>(elems, 0) }.w()?;
                    let ptr = p.as_mut_ptr().w()?;
                    // SAFETY: `ptr` points to `elems` u8 just allocated and not
                    // yet shared; writing zero bytes initializes all of them.
                    unsafe { std::ptr::write_bytes(ptr, 0, elems) };
                    HostBuf::PinnedU8(Pinned(p))
                }
                Output::F32Nchw { .. } => {
                    // SAFETY: as above, for f32 elements.
                    let mut p = unsafe { ctx.alloc_pinned_with_flags::<f32>(elems, 0) }.w()?;
                    let ptr = p.as_mut_ptr().w()?;
                    // SAFETY: `ptr` points to `elems` f32 just allocated and not
                    // yet shared; all-zero bits are 0.0.
                    unsafe { std::ptr::write_bytes(ptr, 0, elems) };
                    HostBuf::PinnedF32(Pinned(p))
                }
            })
        })
        .collect()
}

/// The loader's copy stream and the device it feeds.
#[derive(Debug)]
pub(crate) struct CudaUploader {
    copy: Arc<CudaStream>,
    dev: CudaDevice,
}

impl CudaUploader {
    pub(crate) fn new(dev: &CudaDevice) -> Result<Self> {
        let copy = dev.cuda_stream().context().new_stream().w()?;
        Ok(Self {
            copy,
            dev: dev.clone(),
        })
    }

    /// Copies a whole pinned buffer to a new device allocation and returns
    /// its first `len` elements as a tensor of `shape`.
    pub(crate) fn upload(&self, buf: &HostBuf, len: usize, shape: Shape) -> Result<Tensor> {
        match buf {
            HostBuf::PinnedU8(p) => self.copy_to_device(&p.0, len, shape),
            HostBuf::PinnedF32(p) => self.copy_to_device(&p.0, len, shape),
            _ => Err(crate::Error::InvalidConfig(
                "the CUDA uploader needs pinned buffers".into(),
            )),
        }
    }

    fn copy_to_device<T>(
        &self,
        host: &PinnedHostSlice<T>,
        len: usize,
        shape: Shape,
    ) -> Result<Tensor>
    where
        T: CudaDType + candle_core::cuda::cudarc::driver::DeviceRepr,
    {
        // SAFETY: the allocation is fully written by the copy below, which is
        // ordered before any other use of it on the copy stream and, through
        // the event and candle's event tracking, on every other stream.
        let mut dst = unsafe { self.copy.alloc::<T>(host.len()) }.w()?;
        // Copying the whole buffer (not a sub-slice) makes cudarc record the
        // pinned buffer's own event, which guards its reuse.
        self.copy.memcpy_htod(host, &mut dst).w()?;
        let copied = self.copy.record_event(None).w()?;
        self.dev.cuda_stream().wait(&copied).w()?;
        let storage = CudaStorage::wrap_cuda_slice(dst, self.dev.clone());
        let flat = Tensor::from_storage(
            Storage::Cuda(storage),
            host.len(),
            BackpropOp::none(),
            false,
        );
        Ok(flat.narrow(0, 0, len)?.reshape(shape)?)
    }
}
