//! Normalizing on the device (u8 NHWC uploaded, converted by tensor ops)
//! gives the same batches as normalizing on the host; bf16/f16 output.

use candle_core::DType;
use candle_wick::{ImageFolder, Loader, NormalizeAt, Output};
use tests::image_folder;

fn loader(root: &std::path::Path, at: NormalizeAt, dtype: DType) -> Loader {
    Loader::builder(ImageFolder::new(root).unwrap())
        .batch_size(5)
        .image_size(20)
        .train_transforms()
        .shuffle(4)
        .normalize_at(at)
        .dtype(dtype)
        .build()
        .unwrap()
}

#[test]
fn device_normalization_matches_host_normalization() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 2, 6);
    let mut host = loader(dir.path(), NormalizeAt::Host, DType::F32);
    let mut dev = loader(dir.path(), NormalizeAt::Device, DType::F32);
    let (a, b): (Vec<_>, Vec<_>) = (host.epoch(1).collect(), dev.epoch(1).collect());
    assert_eq!(a.len(), 3);
    for (a, b) in a.into_iter().zip(b) {
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.keys, b.keys);
        assert_eq!(a.images.dims(), b.images.dims());
        assert_eq!(b.images.dims()[1..], [3, 20, 20]);
        assert_eq!(b.images.dtype(), DType::F32);
        let diff = (a.images - b.images).unwrap().abs().unwrap();
        let max = diff
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(max < 1e-4, "host and device normalization differ by {max}");
    }
}

#[test]
fn half_precision_output_and_invalid_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 1, 3);
    for at in [NormalizeAt::Host, NormalizeAt::Device] {
        let mut l = loader(dir.path(), at, DType::BF16);
        let b = l.epoch(0).next().unwrap().unwrap();
        assert_eq!(b.images.dtype(), DType::BF16);
        assert_eq!(b.images.dims(), [3, 3, 20, 20]);
    }
    let err = Loader::builder(ImageFolder::new(dir.path()).unwrap())
        .output(Output::U8Nhwc)
        .dtype(DType::F32)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("u8"), "{err}");
    let err = Loader::builder(ImageFolder::new(dir.path()).unwrap())
        .dtype(DType::U32)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("float"), "{err}");
}
