//! Labels in batches match the ImageFolder class of each file.

use candle_wick::source::ImageFolder;
use candle_wick::Loader;
use std::path::Path;
use tests::image_folder;

#[test]
fn labels_match_the_class_folder_of_each_key() {
    let dir = tempfile::tempdir().unwrap();
    image_folder(dir.path(), 5, 6);
    let folder = ImageFolder::new(dir.path()).unwrap();
    let classes = folder.classes().to_vec();
    assert_eq!(classes, ["class0", "class1", "class2", "class3", "class4"]);
    let mut loader = Loader::builder(folder)
        .batch_size(8)
        .image_size(16)
        .shuffle(3)
        .train_transforms()
        .build()
        .unwrap();
    let mut n = 0;
    for b in loader.epoch(0) {
        let b = b.unwrap();
        let labels = tests::labels(&b);
        for (key, label) in b.keys.iter().zip(labels) {
            let class = Path::new(key).parent().unwrap().file_name().unwrap();
            assert_eq!(class.to_str().unwrap(), classes[label as usize], "{key}");
            n += 1;
        }
    }
    assert_eq!(n, 30);
}
