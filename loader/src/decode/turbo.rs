//! JPEG decoding with libjpeg-turbo (feature `turbojpeg`): only the crop
//! window is decoded (rows below it are never entropy-decoded, columns and
//! rows outside it are never inverse-transformed), and when the window is at
//! least twice the output size the DCT itself downscales by 2, 4 or 8, as
//! PIL's `draft` and tf.image.decode_and_crop_jpeg do.
//!
//! Anything libjpeg-turbo cannot do here (CMYK, an unusual subsampling, a
//! corrupt file) returns `None`, and the caller decodes with zune-jpeg,
//! which gives the error that names the file.

use crate::decode::limits::MAX_ALLOC;
use crate::geometry::Crop;
use std::cell::RefCell;
use turbojpeg_sys as tj;

/// iMCU width per TJSAMP value (turbojpeg.h's `tjMCUWidth`, a header-only
/// table that the library does not export).
const MCU_WIDTH: [usize; 7] = [8, 16, 16, 8, 8, 32, 8];

/// A per-thread decompressor, destroyed with its thread.
struct Handle(tj::tjhandle);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful `tj3Init` and is destroyed
        // exactly once, here.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

thread_local! {
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

/// What was decoded: a `width x height` RGB region holding the crop window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) width: usize,
    pub(crate) height: usize,
    /// The crop window, relative to the region, in region pixels.
    pub(crate) crop: Crop,
    pub(crate) flip: bool,
}

/// Decodes the part of JPEG `bytes` that the crop chosen by `params` (given
/// the full image size) needs, for an output of `out_w x out_h`, into `out`.
pub(crate) fn decode_region(
    bytes: &[u8],
    out: &mut Vec<u8>,
    (out_w, out_h): (usize, usize),
    params: impl FnOnce(usize, usize) -> (Crop, bool),
) -> Option<Region> {
    HANDLE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            // SAFETY: plain constructor; a null result is checked below.
            let h = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as std::ffi::c_int) };
            if h.is_null() {
                return None;
            }
            *slot = Some(Handle(h));
        }
        let handle = slot.as_ref()?.0;
        decode_with(handle, bytes, out, (out_w, out_h), params)
    })
}

fn decode_with(
    handle: tj::tjhandle,
    bytes: &[u8],
    out: &mut Vec<u8>,
    (out_w, out_h): (usize, usize),
    params: impl FnOnce(usize, usize) -> (Crop, bool),
) -> Option<Region> {
    // SAFETY: `handle` is a live decompressor; `bytes` is valid for its length.
    let ok = unsafe { tj::tj3DecompressHeader(handle, bytes.as_ptr(), bytes.len() as tj::size_t) };
    if ok != 0 {
        return None;
    }
    // SAFETY: reading parameters of a live handle.
    let get = |p: tj::TJPARAM| unsafe { tj::tj3Get(handle, p as std::ffi::c_int) };
    let (w, h) = (
        get(tj::TJPARAM_TJPARAM_JPEGWIDTH),
        get(tj::TJPARAM_TJPARAM_JPEGHEIGHT),
    );
    let subsamp = get(tj::TJPARAM_TJPARAM_SUBSAMP);
    let colorspace = get(tj::TJPARAM_TJPARAM_COLORSPACE);
    let lossless = get(tj::TJPARAM_TJPARAM_LOSSLESS);
    if w <= 0 || h <= 0 || lossless == 1 || !(0..7).contains(&subsamp) {
        return None;
    }
    if colorspace == tj::TJCS_TJCS_CMYK as std::ffi::c_int
        || colorspace == tj::TJCS_TJCS_YCCK as std::ffi::c_int
    {
        return None;
    }
    let (w, h) = (w as usize, h as usize);
    if (w * h * 3) as u64 > MAX_ALLOC {
        return None;
    }
    let (crop, flip) = params(w, h);

    // DCT-domain downscale while the window stays at least the output size.
    let k = crate::decode::dct_scale(&crop, (out_w, out_h));
    let scaled = |d: usize| d.div_ceil(k);
    let (sw, sh) = (scaled(w), scaled(h));
    let mcu = scaled(MCU_WIDTH[subsamp as usize]).max(1);
    let (cx, cy) = (crop.left / k as f64, crop.top / k as f64);
    let (cw, ch) = (crop.width / k as f64, crop.height / k as f64);
    let x0 = (cx.floor() as usize / mcu) * mcu;
    let y0 = cy.floor() as usize;
    let x1 = ((cx + cw).ceil() as usize).min(sw);
    let y1 = ((cy + ch).ceil() as usize).min(sh);
    if x1 <= x0 || y1 <= y0 {
        return None;
    }
    let (rw, rh) = (x1 - x0, y1 - y0);

    let factor = tj::tjscalingfactor {
        num: 1,
        denom: k as std::ffi::c_int,
    };
    let region = tj::tjregion {
        x: x0 as std::ffi::c_int,
        y: y0 as std::ffi::c_int,
        w: rw as std::ffi::c_int,
        h: rh as std::ffi::c_int,
    };
    // SAFETY: live handle, plain-value arguments.
    let set = unsafe {
        tj::tj3SetScalingFactor(handle, factor) == 0
            && tj::tj3SetCroppingRegion(handle, region) == 0
    };
    if !set {
        return None;
    }
    if out.len() < rw * rh * 3 {
        out.resize(rw * rh * 3, 0);
    }
    // SAFETY: `out` holds at least `rh` rows of `rw * 3` bytes, the size of
    // the cropping region set above, so the decoder writes inside it.
    let ok = unsafe {
        tj::tj3Decompress8(
            handle,
            bytes.as_ptr(),
            bytes.len() as tj::size_t,
            out.as_mut_ptr(),
            (rw * 3) as std::ffi::c_int,
            tj::TJPF_TJPF_RGB as std::ffi::c_int,
        )
    };
    if ok != 0 {
        return None;
    }
    Some(Region {
        width: rw,
        height: rh,
        crop: Crop {
            left: cx - x0 as f64,
            top: cy - y0 as f64,
            width: cw.min(rw as f64 - (cx - x0 as f64)),
            height: ch.min(rh as f64 - (cy - y0 as f64)),
        },
        flip,
    })
}

