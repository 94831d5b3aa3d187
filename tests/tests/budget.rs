//! The RAM budget holds: with a tiny budget and large images AUTOTUNE keeps
//! one worker and the minimum buffers, and the loader's accounted peak stays
//! under the budget; a budget too small for the explicit settings is an
//! error. The heap the loader really holds is measured with a counting
//! allocator (so this binary has one test).

use candle_wick::source::ImageFolder;
use candle_wick::{Loader, Output, Transforms};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

/// Bytes allocated and not yet freed, by anyone in this process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to `System` with the caller's arguments;
// the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Relaxed);
        // SAFETY: `ptr` came from `System` with `layout`; the caller's
        // contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn tiny_budget_bounds_memory_not_progress() {
    let dir = tempfile::tempdir().unwrap();
    // 48 images of 900x700: ~1.9 MB decoded each.
    for i in 0..48u32 {
        let img = tests::pattern(900, 700, i);
        let path = dir.path().join(format!("c{}/{i}.png", i % 2));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        img.save(&path).unwrap();
    }
    let build = |budget: u64| {
        Loader::builder(ImageFolder::new(dir.path()).unwrap())
            .batch_size(2)
            .image_size(32)
            .transforms(Transforms::train())
            .output(Output::U8Nhwc)
            .shard(0, 1)
            .ram_budget(budget)
            .build()
    };
    // Four batch buffers (2 x 32 x 32 x 3) plus one worker's scratch (the
    // decoded image and the file's bytes, kept for the next read) fit in
    // 4 MB; a second worker's scratch does not.
    let budget = 4_000_000;
    let before = LIVE.load(Relaxed);
    let mut l = build(budget).unwrap();
    let mut n = 0;
    for epoch in 0..3 {
        for b in l.epoch(epoch) {
            n += b.unwrap().len();
        }
    }
    assert_eq!(n, 144, "every sample still delivered");
    let s = l.stats();
    // What the loader holds between epochs (its buffers, its workers'
    // decode scratch, its bookkeeping) really is under the budget: decode
    // scratch is one set per active worker, not one per pool thread.
    let held = LIVE.load(Relaxed) - before;
    eprintln!(
        "heap held {held} bytes; accounted {} (scratch {} in {})",
        s.memory, s.decode_scratch_bytes, s.decode_scratches
    );
    assert_eq!(s.decode_scratches, 1, "{}", s.report());
    assert!(held <= budget as isize, "{held} > {budget}: {}", s.report());
    assert!(
        s.memory_peak > 0 && s.memory_peak <= budget,
        "{}",
        s.report()
    );
    // Whatever AUTOTUNE measured, a second worker never fit. (That it grows
    // a knob only when it fits, and what it grows when there is room, is
    // its decision function's to show, without a clock: the unit tests of
    // `tune/policy.rs`.)
    assert_eq!(l.workers(), 1, "{:?}", l.autotune_history());
    let h = l.autotune_history();
    assert!(h.iter().all(|t| t.workers == 1), "{h:?}");

    // Below what four 6 KB batch buffers need: an error that says so.
    let err = build(20_000).unwrap_err().to_string();
    assert!(err.contains("ram_budget"), "{err}");
}
