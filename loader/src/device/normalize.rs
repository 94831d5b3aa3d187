//! The device-side normalize: [`Finish`], what becomes of a batch's images
//! once on the device (the output's float type, and where it is normalized),
//! and the fused op it runs: `u8 [n, h, w, 3]` → float `[n, 3, h, w]`,
//! `x * scale[c] + bias[c]` as one fused multiply-add per element, rounded
//! once to the output type (f32, or f32 → f16/bf16 to nearest even).
//!
//! That is the host's arithmetic (`ImageTransform`'s table is built with the
//! same `mul_add` from the same `scale` and `bias`), so a batch normalized on
//! the device has the same bits as one normalized by the decode workers. One
//! pass reads 3 bytes and writes 3 floats per pixel; the chain of candle ops
//! it replaces (cast, permute, two strided broadcasts) read and wrote about
//! five times as much and uploaded two stride tables per batch.
//!
//! A candle [`CustomOp1`]: the CPU implementation runs on CPU devices, the
//! CUDA one (`normalize.cu`, compiled to PTX by `build.rs`) on CUDA, and the
//! CUDA uploader launches the same kernel on its staging ring.

use super::On;
use crate::error::{Error, Result};
use crate::layout::{HostLayout, NormalizeAt, Output};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

/// Per-channel `scale` and `bias` and the output type of the normalize.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NormalizeU8 {
    pub(crate) scale: [f32; 3],
    pub(crate) bias: [f32; 3],
    /// F32, F16 or BF16.
    pub(crate) dtype: DType,
}

impl NormalizeU8 {
    /// The normalize of `(x / 255 - mean) / std`, computed as the host does.
    pub(crate) fn new(mean: [f32; 3], std: [f32; 3], dtype: DType) -> Self {
        let (scale, bias) = crate::layout::normalize_coefficients(mean, std);
        Self { scale, bias, dtype }
    }

    /// Applies the op to a `u8 [n, h, w, 3]` tensor.
    pub(crate) fn apply(&self, images: &Tensor) -> candle_core::Result<Tensor> {
        images.apply_op1_no_bwd(self)
    }

    fn out_shape(layout: &Layout) -> candle_core::Result<(usize, usize, usize, Shape)> {
        match layout.shape().dims() {
            &[n, h, w, 3] => Ok((n, h, w, Shape::from((n, 3, h, w)))),
            dims => candle_core::bail!("normalize expects u8 [n, h, w, 3], got {dims:?}"),
        }
    }

    fn plane<T>(&self, src: &[u8], pixels: usize, to: impl Fn(f32) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(src.len());
        for image in src.chunks_exact(3 * pixels) {
            for c in 0..3 {
                let (s, b) = (self.scale[c], self.bias[c]);
                out.extend(
                    image[c..]
                        .iter()
                        .step_by(3)
                        .map(|&v| to((v as f32).mul_add(s, b))),
                );
            }
        }
        out
    }
}

impl CustomOp1 for NormalizeU8 {
    fn name(&self) -> &'static str {
        "wick-normalize-u8"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, h, w, shape) = Self::out_shape(layout)?;
        let CpuStorage::U8(data) = storage else {
            candle_core::bail!(
                "normalize expects u8 images, got {:?}",
                candle_core::backend::BackendStorage::dtype(storage)
            );
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("normalize expects contiguous images");
        };
        let src = &data[start..end];
        let out = match self.dtype {
            DType::F32 => CpuStorage::F32(self.plane(src, h * w, |v| v)),
            DType::F16 => CpuStorage::F16(self.plane(src, h * w, half::f16::from_f32)),
            DType::BF16 => CpuStorage::BF16(self.plane(src, h * w, half::bf16::from_f32)),
            d => candle_core::bail!("normalize writes f32, f16 or bf16, not {d:?}"),
        };
        Ok((out, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda::cudarc::driver::DevicePtr;
        let (n, h, w, shape) = Self::out_shape(layout)?;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("normalize expects contiguous images");
        };
        let dev = storage.device().clone();
        let src = storage.as_cuda_slice::<u8>()?.slice(start..end);
        let stream = dev.cuda_stream();
        // The input's pointer through cudarc's tracking: the launch stream
        // waits for its last write and records this read.
        let (src_ptr, _read) = src.device_ptr(&stream);
        let out = cuda::launch(&dev, self, src_ptr, n, h * w)?;
        Ok((out, shape))
    }
}

