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
use crate::fields::Schema;
#[cfg(test)]
pub(crate) use buffer::heap as heap_buffer;
pub(crate) use buffer::keep_batch_memory;
pub(crate) use buffer::HostBuf;
use candle_core::{Device, Shape, Tensor};
pub(crate) use normalize::Finish;
pub(crate) use ring::{Guard, Guards};
use std::sync::Arc;

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

/// The fields of a batch on its device, in schema order, the host buffer
/// when it can go back to the pool, and the batch's ready point.
pub(crate) struct Uploaded {
    pub(crate) fields: Vec<Tensor>,
    pub(crate) reusable: Option<HostBuf>,
    pub(crate) ready: Ready,
}

/// The allocator of `device`'s host batch buffers, and whether the pool
/// keeps every buffer it makes: page-locked ones for CUDA (allocating and
/// freeing them is slow and may synchronize the device), ordinary zeroed
/// memory otherwise.
pub(crate) fn buffers(
    device: &Device,
    schema: Arc<Schema>,
    guards: Guards,
) -> (crate::pool::Alloc<HostBuf>, bool) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let dev = dev.clone();
        let alloc = move || cuda::pinned_buffer(&dev, schema.packed_bytes, guards);
        return (Box::new(alloc), true);
    }
    let _ = (device, guards);
    (Box::new(move || Ok(buffer::heap(&schema))), false)
}

/// Per-loader upload state: the CUDA copy stream and ring, or nothing;
/// with the device step of the built-in image map's field.
#[derive(Debug)]
pub(crate) struct Uploader {
    kind: Kind,
    /// The field [`Finish`] applies to (the built-in map's images).
    finish_field: Option<usize>,
}

#[derive(Debug)]
enum Kind {
    Plain(Finish),
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaUploader>),
}

/// The shape of `n` samples of field `f` of `schema`.
fn field_shape(schema: &Schema, f: usize, n: usize) -> Shape {
    let mut dims = Vec::with_capacity(1 + schema.fields[f].field.shape.len());
    dims.push(n);
    dims.extend_from_slice(&schema.fields[f].field.shape);
    dims.into()
}

impl Uploader {
    /// The uploader of `device` for batches of `schema`; `finish` applies
    /// to field `finish_field`.
    pub(crate) fn new(
        device: &Device,
        finish: Finish,
        finish_field: Option<usize>,
        schema: &Schema,
        guards: Guards,
    ) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            let cuda_finish = match finish.normalize {
                Some(op) => cuda::Finish::Normalize(op),
                None => cuda::Finish::Copy {
                    dtype: finish.dtype,
                },
            };
            let up = cuda::CudaUploader::new(dev, schema, (finish_field, cuda_finish), guards)?;
            return Ok(Self {
                kind: Kind::Cuda(Box::new(up)),
                finish_field,
            });
        }
        let _ = (device, schema, guards);
        Ok(Self {
            kind: Kind::Plain(finish),
            finish_field,
        })
    }

    /// Whether a delivered batch's `ready` wait and an undelivered one's
    /// host wait are in force.
    pub(crate) fn guards(&self) -> Guards {
        match &self.kind {
            Kind::Plain(_) => Guards::default(),
            #[cfg(feature = "cuda")]
            Kind::Cuda(up) => up.guards(),
        }
    }

    /// Makes the tensors of a batch of `n` samples.
    pub(crate) fn upload(
        &self,
        device: &Device,
        buf: HostBuf,
        n: usize,
        schema: &Schema,
    ) -> Result<Uploaded> {
        match (&self.kind, buf) {
            (Kind::Plain(finish), HostBuf::Heap(vecs)) => {
                let cpu = device.is_cpu();
                let mut fields = Vec::with_capacity(vecs.len());
                let mut kept = Vec::new();
                for (f, v) in vecs.into_iter().enumerate() {
                    let shape = field_shape(schema, f, n);
                    let elems = shape.elem_count();
                    // The CPU tensor takes the vector; elsewhere it is
                    // copied and the buffer goes back to the pool.
                    let t = if cpu {
                        v.into_tensor(elems, shape, device)?
                    } else {
                        let t = v.copy_tensor(elems, shape, device)?;
                        kept.push(v);
                        t
                    };
                    fields.push(if self.finish_field == Some(f) {
                        finish.apply(t)?
                    } else {
                        t
                    });
                }
                Ok(Uploaded {
                    fields,
                    reusable: (!cpu).then_some(HostBuf::Heap(kept)),
                    ready: Ready::default(),
                })
            }
            (Kind::Plain(_), HostBuf::Pinned(_)) => Err(Error::InvalidConfig(
                "pinned buffers need the CUDA uploader".into(),
            )),
            #[cfg(feature = "cuda")]
            (Kind::Cuda(up), mut buf) => {
                let (fields, event) = up.upload(&mut buf, n, schema)?;
                let Device::Cuda(dev) = device else {
                    return Err(Error::InvalidConfig(
                        "the CUDA uploader needs a CUDA device".into(),
                    ));
                };
                Ok(Uploaded {
                    fields,
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
        match &self.kind {
            Kind::Plain(_) => Vec::new(),
            #[cfg(feature = "cuda")]
            Kind::Cuda(up) => up.finished_copies(),
        }
    }
}
