//! The uploader's one device-specific step: a finished host batch becomes
//! device tensors, converted and normalized as the loader's output asks.
//!
//! This is the single place where backends differ.
//! - CPU: the host buffer *becomes* the tensor's storage (no copy); only its
//!   pool permit is returned. Device normalization, if asked for, is the
//!   fused [`normalize`] op's CPU implementation.
//! - CUDA (feature `cuda`): page-locked host buffers, a loader-owned staging
//!   ring, a copy stream and the events of [`ring`]; the batch carries a
//!   `ready` event the consumer's stream waits on ([`Ready`]).
//! - Metal and anything else: `Tensor::from_slice` copies the host buffer
//!   into device memory and the buffer goes back to the pool at once.
//!
//! # Metal, audited against candle-core 0.11.1 (not compiled here: no macOS)
//! - Host buffer reuse: `from_slice` / `from_vec` end in
//!   `MetalDevice::new_buffer_with_data` → `newBufferWithBytes:length:options:`
//!   (candle-metal-kernels `metal/device.rs`), a synchronous CPU copy into a
//!   fresh shared buffer: the pool buffer may be rewritten as soon as it
//!   returns.
//! - Consumer after the upload thread: one command queue and one current
//!   command buffer per device, every encode under one mutex
//!   (candle-metal-kernels `metal/commands.rs` `Commands::command_encoder`),
//!   buffers untracked by Metal but ordered by candle's barriers and fences
//!   by buffer (`encoder.rs` `auto_barrier`, `commands.rs` `end_encoding`).
//!   The batch is sent after its ops are encoded, so the consumer's ops are
//!   encoded, and run, after them, from any thread.
//! - Device buffer reuse: candle's pool hands out a buffer whose `Arc` count
//!   is 1 at once, ordered after its earlier readers by the same barriers and
//!   fences; command buffers retain what they use.
//! - What the loader must not do: `device.synchronize()` on the upload
//!   thread (`Commands::flush_and_wait` clears the fence map, which can drop
//!   fences the consumer's encoders need), so it never does.
//! - Memory: each upload is a fresh shared buffer that joins candle's pool,
//!   swept only at a synchronize or a read back to the host; a training loop
//!   that never reads a value back (loss, metrics) grows it (candle's
//!   behaviour, `metal_backend/device.rs` `drop_unused_buffers`).
//! - Not fused on Metal: device normalization there is candle's cast,
//!   permute and broadcasts, as before (no `metal_fwd` for the fused op
//!   yet), within an ulp of the host's values rather than bit-identical.

mod buffer;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
/// Without the `cuda` feature: the same names, uninhabited (candle's
/// `dummy_cuda_backend.rs` pattern), so the code that holds host buffers
/// needs no `cfg`.
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub(crate) mod cuda;
pub(crate) mod normalize;
// The protocol only CUDA drives; its model tests run everywhere.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod ring;

use crate::error::{Error, Result};
use crate::layout::HostLayout;
pub(crate) use buffer::HostBuf;
use candle_core::{Device, Shape, Tensor};
pub(crate) use normalize::Finish;
pub(crate) use ring::{Guard, Guards};

/// A candle or driver result, told what the loader was doing: its error
/// becomes [`Error::Device`] with the cause kept as its source.
pub(crate) trait On<T> {
    /// The value, or an error naming `what` failed.
    fn on(self, what: &'static str) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> On<T> for std::result::Result<T, E> {
    fn on(self, what: &'static str) -> Result<T> {
        self.map_err(|e| Error::Device {
            what,
            source: Box::new(e),
        })
    }
}

/// The point after the loader's last write to a batch on the device, which
/// the consumer's stream waits on before using it. Nothing on CPU and Metal
/// (their work is ordered by the device itself).
#[derive(Debug, Clone, Default)]
pub(crate) struct Ready {
    #[cfg(feature = "cuda")]
    cuda: Option<(cuda::Event, candle_core::CudaDevice)>,
}

impl Ready {
    /// Makes the calling thread's stream of the device wait for the batch
    /// (under `Device::new_cuda` each thread has its own stream).
    pub(crate) fn wait_on_current_stream(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((e, dev)) = &self.cuda {
            dev.cuda_stream()
                .wait(e)
                .on("ordering the consumer's stream after a batch")?;
        }
        Ok(())
    }

    /// Blocks until the loader's writes to the batch have completed.
    pub(crate) fn host_wait(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((e, _)) = &self.cuda {
            e.synchronize().on("waiting for a batch on the device")?;
        }
        Ok(())
    }
}

/// Images and labels of a batch on its device, the host buffer when it can
/// go back to the pool, and the batch's ready point.
pub(crate) struct Uploaded {
    pub(crate) images: Tensor,
    pub(crate) labels: Tensor,
    pub(crate) reusable: Option<HostBuf>,
    pub(crate) ready: Ready,
}

/// The allocator of `device`'s host batch buffers, and whether the pool
/// keeps every buffer it makes: page-locked ones for CUDA (allocating and
/// freeing them is slow and may synchronize the device), ordinary zeroed
/// memory otherwise.
pub(crate) fn buffers(
    device: &Device,
    geo: Geometry,
    guards: Guards,
) -> (crate::pool::Alloc<HostBuf>, bool) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let dev = dev.clone();
        let alloc =
            move || cuda::pinned_buffer(&dev, geo.elems(), geo.batch, geo.host_output, guards);
        return (Box::new(alloc), true);
    }
    let _ = (device, guards);
    let (output, elems) = (geo.host_output, geo.elems());
    (Box::new(move || Ok(buffer::heap(output, elems))), false)
}

