"""NVIDIA DALI, CPU-only pipeline: image_random_crop (decodes only the crop)
+ resize + crop_mirror_normalize with random mirror, 2 threads, batch 64.

usage: python dali_cpu.py DATA_DIR u8|f32 [train|eval]
`eval`: the full decode, the shorter side resized to 256, the central 224.
"""
import sys

from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.base_iterator import LastBatchPolicy  # noqa: F401

from common import BATCH, MEAN, SIZE, STD, files, report, timed_epochs


def main():
    root, output = sys.argv[1], sys.argv[2]
    transform = sys.argv[3] if len(sys.argv) > 3 else "train"
    n = len(files(root))

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="r")
        if transform == "eval":
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256)
            geometry = dict(crop=(SIZE, SIZE), mirror=0)
        else:
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                   random_area=[0.08, 1.0],
                                                   random_aspect_ratio=[3 / 4, 4 / 3])
            images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
            geometry = dict(mirror=fn.random.coin_flip())
        if output == "u8":
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC",
                                              **geometry)
        else:
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[m * 255 for m in MEAN],
                                              std=[s * 255 for s in STD], **geometry)
        return images, labels

    p = pipe()
    p.build()
    steps = (n + BATCH - 1) // BATCH

    def epoch(_):
        for _ in range(steps):
            images, _labels = p.run()
            yield len(images)

    label = output if transform == "train" else f"{output} {transform}"
    report("DALI (CPU pipeline)", label, timed_epochs(epoch))


if __name__ == "__main__":
    main()