/// What becomes of the images after they reach the device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Finish {
    /// The fused normalize of uploaded u8, or `None` when the host already
    /// wrote the output's values.
    pub(crate) normalize: Option<NormalizeU8>,
    /// The images' final element type.
    pub(crate) dtype: DType,
    /// What the decode workers write.
    pub(crate) host: HostLayout,
}

impl Finish {
    /// Validates the output and picks where to normalize.
    pub(crate) fn new(output: Output, device: &Device) -> Result<Self> {
        let Output::Normalized {
            mean,
            std,
            dtype,
            at,
        } = output
        else {
            return Ok(Self {
                normalize: None,
                dtype: DType::U8,
                host: HostLayout::U8Nhwc,
            });
        };
        let dtype = DType::from(dtype);
        if std.iter().any(|s| !s.is_finite() || *s == 0.0) {
            return Err(Error::InvalidConfig(format!(
                "normalize std must be non-zero, got {std:?}"
            )));
        }
        let on_device = match at {
            NormalizeAt::Host => false,
            NormalizeAt::Device => true,
            _ => !device.is_cpu(),
        };
        Ok(Self {
            normalize: on_device.then(|| NormalizeU8::new(mean, std, dtype)),
            dtype,
            host: if on_device {
                HostLayout::U8Nhwc
            } else {
                HostLayout::F32Nchw { mean, std }
            },
        })
    }

    /// What the decode workers write: u8 when the device normalizes.
    pub(crate) fn host_layout(&self) -> HostLayout {
        self.host
    }

    /// Converts images already on the device (CPU, Metal).
    pub(super) fn apply(&self, images: Tensor) -> Result<Tensor> {
        self.convert(images)
            .on("normalizing or converting a batch on the device")
    }

    fn convert(&self, images: Tensor) -> candle_core::Result<Tensor> {
        let images = match &self.normalize {
            Some(op) if images.device().is_metal() => {
                // No Metal kernel for the fused op: candle's cast, permute
                // and per-channel broadcasts (two roundings where the fused
                // op has one: within an ulp of the host's values).
                let (scale, bias) = (
                    Tensor::from_slice(&op.scale, (1, 3, 1, 1), images.device())?,
                    Tensor::from_slice(&op.bias, (1, 3, 1, 1), images.device())?,
                );
                images
                    .to_dtype(DType::F32)?
                    .permute((0, 3, 1, 2))?
                    .broadcast_mul(&scale)?
                    .broadcast_add(&bias)?
                    .to_dtype(op.dtype)?
            }
            Some(op) => op.apply(&images)?,
            None => images,
        };
        if images.dtype() == self.dtype {
            Ok(images)
        } else {
            images.to_dtype(self.dtype)
        }
    }
}