/// Per-loader upload state: the CUDA copy stream and ring, or nothing.
#[derive(Debug)]
pub(crate) enum Uploader {
    Plain(Finish),
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaUploader>),
}

/// One batch's geometry: `batch` samples of `height x width`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) batch: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
    /// What the decode workers write.
    pub(crate) host_output: HostLayout,
}

impl Geometry {
    fn shape(&self, n: usize) -> Shape {
        match self.host_output {
            HostLayout::U8Nhwc => (n, self.height, self.width, 3).into(),
            HostLayout::F32Nchw { .. } => (n, 3, self.height, self.width).into(),
        }
    }

    /// Image elements of a full batch.
    pub(crate) fn elems(&self) -> usize {
        self.batch * self.height * self.width * 3
    }
}

impl Uploader {
    pub(crate) fn new(
        device: &Device,
        finish: Finish,
        geo: Geometry,
        guards: Guards,
    ) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            let elem = match geo.host_output {
                HostLayout::U8Nhwc => 1,
                HostLayout::F32Nchw { .. } => 4,
            };
            let cuda_finish = match finish.normalize {
                Some(op) => cuda::Finish::Normalize(op),
                None => cuda::Finish::Copy {
                    dtype: finish.dtype,
                },
            };
            return Ok(Uploader::Cuda(Box::new(cuda::CudaUploader::new(
                dev,
                geo.elems() * elem,
                geo.batch,
                cuda_finish,
                guards,
            )?)));
        }
        let _ = (device, geo, guards);
        Ok(Uploader::Plain(finish))
    }

    /// Whether a delivered batch's `ready` wait and an undelivered one's
    /// host wait are in force.
    pub(crate) fn guards(&self) -> Guards {
        match self {
            Uploader::Plain(_) => Guards::default(),
            #[cfg(feature = "cuda")]
            Uploader::Cuda(up) => up.guards(),
        }
    }

    /// Makes the tensors of a batch of `labels.len()` samples.
    pub(crate) fn upload(
        &self,
        device: &Device,
        buf: HostBuf,
        labels: Vec<u32>,
        geo: Geometry,
    ) -> Result<Uploaded> {
        let n = labels.len();
        let shape = geo.shape(n);
        let len = shape.elem_count();
        match (self, buf) {
            (Uploader::Plain(finish), buf) => {
                let labels = Tensor::from_vec(labels, n, device).on("making a batch's tensors")?;
                let (images, reusable) = match buf {
                    HostBuf::U8(mut v) if device.is_cpu() => {
                        v.truncate(len);
                        (
                            Tensor::from_vec(v, shape, device).on("making a batch's tensors")?,
                            None,
                        )
                    }
                    HostBuf::F32(mut v) if device.is_cpu() => {
                        v.truncate(len);
                        (
                            Tensor::from_vec(v, shape, device).on("making a batch's tensors")?,
                            None,
                        )
                    }
                    HostBuf::U8(v) => (
                        Tensor::from_slice(&v[..len], shape, device)
                            .on("making a batch's tensors")?,
                        Some(HostBuf::U8(v)),
                    ),
                    HostBuf::F32(v) => (
                        Tensor::from_slice(&v[..len], shape, device)
                            .on("making a batch's tensors")?,
                        Some(HostBuf::F32(v)),
                    ),
                    HostBuf::PinnedU8(_) | HostBuf::PinnedF32(_) => {
                        return Err(Error::InvalidConfig(
                            "pinned buffers need the CUDA uploader".into(),
                        ))
                    }
                };
                Ok(Uploaded {
                    images: finish.apply(images)?,
                    labels,
                    reusable,
                    ready: Ready::default(),
                })
            }
            #[cfg(feature = "cuda")]
            (Uploader::Cuda(up), mut buf) => {
                let (images, labels, event) = up.upload(&mut buf, &labels, shape)?;
                let Device::Cuda(dev) = device else {
                    return Err(Error::InvalidConfig(
                        "the CUDA uploader needs a CUDA device".into(),
                    ));
                };
                Ok(Uploaded {
                    images,
                    labels,
                    reusable: Some(buf),
                    ready: Ready {
                        cuda: Some((event, dev.clone())),
                    },
                })
            }
        }
    }

    /// Device copy time and bytes of the copies completed since the last
    /// call (CUDA: measured with events on the copy stream).
    pub(crate) fn finished_copies(&self) -> Vec<(std::time::Duration, u64)> {
        match self {
            Uploader::Plain(_) => Vec::new(),
            #[cfg(feature = "cuda")]
            Uploader::Cuda(up) => up.finished_copies(),
        }
    }
}
