//! CUDA: page-locked host batch buffers, a loader-owned ring of device
//! staging slots, a copy stream ahead of compute, and the events of the
//! protocol in [`super::ring`] (read its hazard table first).
//!
//! Why a ring and not a fresh device allocation per batch: a `CudaSlice`
//! allocated on the copy stream is freed (`cuMemFreeAsync`) on the copy
//! stream, while candle's ops read it on the compute stream through
//! `slice_ptr` = `v.device_ptr(v.stream())`, which waits and records on the
//! slice's own stream (candle-core 0.11.1 `cuda_backend/mod.rs`
//! `slice_ptr`, `to_dtype`; cudarc 0.19.10 `driver/safe/core.rs`
//! `Drop for CudaSlice`, `DevicePtr for CudaSlice`): nothing ordered the free
//! after the read. The ring is allocated once (`cuMemAlloc`), only the
//! protocol's events order its reuse, and the tensors the consumer gets are
//! allocated on the compute stream, so candle's own rule (a tensor is freed
//! on its stream, after the work queued there) holds for them.
//!
//! Why the consumer waits in `Epoch::next`: under `Device::new_cuda` the
//! device's stream is `CU_STREAM_PER_THREAD` (handle `0x2`, cudarc
//! `CudaContext::per_thread_stream`), which names a different stream on each
//! host thread; a wait issued by the upload thread orders only the upload
//! thread's stream. The consumer's thread must issue it.
//!
//! The loader's own copies and kernels on host buffers and ring slots use
//! raw pointers (cudarc `result::memcpy_htod_async` and friends): cudarc's
//! per-slice tracking is not relied on, so the events here are the whole
//! argument and a test can remove each. The consumer's tensors are written
//! through `device_ptr_mut`, so cudarc records their write as for any candle
//! tensor: while tracking is on (the default, in multi-stream mode) that
//! write event also orders the consumer's reads and frees (cudarc
//! `DevicePtr for CudaSlice`, `Drop for CudaSlice`, on the stream named by
//! the calling thread), a second guard behind `ready`. With tracking off
//! (`CudaDevice::disable_event_tracking`) `ready` and the undelivered host
//! wait are the only ones; the GPU stress test runs that way.

mod pinned;

use super::normalize::NormalizeU8;
use super::ring::{Guards, Ring, Staged, Streams};
use super::HostBuf;
use super::On;
use crate::error::{Error, Result};
use crate::fields::{FieldType, Schema};
use candle_core::cuda::cudarc::driver::{result, sys, CudaEvent, CudaStream, DevicePtrMut};
use candle_core::cuda::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Shape, Storage, Tensor};
use pinned::{host_ref, HostRef};
pub(crate) use pinned::{pinned_buffer, Pinned};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A point in a stream's work, shared by the host buffer, the ring slot and
/// the batch that need it.
pub(crate) type Event = Arc<CudaEvent>;

/// A ring slot: device memory for one batch, every field's region at its
/// packed offset (as in the pinned buffer).
#[derive(Debug)]
pub(crate) struct Slot {
    base: u64,
}

/// What L does with a staged batch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Finish {
    /// Copy the host's u8 NHWC or f32 NCHW, then cast to `dtype` if needed.
    Copy { dtype: DType },
    /// The fused normalize of u8 NHWC.
    Normalize(NormalizeU8),
}

/// One batch: every field's packed offset, element type and shape
/// `[n, ..]`.
#[derive(Debug)]
pub(crate) struct Job {
    fields: Vec<(usize, FieldType, Shape)>,
}

/// The protocol's streams on a CUDA device.
#[derive(Debug)]
pub(crate) struct CudaStreams {
    copy: Arc<CudaStream>,
    dev: CudaDevice,
    /// The field `Finish` applies to, and what it does.
    finish: (Option<usize>, Finish),
    /// The copy's start, recorded by `copy_in`, paired with `copied`.
    copy_start: Mutex<Option<CudaEvent>>,
}

impl CudaStreams {
    fn bind(&self) -> Result<()> {
        self.copy
            .context()
            .bind_to_thread()
            .on("binding the CUDA context")
    }

    /// L: the device's stream as this (the upload) thread sees it.
    fn compute(&self) -> Arc<CudaStream> {
        self.dev.cuda_stream()
    }

