//! The quick start of the README and the book: an image-classification
//! loop over an ImageFolder (`DIR/<class>/<image>`).
//!
//! ```text
//! cargo run --release -p candle-wick --example quickstart -- DIR
//! ```
//!
//! Without `DIR` it reads `data/train`. It prints each epoch's batch count
//! and the loader's starvation report (no model: the loop only counts).

// ANCHOR: quickstart
use candle_core::Device;
use candle_wick::source::ImageFolder;
use candle_wick::Loader;

fn main() -> candle_wick::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "data/train".into());
    let device = Device::Cpu; // or Device::new_cuda(0)? with --features cuda
    let mut loader = Loader::builder(ImageFolder::new(&dir)?)
        .batch_size(128)
        .image_size(224)
        .train_transforms() // RandomResizedCrop(0.08..1, 3/4..4/3) + horizontal flip
        .shuffle(42) // a new permutation every epoch, reproducible
        .device(device) // batches arrive as tensors on it
        .build()?; // workers, batches in flight, prefetch: AUTOTUNE
    for epoch in 0..3 {
        let mut batches = 0;
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            let _images = batch.images()?; // f32 [128, 3, 224, 224], ImageNet-normalized
            let _labels = batch.labels()?; // u32 [128]
            batches += 1; // batch.keys and batch.indices name every sample
        }
        println!("epoch {epoch}: {batches} batches");
    }
    println!("{}", loader.stats().report());
    Ok(())
}
// ANCHOR_END: quickstart
