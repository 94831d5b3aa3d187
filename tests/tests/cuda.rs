//! CUDA only (`--features cuda`, needs a GPU): batches uploaded through the
//! pinned pool and copy stream equal the CPU loader's bit for bit, also when
//! buffers are recycled as fast as possible under a slow consumer, with both
//! kinds of candle CUDA device.

use candle_core::{DType, Device};
use candle_wick::{ImageFolder, Loader, NormalizeAt, Output};
use std::time::Duration;
use tests::image_folder;

fn batches(
    root: &std::path::Path,
    device: Device,
    output: Output,
    prefetch: usize,
    in_flight: usize,
    slow: bool,
) -> Vec<(Vec<u8>, Vec<u32>)> {
    let mut loader = Loader::builder(ImageFolder::new(root).unwrap())
        .batch_size(8)
        .image_size(32)
        .train_transforms()
        .shuffle(7)
        .output(output)
        .normalize_at(NormalizeAt::Host)
        .prefetch(prefetch)
        .batches_in_flight(in_flight)
        .device(device)
        .build()
        .unwrap();
    loader
        .epoch(2)
        .map(|b| {
            let b = b.unwrap();
            if slow {
                std::thread::sleep(Duration::from_millis(30));
            }
            let images = b
                .images
                .to_device(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap();
            let bytes = match images.dtype() {
                DType::U8 => images.to_vec1::<u8>().unwrap(),
                _ => images
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            };
            (
                bytes,
                b.labels
                    .to_device(&Device::Cpu)
                    .unwrap()
                    .to_vec1::<u32>()
                    .unwrap(),
            )
        })
        .collect()
}

#[test]
fn gpu_batches_equal_cpu_batches_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 4, 21);
    for output in [Output::U8Nhwc, Output::imagenet()] {
        let cpu = batches(dir.path(), Device::Cpu, output, 2, 3, false);
        for device in [
            Device::new_cuda(0).unwrap(),
            Device::new_cuda_with_stream(0).unwrap(),
        ] {
            let gpu = batches(dir.path(), device, output, 2, 3, false);
            assert!(
                gpu == cpu,
                "{output:?}: GPU batches differ from CPU batches"
            );
        }
    }
}

#[test]
fn pinned_buffers_are_not_reused_before_their_copy_completes() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 4, 21);
    let cpu = batches(dir.path(), Device::Cpu, Output::U8Nhwc, 1, 1, false);
    let gpu = batches(
        dir.path(),
        Device::new_cuda_with_stream(0).unwrap(),
        Output::U8Nhwc,
        1,
        1,
        true,
    );
    assert!(
        gpu == cpu,
        "a pinned buffer was overwritten while its copy was in flight"
    );
}

#[test]
fn device_normalization_matches_host_on_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 2, 8);
    let build = |at| {
        Loader::builder(ImageFolder::new(dir.path()).unwrap())
            .batch_size(4)
            .image_size(24)
            .normalize_at(at)
            .device(Device::new_cuda(0).unwrap())
            .build()
            .unwrap()
    };
    let (mut host, mut dev) = (build(NormalizeAt::Host), build(NormalizeAt::Device));
    for (a, b) in host.epoch(0).zip(dev.epoch(0)) {
        let (a, b) = (a.unwrap().images, b.unwrap().images);
        let d: f32 = (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_keepdim(0)
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(d < 1e-4, "device normalization differs by {d}");
    }
}