    /// A tensor over `n` elements of a fresh allocation on L, written from
    /// `src` (device address) by a copy on L.
    fn copied<T: CudaDType + candle_core::cuda::cudarc::driver::DeviceRepr>(
        &self,
        src: u64,
        n: usize,
        shape: Shape,
    ) -> Result<Tensor> {
        let stream = self.compute();
        // SAFETY: the copy below writes all `n` elements, as the first work
        // on the slice on the stream it was allocated on. One element at
        // least: a zero-byte allocation is an error (a batch whose samples
        // were all skipped).
        let mut out = unsafe { self.dev.alloc::<T>(n.max(1)) }.on("making a batch's tensors")?;
        {
            let (dst, _write) = out.device_ptr_mut(&stream);
            if n > 0 {
                // SAFETY: `src` is a ring slot holding at least `n` elements
                // of `T` (written by the copy L waited for), `dst` is `n`
                // elements; both live past the copy (the slot until `drain`,
                // `out` as long as the tensor; a free is stream-ordered after
                // it).
                unsafe {
                    result::memcpy_dtod_async(
                        dst,
                        src,
                        n * std::mem::size_of::<T>(),
                        stream.cu_stream(),
                    )
                }
                .on("making a batch's tensors")?;
            }
        }
        let storage = CudaStorage::wrap_cuda_slice(out, self.dev.clone());
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            shape,
            BackpropOp::none(),
            false,
        ))
    }
}

impl CudaStreams {
    /// A tensor of `shape` and element type `dtype` copied from `src`.
    fn copied_as(&self, dtype: FieldType, src: u64, shape: Shape) -> Result<Tensor> {
        let n = shape.elem_count();
        match dtype {
            FieldType::U8 => self.copied::<u8>(src, n, shape),
            FieldType::U32 => self.copied::<u32>(src, n, shape),
            FieldType::I16 => self.copied::<i16>(src, n, shape),
            FieldType::I32 => self.copied::<i32>(src, n, shape),
            FieldType::I64 => self.copied::<i64>(src, n, shape),
            FieldType::BF16 => self.copied::<half::bf16>(src, n, shape),
            FieldType::F16 => self.copied::<half::f16>(src, n, shape),
            FieldType::F32 => self.copied::<f32>(src, n, shape),
            FieldType::F64 => self.copied::<f64>(src, n, shape),
        }
    }

    /// The built-in image map's images field (`u8` NHWC or `f32` NCHW at
    /// `src`), cast or normalized on L as `finish` says.
    fn finished(
        &self,
        finish: Finish,
        src: u64,
        dtype: FieldType,
        shape: &Shape,
    ) -> Result<Tensor> {
        let len = shape.elem_count();
        Ok(match finish {
            // An empty batch has nothing to cast (candle's cast would launch
            // an empty grid, an error): an empty tensor of the final type.
            Finish::Copy { dtype: to } if len == 0 => match to {
                DType::U8 => self.copied::<u8>(src, 0, shape.clone())?,
                DType::F16 => self.copied::<half::f16>(src, 0, shape.clone())?,
                DType::BF16 => self.copied::<half::bf16>(src, 0, shape.clone())?,
                _ => self.copied::<f32>(src, 0, shape.clone())?,
            },
            Finish::Copy { dtype: to } => {
                let t = self.copied_as(dtype, src, shape.clone())?;
                // candle's cast reads `t` on t's own stream, which is L.
                if t.dtype() == to {
                    t
                } else {
                    t.to_dtype(to).on("converting a batch on the device")?
                }
            }
            Finish::Normalize(op) => {
                let (n, h, w) = match shape.dims() {
                    &[n, h, w, _] => (n, h, w),
                    d => {
                        return Err(Error::InvalidConfig(format!(
                            "device normalize needs u8 [n, h, w, 3] batches, got {d:?}"
                        )))
                    }
                };
                let storage = super::normalize::cuda::launch(&self.dev, &op, src, n, h * w)
                    .on("normalizing a batch on the device")?;
                Tensor::from_storage(
                    Storage::Cuda(storage),
                    (n, 3, h, w),
                    BackpropOp::none(),
                    false,
                )
            }
        })
    }
}

impl Streams for CudaStreams {
    type Event = Event;
    type Host = HostRef;
    type Slot = Slot;
    type Job = Job;
    type Out = Vec<Tensor>;

    fn copy_wait(&self, e: &Event) -> Result<()> {
        self.copy.wait(e).on("ordering the copy stream")
    }

    fn copy_in(&self, host: &HostRef, slot: &Slot, _: &Job) -> Result<()> {
        let ctx = self.copy.context();
        let start = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .on("copying a batch to the device")?;
        start
            .record(&self.copy)
            .on("copying a batch to the device")?;
        self.bind()?;
        let c = self.copy.cu_stream();
        // Empty regions (every sample skipped) copy nothing.
        for &(offset, bytes) in &host.regions {
            if bytes == 0 {
                continue;
            }
            // SAFETY: `host` points into a live pinned buffer (it is freed
            // only after its `copied` event, recorded right after these
            // copies, has completed) holding `bytes` at `offset` (checked
            // against the schema by `host_ref`), and the slot has the same
            // packed layout; the copy stream waited for the slot's last read
            // (`consumed`) before this.
            unsafe {
                let src = std::slice::from_raw_parts(host.base.add(offset), bytes);
                result::memcpy_htod_async(slot.base + offset as u64, src, c)
                    .on("copying a batch to the device")?;
            }
        }
        *crate::sync::lock(&self.copy_start) = Some(start);
        Ok(())
    }

