//! The window JPEG decoder (and zune-jpeg behind it) through the fused
//! decode + RandomResizedCrop path, on arbitrary bytes.
#![no_main]
use candle_wick::__bench::{HostLayout, ImageTransform, Slot};
use candle_wick::{Size, Transforms};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let t = ImageTransform::new(Transforms::train(), HostLayout::U8Nhwc, Size::new(32, 32), 0).unwrap();
    let mut slot = vec![0u8; t.slot_len()];
    for index in 0..2 {
        let _ = t.apply("fuzz", data, 0, index, Slot::U8(&mut slot));
    }
});