#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    //! The kernel launch, shared by the custom op and the CUDA uploader.

    use super::NormalizeU8;
    use candle_core::cuda::cudarc::driver::{DevicePtrMut, LaunchConfig, PushKernelArg};
    use candle_core::cuda::WrapErr;
    use candle_core::{CudaDevice, CudaStorage, DType};

    use candle_core::cuda::cudarc::driver::{CudaFunction, CudaModule};
    use candle_core::cuda::cudarc::nvrtc::Ptx;
    use std::sync::{Arc, Mutex};

    /// SASS for the build's `CUDA_COMPUTE_CAP` and PTX for other GPUs
    /// (`build.rs`).
    const FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/normalize.fatbin"));

    /// The kernel `name`, its module loaded once per CUDA context. candle's
    /// own module cache (`get_or_load_custom_func`) takes PTX text only,
    /// which the driver compiles on a process's first use; a fatbin with
    /// SASS for this GPU loads without that. A module keeps its context
    /// alive (it holds an `Arc` of it), so a context's address is never
    /// reused while its entry is here.
    fn function(dev: &CudaDevice, name: &str) -> candle_core::Result<CudaFunction> {
        static MODULES: Mutex<Vec<(usize, Arc<CudaModule>)>> = Mutex::new(Vec::new());
        let ctx = dev.cuda_stream().context().clone();
        let key = ctx.cu_ctx() as usize;
        let mut modules = crate::sync::lock(&MODULES);
        let module = match modules.iter().find(|(k, _)| *k == key) {
            Some((_, m)) => m.clone(),
            None => {
                let m = ctx.load_module(Ptx::from_binary(FATBIN.to_vec())).w()?;
                modules.push((key, m.clone()));
                m
            }
        };
        drop(modules);
        module.load_function(name).w()
    }

    /// Allocates the output on `dev`'s stream and enqueues the kernel there,
    /// reading `n` images of `pixels` pixels from the device address `src`.
    /// The output's write is recorded in cudarc's tracking.
    pub(crate) fn launch(
        dev: &CudaDevice,
        op: &NormalizeU8,
        src: u64,
        n: usize,
        pixels: usize,
    ) -> candle_core::Result<CudaStorage> {
        let total = n * pixels;
        let name = match op.dtype {
            DType::F32 => "wick_normalize_f32",
            DType::F16 => "wick_normalize_f16",
            DType::BF16 => "wick_normalize_bf16",
            d => candle_core::bail!("normalize writes f32, f16 or bf16, not {d:?}"),
        };
        let func = function(dev, name)?;
        // Grid-stride loop: enough blocks to fill the GPU, never more than
        // the work.
        let threads = 256u32;
        let blocks = total.div_ceil(threads as usize).clamp(1, 4096) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (pixels, total) = (pixels as u64, total as u64);
        let [s0, s1, s2] = op.scale;
        let [b0, b1, b2] = op.bias;
        macro_rules! run {
            ($t:ty) => {{
                // SAFETY: the kernel writes all `3 * total` elements before
                // anything reads them (it is the first work on the slice, on
                // the stream it was allocated on).
                // One element at least: a zero-byte allocation is an error.
                let mut out = unsafe { dev.alloc::<$t>((3 * total as usize).max(1)) }?;
                let stream = dev.cuda_stream();
                {
                    let (dst, _write) = out.device_ptr_mut(&stream);
                    let mut b = stream.launch_builder(&func);
                    b.arg(&src).arg(&dst).arg(&pixels).arg(&total);
                    b.arg(&s0).arg(&s1).arg(&s2).arg(&b0).arg(&b1).arg(&b2);
                    // SAFETY: the arguments match the kernel's signature
                    // (two device pointers, two u64, six f32); `src` holds
                    // `3 * total` bytes (the caller's contract) and `dst`
                    // `3 * total` elements of the kernel's output type.
                    unsafe { b.launch(cfg) }.w()?;
                }
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        Ok(match op.dtype {
            DType::F32 => run!(f32),
            DType::F16 => run!(half::f16),
            _ => run!(half::bf16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_the_host_table_bit_for_bit() {
        let (n, h, w) = (2, 3, 5);
        let pixels: Vec<u8> = (0..n * h * w * 3).map(|i| (i * 37 % 256) as u8).collect();
        let images = Tensor::from_vec(pixels.clone(), (n, h, w, 3), &Device::Cpu).unwrap();
        let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
        let op = NormalizeU8::new(mean, std, DType::F32);
        let out = op.apply(&images).unwrap();
        assert_eq!(out.dims(), &[n, 3, h, w]);
        let got = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let (img, c, p) = (i / (3 * h * w), i / (h * w) % 3, i % (h * w));
            let v = pixels[(img * h * w + p) * 3 + c];
            let scale = 1.0 / (255.0 * std[c]);
            let want = (v as f32).mul_add(scale, -mean[c] / std[c]);
            assert_eq!(g.to_bits(), want.to_bits(), "element {i}");
        }
        for dtype in [DType::F16, DType::BF16] {
            let half = NormalizeU8::new(mean, std, dtype).apply(&images).unwrap();
            let want = out.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
            let got = half.to_dtype(DType::F32).unwrap();
            let (a, b) = (
                got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert_eq!(a, b, "{dtype:?}");
        }
    }

    #[test]
    fn rejects_other_shapes_and_types() {
        let op = NormalizeU8::new([0.5; 3], [0.5; 3], DType::F32);
        let rgba = Tensor::zeros((1, 2, 2, 4), DType::U8, &Device::Cpu).unwrap();
        assert!(op.apply(&rgba).is_err());
        let floats = Tensor::zeros((1, 2, 2, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(op.apply(&floats).is_err());
    }
}
