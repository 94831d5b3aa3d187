//! Heap allocations per sample in steady state, counted by a global
//! allocator: the fused decode+transform path alone, and the whole loader
//! (which adds per-batch bookkeeping: keys, labels, tensors).

use candle_wick::__bench::{HostLayout, ImageTransform, Slot};
use candle_wick::source::ImageFolder;
use candle_wick::{Loader, Output, Size, Source, Transforms};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: forwarded as received (see the impl's comment).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(new_size as u64, Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    let (a, b) = (ALLOCS.load(Relaxed), BYTES.load(Relaxed));
    let r = f();
    (r, ALLOCS.load(Relaxed) - a, BYTES.load(Relaxed) - b)
}

fn main() {
    let dir = benches::imagenet_like(&benches::data_root(), 500).expect("bench dataset");
    let folder = ImageFolder::new(&dir).expect("folder");
    let files: Vec<Vec<u8>> = (0..200)
        .map(|i| folder.read(i).expect("read").bytes)
        .collect();
    let n = files.len() as f64;

    let mut buf = Vec::new();
    let mut decode_pass = || {
        for j in &files {
            candle_wick::__bench::decode_rgb_into("bench", j, &mut buf).expect("decode");
        }
    };
    decode_pass();
    let ((), allocs, bytes) = count(decode_pass);
    println!(
        "decode alone ({}): {:.2} allocations/sample, {:.0} bytes/sample",
        candle_wick::__bench::JPEG_DECODER,
        allocs as f64 / n,
        bytes as f64 / n
    );

    for (name, output) in [("u8", HostLayout::U8Nhwc), ("f32", HostLayout::imagenet())] {
        let t = ImageTransform::new(Transforms::train(), output, Size::new(224, 224), 0)
            .expect("transform");
        let mut u8s = vec![0u8; t.slot_len()];
        let mut f32s = vec![0f32; t.slot_len()];
        let mut pass = |epoch| {
            for (i, j) in files.iter().enumerate() {
                let slot = match output {
                    HostLayout::U8Nhwc => Slot::U8(&mut u8s),
                    HostLayout::F32Nchw { .. } => Slot::F32(&mut f32s),
                };
                t.apply("bench", j, epoch, i, slot).expect("apply");
            }
        };
        pass(0); // warm-up: scratch buffers reach their size
        let ((), allocs, bytes) = count(|| pass(1));
        println!(
            "fused decode+RRC+flip {name}: {:.2} allocations/sample, {:.0} bytes/sample",
            allocs as f64 / n,
            bytes as f64 / n
        );
    }

    let mut loader = Loader::builder(folder)
        .batch_size(64)
        .image_size(224)
        .train_transforms()
        .output(Output::U8Nhwc)
        .workers(2)
        .build()
        .expect("loader");
    let mut epoch = |e| {
        loader
            .epoch(e)
            .map(|b| b.expect("batch").len())
            .sum::<usize>()
    };
    epoch(0);
    let (samples, allocs, bytes) = count(|| epoch(1));
    println!(
        "loader end to end (u8, batch 64): {:.2} allocations/sample, {:.0} bytes/sample \
         (includes the batch tensors, {} bytes each)",
        allocs as f64 / samples as f64,
        bytes as f64 / samples as f64,
        224 * 224 * 3
    );
}
