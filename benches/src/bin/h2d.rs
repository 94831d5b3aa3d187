//! Host-to-device bandwidth on a CUDA GPU (`--features cuda`): a plain
//! pageable `Tensor::from_slice` upload, the device's pinned-memory peak
//! (`cuMemcpyHtoDAsync` from page-locked memory), and the loader's copies
//! (pinned pool + copy stream) of u8 batches of 64x224x224x3, timed with
//! events on the copy stream (`Stats::copy_gbps`), beside the upload
//! thread's own time per batch (enqueueing, not bandwidth).

use candle_core::cuda::cudarc::driver::PinnedHostSlice;
use candle_core::cuda::WrapErr;
use candle_core::{Device, Tensor};
use candle_wick::source::ImageFolder;
use candle_wick::{Loader, Output};
use std::time::Instant;

const BATCH_BYTES: usize = 64 * 224 * 224 * 3;
const REPS: usize = 50;

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::new_cuda_with_stream(0)?;
    let cuda = device.as_cuda_device()?;
    let stream = cuda.cuda_stream();
    let host = vec![7u8; BATCH_BYTES];

    // Pageable: what `Tensor::from_slice` does with an ordinary Vec.
    let _ = Tensor::from_slice(&host, BATCH_BYTES, &device)?;
    device.synchronize()?;
    let t = Instant::now();
    for _ in 0..REPS {
        let _ = Tensor::from_slice(&host, BATCH_BYTES, &device)?;
    }
    device.synchronize()?;
    let pageable = gbps(BATCH_BYTES * REPS, t.elapsed().as_secs_f64());

    // Pinned peak: page-locked source, async copy, one sync at the end.
    // SAFETY: flags 0 = plain page-locked memory; it is zeroed before use.
    let mut pinned: PinnedHostSlice<u8> =
        unsafe { stream.context().alloc_pinned_with_flags(BATCH_BYTES, 0) }.w()?;
    let ptr = pinned.as_mut_ptr().w()?;
    // SAFETY: `ptr` is valid for BATCH_BYTES bytes, freshly allocated.
    unsafe { std::ptr::write_bytes(ptr, 7, BATCH_BYTES) };
    // SAFETY: fully written by each copy before any read.
    let mut dst = unsafe { stream.alloc::<u8>(BATCH_BYTES) }.w()?;
    stream.memcpy_htod(&pinned, &mut dst).w()?;
    stream.synchronize().w()?;
    let t = Instant::now();
    for _ in 0..REPS {
        stream.memcpy_htod(&pinned, &mut dst).w()?;
    }
    stream.synchronize().w()?;
    let peak = gbps(BATCH_BYTES * REPS, t.elapsed().as_secs_f64());

    println!("h2d pageable Tensor::from_slice: {pageable:.1} GB/s");
    println!("h2d pinned peak (cuMemcpyHtoDAsync): {peak:.1} GB/s");

    // The loader: upload cost per batch as its stats see it, over a dataset
    // given on the command line (an ImageFolder).
    if let Some(dir) = std::env::args().nth(1) {
        let mut loader = Loader::builder(ImageFolder::new(&dir)?)
            .batch_size(64)
            .image_size(224)
            .train_transforms()
            .output(Output::U8Nhwc)
            .device(device.clone())
            .build()?;
        let t = Instant::now();
        let mut n = 0;
        for b in loader.epoch(0) {
            n += b?.len();
        }
        device.synchronize()?;
        let s = loader.stats();
        println!(
            "loader: {n} images in {:.2?} ({:.0}/s); copy stream {:.1} GB/s ({:.3} ms per batch, \
             events); upload thread {:.3} ms per batch; {} pinned buffers",
            t.elapsed(),
            n as f64 / t.elapsed().as_secs_f64(),
            s.copy_gbps,
            s.copy_per_batch.as_secs_f64() * 1e3,
            s.upload_per_batch.as_secs_f64() * 1e3,
            s.pinned_buffers
        );
    }
    Ok(())
}
