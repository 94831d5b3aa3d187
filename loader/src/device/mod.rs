//! The uploader's one device-specific step: a finished host batch becomes
//! device tensors.
//!
//! This is the single place where backends differ.
//! - CPU: the host buffer *becomes* the tensor's storage (no copy); only its
//!   pool permit is returned.
//! - CUDA (feature `cuda`): the pool's buffers are page-locked; each batch is
//!   copied asynchronously on the loader's own copy stream, the device's
//!   compute stream waits on the copy's event, and the buffer is written
//!   again only after that copy completed (see [`cuda`]).
//! - Metal and anything else: `Tensor::from_slice` copies the host buffer
//!   into device memory (unified memory on Apple silicon, so one CPU copy)
//!   and the buffer goes back to the pool at once.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
// The protocol only CUDA drives; its model tests run everywhere.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod ring;

use crate::error::Result;
use crate::pool::HostBuf;
use crate::transform::Output;
use candle_core::{Device, Shape, Tensor};

/// Images and labels of a batch on its device, plus the host buffer when it
/// can go back to the pool.
pub(crate) struct Uploaded {
    pub(crate) images: Tensor,
    pub(crate) labels: Tensor,
    pub(crate) reusable: Option<HostBuf>,
}

/// Page-locked batch buffers for `device` when it is a CUDA device (none
/// otherwise: the pool then allocates ordinary memory as needed).
pub(crate) fn pinned_buffers(
    device: &Device,
    count: usize,
    elems: usize,
    output: Output,
) -> Result<Vec<HostBuf>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        return cuda::pinned_buffers(dev, count, elems, output);
    }
    let _ = (device, count, elems, output);
    Ok(Vec::new())
}

/// Per-loader upload state: the CUDA copy stream, or nothing.
#[derive(Debug)]
pub(crate) enum Uploader {
    Plain,
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaUploader),
}

impl Uploader {
    pub(crate) fn new(device: &Device) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            return Ok(Uploader::Cuda(cuda::CudaUploader::new(dev)?));
        }
        let _ = device;
        Ok(Uploader::Plain)
    }

    /// Makes the tensors of a batch of `n` images of `height x width`.
    pub(crate) fn upload(
        &self,
        device: &Device,
        buf: HostBuf,
        labels: Vec<u32>,
        n: usize,
        (height, width): (usize, usize),
        output: Output,
    ) -> Result<Uploaded> {
        let shape: Shape = match output {
            Output::U8Nhwc => (n, height, width, 3).into(),
            Output::F32Nchw { .. } => (n, 3, height, width).into(),
        };
        let len = shape.elem_count();
        let label_count = labels.len();
        let labels = Tensor::from_vec(labels, label_count, device)?;
        let (images, reusable) = match (self, buf) {
            (_, HostBuf::U8(mut v)) if device.is_cpu() => {
                v.truncate(len);
                (Tensor::from_vec(v, shape, device)?, None)
            }
            (_, HostBuf::F32(mut v)) if device.is_cpu() => {
                v.truncate(len);
                (Tensor::from_vec(v, shape, device)?, None)
            }
            #[cfg(feature = "cuda")]
            (Uploader::Cuda(up), buf @ (HostBuf::PinnedU8(_) | HostBuf::PinnedF32(_))) => {
                let images = up.upload(&buf, len, shape)?;
                (images, Some(buf))
            }
            (_, buf) => {
                let images = match &buf {
                    HostBuf::U8(v) => Tensor::from_slice(&v[..len], shape, device)?,
                    HostBuf::F32(v) => Tensor::from_slice(&v[..len], shape, device)?,
                    #[cfg(feature = "cuda")]
                    HostBuf::PinnedU8(_) | HostBuf::PinnedF32(_) => {
                        return Err(crate::Error::InvalidConfig(
                            "pinned buffers need the CUDA uploader".into(),
                        ))
                    }
                };
                (images, Some(buf))
            }
        };
        Ok(Uploaded {
            images,
            labels,
            reusable,
        })
    }
}
