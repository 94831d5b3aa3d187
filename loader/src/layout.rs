//! What a batch buffer holds: the output's element type and layout, and
//! one sample's slot in it. A leaf: the pool, the device uploaders and the
//! transforms all speak it, and it depends on none of them.

/// ImageNet's per-channel mean, on the 0..1 scale.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation, on the 0..1 scale.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The element type and layout of the batch images.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Output {
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

impl Output {
    /// `f32` NCHW normalized with ImageNet's mean and std.
    pub fn imagenet() -> Self {
        Output::F32Nchw {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }
}

/// One sample's slot in a batch buffer.
#[derive(Debug)]
pub enum Slot<'a> {
    /// For [`Output::U8Nhwc`]: `height * width * 3` bytes.
    U8(&'a mut [u8]),
    /// For [`Output::F32Nchw`]: `3 * height * width` floats.
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
