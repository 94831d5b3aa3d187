//! Normalizing on the device (the fused normalize op, here its CPU
//! implementation) gives the same bits as the decode workers' host
//! normalization, for every float output type.

use candle_core::{DType, Device};
use candle_wick::source::ImageFolder;
use candle_wick::{FloatType, Loader, NormalizeAt, Output};
use tests::image_folder;

fn epoch(root: &std::path::Path, at: NormalizeAt, float: FloatType) -> Vec<(Vec<u32>, Vec<u32>)> {
    let dtype = DType::from(float);
    let mut loader = Loader::builder(ImageFolder::new(root).unwrap())
        .batch_size(5)
        .image_size(24)
        .train_transforms()
        .shuffle(3)
        .output(Output::imagenet().with_dtype(float).normalized_at(at))
        .device(Device::Cpu)
        .build()
        .unwrap();
    loader
        .epoch(1)
        .map(|b| {
            let b = b.unwrap();
            assert_eq!(b.images().unwrap().dtype(), dtype);
            assert_eq!(b.images().unwrap().dims()[1], 3, "NCHW");
            let bits = b
                .images()
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            (bits, tests::labels(&b))
        })
        .collect()
}

#[test]
fn device_normalization_has_the_hosts_bits() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 3, 7);
    for dtype in [FloatType::F32, FloatType::BF16, FloatType::F16] {
        let host = epoch(dir.path(), NormalizeAt::Host, dtype);
        let device = epoch(dir.path(), NormalizeAt::Device, dtype);
        assert_eq!(host.len(), 5);
        assert!(
            host == device,
            "{dtype:?}: device normalization differs from the host's"
        );
    }
}
