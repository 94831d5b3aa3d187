"""tf.data: RandomResizedCrop-equivalent (sample_distorted_bounding_box with
decode_and_crop_jpeg, which decodes only the crop window) + flip, batch 64.

usage: python tf_data.py DATA_DIR u8|f32 [fixed|autotune] [train|eval]
       python tf_data.py DATA_DIR decode
`eval` is the evaluation transform instead: the full decode, the shorter
side resized to 256 (bilinear), the central 224 x 224.
The `decode` mode decodes every full image (libjpeg-turbo inside
tf.io.decode_image) with no transform, 2 parallel calls: the decode-only
rate the RRC pipelines are held against.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

from common import BATCH, MEAN, SIZE, STD, files, report, timed_epochs  # noqa: E402


def build(root, output, parallel, transform="train"):
    paths, labels = zip(*files(root))
    ds = tf.data.Dataset.from_tensor_slices((list(paths), list(labels)))
    mean = tf.constant(MEAN) * 255.0
    std = tf.constant(STD) * 255.0

    def crop_window(shape):
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        return begin, size

    def load(path, label):
        raw = tf.io.read_file(path)

        def jpeg():
            begin, size = crop_window(tf.io.extract_jpeg_shape(raw))
            window = tf.stack([begin[0], begin[1], size[0], size[1]])
            return tf.io.decode_and_crop_jpeg(raw, window, channels=3)

        def other():
            img = tf.io.decode_image(raw, channels=3, expand_animations=False)
            begin, size = crop_window(tf.shape(img))
            return tf.slice(img, begin, size)

        if transform == "eval":
            img = tf.io.decode_image(raw, channels=3, expand_animations=False)
            hw = tf.cast(tf.shape(img)[:2], tf.float32)
            new = tf.cast(tf.round(hw * (256.0 / tf.reduce_min(hw))), tf.int32)
            img = tf.image.resize(img, new, method="bilinear")
            top = (new[0] - SIZE) // 2
            left = (new[1] - SIZE) // 2
            img = img[top:top + SIZE, left:left + SIZE]
        else:
            img = tf.cond(tf.io.is_jpeg(raw), jpeg, other)
            img = tf.image.resize(img, [SIZE, SIZE], method="bilinear")
            img = tf.image.random_flip_left_right(img)
        if output == "u8":
            img = tf.cast(tf.clip_by_value(img, 0, 255), tf.uint8)
        else:
            img = (img - mean) / std
        return img, label

    n = tf.data.AUTOTUNE if parallel == "autotune" else 2
    ds = ds.shuffle(len(paths), seed=0).map(load, num_parallel_calls=n)
    ds = ds.batch(BATCH).prefetch(tf.data.AUTOTUNE if parallel == "autotune" else 2)
    return ds


def decode_only(root):
    paths = [p for p, _ in files(root)]

    def load(path):
        img = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        # A reduction over the pixels, so nothing can skip the decode; the
        # scalars batch although the images differ in size.
        return tf.reduce_max(img)

    ds = tf.data.Dataset.from_tensor_slices(paths).map(load, num_parallel_calls=2)
    return ds.batch(BATCH).prefetch(2)


def main():
    root, output = sys.argv[1], sys.argv[2]
    if output == "decode":
        ds = decode_only(root)
        rates = timed_epochs(lambda _: (int(b.shape[0]) for b in ds))
        report("tf.data decode only (full images, no transform, 2 parallel calls)", "decode", rates)
        return
    parallel = sys.argv[3] if len(sys.argv) > 3 else "fixed"
    transform = sys.argv[4] if len(sys.argv) > 4 else "train"
    ds = build(root, output, parallel, transform)

    def epoch(_):
        for images, _labels in ds:
            yield int(images.shape[0])

    label = output if transform == "train" else f"{output} {transform}"
    report(f"tf.data ({parallel})", label, timed_epochs(epoch))


if __name__ == "__main__":
    main()
