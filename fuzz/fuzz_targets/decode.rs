//! Every decoder the loader reaches, on arbitrary bytes behind a format's
//! signature (the first byte picks PNG, WebP, BMP, GIF, TIFF (little- or
//! big-endian), JPEG or none), as
//! the loader and `wick inspect` call them: the header limits, the whole
//! decode, and the fused decode + crop path.
#![no_main]
use candle_wick::__bench::{decode_rgb_into, HostLayout, ImageTransform, Slot};
use candle_wick::{Size, Transforms};
use libfuzzer_sys::fuzz_target;

const MAGIC: [&[u8]; 8] = [
    b"\x89PNG\r\n\x1a\n",
    b"RIFF\0\0\0\0WEBP",
    b"BM",
    b"GIF89a",
    b"II*\0",
    b"MM\0*",
    b"\xFF\xD8",
    b"",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = MAGIC[usize::from(pick) % MAGIC.len()].to_vec();
    bytes.extend_from_slice(rest);
    let mut px = Vec::new();
    let _ = decode_rgb_into("fuzz", &bytes, &mut px);
    let t = ImageTransform::new(Transforms::eval(16), HostLayout::U8Nhwc, Size::new(16, 16), 0)
        .unwrap();
    let mut slot = vec![0u8; t.slot_len()];
    let _ = t.apply("fuzz", &bytes, 0, 0, Slot::U8(&mut slot));
});