    fn copy_record(&self) -> Result<Event> {
        // Blocking sync: the feeder sleeps on it instead of spinning. Timing
        // stays on: it ends the copy's measured span.
        let e = self
            .copy
            .record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .on("recording a copy event")?;
        Ok(Arc::new(e))
    }

    fn compute_wait(&self, e: &Event) -> Result<()> {
        self.compute().wait(e).on("ordering the compute stream")
    }

    fn finish(&self, slot: &Slot, job: &Job) -> Result<Vec<Tensor>> {
        let mut out = Vec::with_capacity(job.fields.len());
        for (f, (offset, dtype, shape)) in job.fields.iter().enumerate() {
            let src = slot.base + *offset as u64;
            let t = match self.finish {
                (Some(at), finish) if at == f => self.finished(finish, src, *dtype, shape)?,
                _ => self.copied_as(*dtype, src, shape.clone())?,
            };
            out.push(t);
        }
        Ok(out)
    }

    fn compute_record(&self) -> Result<Event> {
        Ok(Arc::new(
            self.compute()
                .record_event(None)
                .on("recording a batch's ready event")?,
        ))
    }

    fn host_wait(&self, e: &Event) -> Result<()> {
        e.synchronize().on("waiting for the device")
    }

    fn sync(&self) -> Result<()> {
        self.copy.synchronize().on("synchronizing the device")?;
        self.compute().synchronize().on("synchronizing the device")
    }
}

/// Copy spans waiting for their events, and the finished totals.
#[derive(Debug, Default)]
struct Timings {
    pending: VecDeque<(CudaEvent, Event, u64)>,
}

/// The loader's copy stream, staging ring and the device it feeds.
#[derive(Debug)]
pub(crate) struct CudaUploader {
    streams: CudaStreams,
    ring: Mutex<Ring<CudaStreams>>,
    timings: Mutex<Timings>,
    guards: Guards,
}

/// Raises the release threshold of `dev`'s current stream-ordered memory
/// pool to at least `bytes`. cudarc allocates device memory with
/// `cuMemAllocAsync` from that pool (cudarc `driver/safe/core.rs`,
/// `CudaStream::alloc`), and candle never sets the pool's
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, which is 0 by default: per the CUDA
/// driver API, the pool then gives all its unused memory back to the OS at
/// every stream, event or context synchronize, and the loader synchronizes
/// on events each batch; every step would then allocate its batch and the
/// training step's tensors anew from the OS. Keeping up to the loader's
/// own batches in flight lets those allocations be reused (as PyTorch's
/// caching allocator keeps its blocks). Only ever raised, never lowered;
/// best effort: a device without memory pools has nothing to trim.
fn keep_pool_memory(dev: &CudaDevice, bytes: u64) {
    use candle_core::cuda::cudarc::driver::sys::CUmemPool_attribute;
    let device = dev.cuda_stream().context().cu_device();
    // SAFETY: `device` comes from a live context; the attribute's value is
    // a u64 (cuuint64_t) for the release threshold, read into and written
    // from a local of that type.
    let _ = unsafe {
        result::device::get_mem_pool(device).and_then(|pool| {
            let attr = CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
            let mut now: u64 = 0;
            result::mem_pool::get_attribute(pool, attr, (&mut now as *mut u64).cast())?;
            if now < bytes {
                let mut v = bytes;
                result::mem_pool::set_attribute(pool, attr, (&mut v as *mut u64).cast())?;
            }
            Ok(())
        })
    };
}

/// Ring slots: two let the copy of batch k+1 run while L reads batch k; a
/// third keeps the copy stream from waiting when L is briefly behind.
const RING: usize = 3;

