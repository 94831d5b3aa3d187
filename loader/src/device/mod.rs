//! The uploader's one device-specific step: a finished host batch becomes
//! device tensors.
//!
//! This is the single place where backends differ. On the CPU the host
//! buffer *becomes* the tensor's storage (no copy) and only its pool permit
//! is returned. Other devices copy from the host buffer, which then goes back
//! to the pool for reuse; the CUDA pinned-memory path with a copy stream
//! replaces that copy here without touching the rest of the pipeline.

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

/// Makes the tensors of a batch of `n` images of `height x width`.
pub(crate) fn upload(
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
    if device.is_cpu() {
        let images = match buf {
            HostBuf::U8(mut v) => {
                v.truncate(len);
                Tensor::from_vec(v, shape, device)?
            }
            HostBuf::F32(mut v) => {
                v.truncate(len);
                Tensor::from_vec(v, shape, device)?
            }
        };
        let labels = Tensor::from_vec(labels, label_count, device)?;
        return Ok(Uploaded {
            images,
            labels,
            reusable: None,
        });
    }
    let images = match &buf {
        HostBuf::U8(v) => Tensor::from_slice(&v[..len], shape, device)?,
        HostBuf::F32(v) => Tensor::from_slice(&v[..len], shape, device)?,
    };
    let labels = Tensor::from_vec(labels, label_count, device)?;
    Ok(Uploaded {
        images,
        labels,
        reusable: Some(buf),
    })
}