#[cfg(test)]
mod tests {
    use crate::decode::decode_rgb_into;
    use crate::geometry::Size;
    use crate::layout::{HostLayout, Slot};
    use crate::transform::{ImageTransform, Transforms};
    use image::{ImageFormat, Rgb, RgbImage};

    fn jpeg(w: u32, h: u32) -> Vec<u8> {
        let img = RgbImage::from_fn(w, h, |x, y| {
            Rgb([
                (x * 255 / w) as u8,
                (y * 255 / h) as u8,
                ((x + 2 * y) % 256) as u8,
            ])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    /// Mean absolute difference between the libjpeg-turbo crop path and a
    /// full zune-jpeg decode with the same crop, for sample `index`.
    fn mean_diff(bytes: &[u8], t: &ImageTransform, index: usize) -> f64 {
        let mut a = vec![0u8; t.slot_len()];
        t.apply("t", bytes, 0, index, Slot::U8(&mut a)).unwrap();
        let mut px = Vec::new();
        let wh = decode_rgb_into("t", bytes, &mut px).unwrap();
        let mut b = vec![0u8; t.slot_len()];
        t.apply_decoded("t", &px, wh, 0, index, Slot::U8(&mut b))
            .unwrap();
        a.iter()
            .zip(&b)
            .map(|(x, y)| x.abs_diff(*y) as f64)
            .sum::<f64>()
            / a.len() as f64
    }

    #[test]
    fn crop_decode_matches_full_decode() {
        let bytes = jpeg(403, 354);
        let t = ImageTransform::new(Transforms::train(), HostLayout::U8Nhwc, Size::square(64), 3)
            .unwrap();
        for index in 0..20 {
            let d = mean_diff(&bytes, &t, index);
            // DCT downscaling (crops >= 2x the output) differs a little from
            // an antialiased resize of the full decode; plain crops barely.
            assert!(d < 3.0, "sample {index}: mean difference {d}");
        }
        let t = ImageTransform::new(
            Transforms::eval(224),
            HostLayout::U8Nhwc,
            Size::square(224),
            0,
        )
        .unwrap();
        assert!(mean_diff(&bytes, &t, 0) < 1.5);
    }
}