impl CudaUploader {
    /// The copy stream (its creation puts the context in multi-stream mode
    /// and synchronizes it once) and the ring, for batches of `schema`;
    /// `finish` applies to its field `finish.0`.
    pub(crate) fn new(
        dev: &CudaDevice,
        schema: &Schema,
        finish: (Option<usize>, Finish),
        guards: Guards,
    ) -> Result<Self> {
        let copy = dev
            .cuda_stream()
            .context()
            .new_stream()
            .on("setting up the upload streams and staging ring")?;
        copy.context()
            .bind_to_thread()
            .on("setting up the upload streams and staging ring")?;
        // Batches up to f32 from u8 pixels (4x the packed bytes), as many
        // as can be prefetched or in the ring.
        let kept = (schema.packed_bytes as u64)
            .saturating_mul(4)
            .saturating_mul((crate::tune::MAX_QUEUE + RING) as u64);
        keep_pool_memory(dev, kept);
        let mut slots = Vec::with_capacity(RING);
        for _ in 0..RING {
            // SAFETY: a plain device allocation, freed in `Drop` after the
            // ring has drained; never read before the copy that fills it.
            let base = unsafe {
                result::malloc_sync(schema.packed_bytes.max(1))
                    .on("setting up the upload streams and staging ring")?
            };
            slots.push(Slot { base });
        }
        let streams = CudaStreams {
            copy,
            dev: dev.clone(),
            finish,
            copy_start: Mutex::new(None),
        };
        Ok(Self {
            ring: Mutex::new(Ring::new(slots, guards)),
            streams,
            timings: Mutex::default(),
            guards,
        })
    }

    /// The guards in force (all but a test's removed one).
    pub(crate) fn guards(&self) -> Guards {
        self.guards
    }

    /// Stages a filled pinned buffer of `n` samples: every field is copied
    /// on the copy stream and finished on L. The buffer keeps its `copied`
    /// event, the batch its `ready` event.
    pub(crate) fn upload(
        &self,
        buf: &mut HostBuf,
        n: usize,
        schema: &Schema,
    ) -> Result<(Vec<Tensor>, Event)> {
        let HostBuf::Pinned(p) = buf else {
            return Err(Error::InvalidConfig(
                "the CUDA uploader needs pinned buffers".into(),
            ));
        };
        let host = host_ref(p, n, schema)?;
        let job = Job {
            fields: schema
                .fields
                .iter()
                .map(|f| {
                    let mut dims = vec![n];
                    dims.extend_from_slice(&f.field.shape);
                    (f.offset, f.field.dtype, Shape::from(dims))
                })
                .collect(),
        };
        // A panic part-way (in candle or cudarc) could leave a copy in
        // flight with no event: wait the streams out before `buf` may be
        // reused or freed, then report it.
        let staged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::sync::lock(&self.ring).upload(&self.streams, &host, &job)
        }))
        .unwrap_or_else(|payload| {
            let _ = self.streams.sync();
            std::panic::resume_unwind(payload)
        });
        let Staged {
            out: fields,
            copied,
            ready,
        } = staged?;
        let start = crate::sync::lock(&self.streams.copy_start).take();
        p.copied = Some(copied.clone());
        if let Some(start) = start {
            let bytes = host.regions.iter().map(|r| r.1 as u64).sum();
            crate::sync::lock(&self.timings)
                .pending
                .push_back((start, copied, bytes));
        }
        Ok((fields, ready))
    }

    /// The copies that have completed since the last call: their total
    /// device time and bytes, measured by the copy stream's events.
    pub(crate) fn finished_copies(&self) -> Vec<(Duration, u64)> {
        let mut t = crate::sync::lock(&self.timings);
        let mut done = Vec::new();
        while let Some((start, end, _)) = t.pending.front() {
            let ms = match end.try_is_complete() {
                Ok(false) => break,
                // Both complete (the copy stream records them in order):
                // read the time without `elapsed_ms`, whose two event
                // synchronizations are each a point where a pool with a
                // low release threshold trims itself.
                Ok(true) => {
                    // SAFETY: two live events of this context, both
                    // recorded and complete (the end was queried above,
                    // and the start precedes it on the copy stream).
                    unsafe { result::event::elapsed(start.cu_event(), end.cu_event()) }.ok()
                }
                // A device error: this copy's time is lost, not the queue.
                Err(_) => None,
            };
            let (_, _, bytes) = t.pending.pop_front().expect("front exists");
            if let Some(ms) = ms {
                done.push((Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3), bytes));
            }
        }
        // Bounded whatever the device does: the oldest spans are dropped.
        while t.pending.len() > 64 {
            t.pending.pop_front();
        }
        done
    }
}

impl Drop for CudaUploader {
    fn drop(&mut self) {
        let ring = self.ring.get_mut().unwrap_or_else(|p| p.into_inner());
        // Frees only after every read of the slots has completed; if the
        // context is broken the memory is leaked rather than freed under a
        // copy.
        if ring.drain(&self.streams).is_ok() && self.streams.bind().is_ok() {
            for slot in ring.slots() {
                // SAFETY: allocated by `malloc_sync` in `new`, freed once,
                // after every copy and read of the ring has completed.
                unsafe {
                    let _ = result::free_sync(slot.base);
                }
            }
        }
    }
}
