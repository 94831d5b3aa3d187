//! Host batch buffers: what kind of memory a batch is filled in (ordinary
//! heap memory, one typed vector per field, or one page-locked region the
//! CUDA copy stream reads), decided here by the device, so the pool and the
//! pipeline never ask.

use super::cuda::Pinned;
use crate::error::Result;
use crate::fields::{Element, FieldType, Schema};
use candle_core::{Device, Shape, Tensor};

/// One field's storage in a heap buffer: a `Vec<T>` of the field's element
/// type, so on the CPU it becomes the tensor's storage without a copy.
pub(crate) trait FieldVec: Send + Sync + std::fmt::Debug {
    /// The elements as bytes, for the workers to write.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// The first `elems` elements as a tensor of `shape`, taking the vector.
    fn into_tensor(self: Box<Self>, elems: usize, shape: Shape, device: &Device) -> Result<Tensor>;
    /// The first `elems` elements copied into a tensor of `shape`.
    fn copy_tensor(&self, elems: usize, shape: Shape, device: &Device) -> Result<Tensor>;
}

impl<T: Element> FieldVec for Vec<T> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self.as_mut_slice())
    }

    fn into_tensor(
        mut self: Box<Self>,
        elems: usize,
        shape: Shape,
        device: &Device,
    ) -> Result<Tensor> {
        use super::On;
        self.truncate(elems);
        Tensor::from_vec(*self, shape, device).on("making a batch's tensors")
    }

    fn copy_tensor(&self, elems: usize, shape: Shape, device: &Device) -> Result<Tensor> {
        use super::On;
        Tensor::from_slice(&self[..elems.min(self.len())], shape, device)
            .on("making a batch's tensors")
    }
}

/// The storage of one batch: every field's region.
#[derive(Debug)]
pub(crate) enum HostBuf {
    /// One vector per field, in schema order.
    Heap(Vec<Box<dyn FieldVec>>),
    /// Page-locked memory for asynchronous copies to a CUDA device, every
    /// field's region at its packed offset (an uninhabited stub without
    /// the `cuda` feature).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Pinned(Pinned),
}

impl HostBuf {
    /// Every field's full region as bytes, in schema order; for a pinned
    /// buffer this first waits until the copy that last read it has
    /// completed.
    pub(crate) fn regions(&mut self, schema: &Schema) -> Result<Vec<&mut [u8]>> {
        match self {
            HostBuf::Heap(v) => Ok(v.iter_mut().map(|f| f.bytes_mut()).collect()),
            HostBuf::Pinned(p) => {
                let mut rest = p.as_mut_slice()?;
                let mut at = 0;
                let mut out = Vec::with_capacity(schema.fields.len());
                for f in &schema.fields {
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(f.offset - at);
                    let (region, tail) = tail.split_at_mut(f.sample_bytes * schema.batch);
                    at = f.offset + region.len();
                    out.push(region);
                    rest = tail;
                }
                Ok(out)
            }
        }
    }

    /// Waits until the buffer may be written (a pinned buffer's last copy
    /// to the device has completed). Called by the feeder, so decode workers
    /// never block on the device.
    pub(crate) fn wait_writable(&mut self) -> Result<()> {
        match self {
            HostBuf::Heap(_) => Ok(()),
            HostBuf::Pinned(p) => p.as_mut_slice().map(|_| ()),
        }
    }

    /// Moves sample `from` to sample `to` (`to < from`) in every field,
    /// closing a gap left by a skipped sample.
    pub(crate) fn move_slot(&mut self, from: usize, to: usize, schema: &Schema) -> Result<()> {
        for (region, f) in self.regions(schema)?.into_iter().zip(&schema.fields) {
            let b = f.sample_bytes;
            region.copy_within(from * b..(from + 1) * b, to * b);
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

/// A zeroed vector of `len` elements of `dtype`. Large zeroed allocations
/// are fresh mappings whose pages are faulted in by the first write; asking
/// for huge pages makes that 512x fewer faults, which matters on the CPU
/// where every batch is a new buffer (it becomes the tensor).
fn zeroed(dtype: FieldType, len: usize) -> Box<dyn FieldVec> {
    fn make<T: Element>(len: usize) -> Box<dyn FieldVec> {
        let mut v = vec![T::zeroed(); len];
        advise_huge_pages(&mut v);
        Box::new(v)
    }
    match dtype {
        FieldType::U8 => make::<u8>(len),
        FieldType::U32 => make::<u32>(len),
        FieldType::I16 => make::<i16>(len),
        FieldType::I32 => make::<i32>(len),
        FieldType::I64 => make::<i64>(len),
        FieldType::BF16 => make::<half::bf16>(len),
        FieldType::F16 => make::<half::f16>(len),
        FieldType::F32 => make::<f32>(len),
        FieldType::F64 => make::<f64>(len),
    }
}

/// Makes glibc keep the memory of freed CPU batches for the next ones
/// instead of giving it back to the kernel after every few batches.
///
/// A CPU batch is fresh memory (it becomes the tensor), freed by the
/// training loop. glibc gives a heap's free top back to the kernel once
/// it exceeds twice its mmap threshold, which starts at 128 KiB, so with
/// batches of a few hundred KiB (a token batch is 131 KiB) the heap
/// shrinks and regrows all the time and each batch's pages are faulted in
/// anew: 20 faults a batch took the token loader from 65% to 30% of the
/// bare copy loop in `cargo bench -p benches --bench maps`. glibc raises
/// the threshold (and the trim threshold with it, to twice as much) to
/// the size of any block it had mapped on its own and that is freed,
/// up to 32 MiB (mallopt(3), "dynamic mmap threshold"), so one such block
/// of the loader's batch memory, allocated and freed here, does it; any
/// program that frees a large buffer has the same effect (an image
/// batch does). Only glibc on Linux; elsewhere nothing.
pub(crate) fn keep_batch_memory(schema: &Schema, batches: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const MAX: usize = 32 << 20;
        let bytes = schema.batch_bytes().saturating_mul(batches).min(MAX);
        if bytes > 128 << 10 {
            // Never touched, so never faulted in: glibc maps it and unmaps
            // it on free, which is what moves the thresholds.
            let block: Vec<u8> = Vec::with_capacity(bytes);
            drop(std::hint::black_box(block));
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (schema, batches);
}

/// A new zeroed heap buffer for a batch of `schema`.
pub(crate) fn heap(schema: &Schema) -> HostBuf {
    HostBuf::Heap(
        schema
            .fields
            .iter()
            .map(|f| zeroed(f.field.dtype, schema.batch * f.field.sample_elems()))
            .collect(),
    )
}
