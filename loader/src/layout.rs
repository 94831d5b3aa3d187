//! What a batch buffer holds: the output's element type and layout, and
//! one sample's slot in it. A leaf: the pool, the device uploaders and the
//! transforms all speak it, and it depends on none of them.

/// ImageNet's per-channel mean, on the 0..1 scale.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation, on the 0..1 scale.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// What the batch images are: the loader's one output setting
/// ([`crate::LoaderBuilder::output`]).
///
/// ```
/// use candle_wick::{FloatType, NormalizeAt, Output};
/// let bf16_on_the_gpu = Output::imagenet()
///     .with_dtype(FloatType::BF16)
///     .normalized_at(NormalizeAt::Device);
/// # let _ = bf16_on_the_gpu;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Output {
    /// `u8`, shape `[batch, height, width, 3]`, values as decoded.
    U8Nhwc,
    /// Floats, shape `[batch, 3, height, width]`,
    /// `(v / 255 - mean[c]) / std[c]`.
    Normalized {
        /// Per-channel mean on the 0..1 scale.
        mean: [f32; 3],
        /// Per-channel standard deviation on the 0..1 scale (non-zero).
        std: [f32; 3],
        /// Element type of the image tensors.
        dtype: FloatType,
        /// Where the conversion happens.
        at: NormalizeAt,
    },
}

impl Output {
    /// `f32` NCHW normalized with ImageNet's mean and std, where
    /// [`NormalizeAt::Auto`] puts it (the default output).
    pub fn imagenet() -> Self {
        Self::normalized(IMAGENET_MEAN, IMAGENET_STD)
    }

    /// `f32` NCHW normalized with `mean` and `std` (0..1 scale).
    pub fn normalized(mean: [f32; 3], std: [f32; 3]) -> Self {
        Output::Normalized {
            mean,
            std,
            dtype: FloatType::F32,
            at: NormalizeAt::Auto,
        }
    }

    /// The same normalized output as `dtype` (`U8Nhwc` stays `u8`).
    pub fn with_dtype(self, dtype: FloatType) -> Self {
        match self {
            Output::Normalized { mean, std, at, .. } => Output::Normalized {
                mean,
                std,
                dtype,
                at,
            },
            other => other,
        }
    }

    /// The same normalized output, computed where `at` says (`U8Nhwc` is
    /// written by the workers as decoded).
    pub fn normalized_at(self, at: NormalizeAt) -> Self {
        match self {
            Output::Normalized {
                mean, std, dtype, ..
            } => Output::Normalized {
                mean,
                std,
                dtype,
                at,
            },
            other => other,
        }
    }
}

/// The float element type of [`Output::Normalized`] images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FloatType {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16, converted on the device.
    BF16,
    /// IEEE half precision, converted on the device.
    F16,
}

impl From<FloatType> for candle_core::DType {
    fn from(t: FloatType) -> Self {
        match t {
            FloatType::F32 => candle_core::DType::F32,
            FloatType::BF16 => candle_core::DType::BF16,
            FloatType::F16 => candle_core::DType::F16,
        }
    }
}

/// Where the `u8 -> float` conversion, NCHW permutation and normalization
/// of [`Output::Normalized`] happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NormalizeAt {
    /// On the device for GPUs, on the host for the CPU.
    #[default]
    Auto,
    /// The decode workers write normalized `f32` NCHW; `f32` is uploaded.
    Host,
    /// The workers write `u8` NHWC, which is uploaded and normalized on the
    /// device in one fused pass (as FFCV and DALI do), with the same bits as
    /// the host's normalization.
    Device,
}

/// What the decode workers write into a batch buffer: the host's side of
/// an [`Output`] (`u8` when the device normalizes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HostLayout {
    /// `u8`, shape `[batch, height, width, 3]`, values as decoded.
    U8Nhwc,
    /// `f32`, shape `[batch, 3, height, width]`, `(v / 255 - mean[c]) / std[c]`.
    F32Nchw {
        /// Per-channel mean on the 0..1 scale.
        mean: [f32; 3],
        /// Per-channel standard deviation on the 0..1 scale.
        std: [f32; 3],
    },
}

impl HostLayout {
    /// `f32` NCHW normalized with ImageNet's mean and std.
    pub fn imagenet() -> Self {
        HostLayout::F32Nchw {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }
}

/// One sample's slot in a batch buffer.
#[derive(Debug)]
pub enum Slot<'a> {
    /// For [`HostLayout::U8Nhwc`]: `height * width * 3` bytes.
    U8(&'a mut [u8]),
    /// For [`HostLayout::F32Nchw`]: `3 * height * width` floats.
    F32(&'a mut [f32]),
}

/// `(x / 255 - mean) / std` as `x * scale + bias` per channel: the one
/// place both the host's table and the device's fused normalize take their
/// coefficients from, so the two give the same bits.
pub(crate) fn normalize_coefficients(mean: [f32; 3], std: [f32; 3]) -> ([f32; 3], [f32; 3]) {
    (
        std.map(|s| 1.0 / (255.0 * s)),
        [0, 1, 2].map(|c| -mean[c] / std[c]),
    )
}
