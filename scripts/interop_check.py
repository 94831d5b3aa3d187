"""Reads shards written by `wick convert` with the original Python libraries
and checks every image (decoded with PIL) and label against the source
ImageFolder. Run through scripts/interop-check.sh.

    python scripts/interop_check.py SRC_FOLDER OUT_DIR
OUT_DIR holds tfrecord/, wds/, safetensors/ as `wick convert` wrote them.
"""
import glob
import io
import os
import sys

import numpy as np
from PIL import Image

src, out = sys.argv[1], sys.argv[2]
classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
files = []
for label, c in enumerate(classes):
    for root, _, names in sorted(os.walk(os.path.join(src, c))):
        for n in sorted(names):
            if n.lower().endswith((".jpg", ".jpeg", ".png", ".webp", ".bmp")) and not n.startswith("."):
                files.append((os.path.join(root, n), label))
files.sort(key=lambda f: (f[1], f[0]))
want_pixels = [np.asarray(Image.open(p).convert("RGB")) for p, _ in files]
want_labels = [l for _, l in files]
want_bytes = [open(p, "rb").read() for p, _ in files]
print(f"source: {len(files)} images in {len(classes)} classes")


def compare(name, got):
    """got: list of (encoded bytes, label) in order."""
    assert len(got) == len(files), f"{name}: {len(got)} records, want {len(files)}"
    same_bytes = 0
    for i, (b, l) in enumerate(got):
        assert l == want_labels[i], f"{name} #{i}: label {l} != {want_labels[i]}"
        px = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
        assert px.shape == want_pixels[i].shape and (px == want_pixels[i]).all(), f"{name} #{i}: pixels differ"
        same_bytes += b == want_bytes[i]
    print(f"{name}: {len(got)} records, all labels and pixels equal, {same_bytes} byte-identical files")


# TFRecord, read by TensorFlow
import tensorflow as tf

shards = sorted(glob.glob(os.path.join(out, "tfrecord", "*.tfrecord")))
spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
ds = tf.data.TFRecordDataset(shards).map(lambda r: tf.io.parse_single_example(r, spec))
got = [(e["image/encoded"].numpy(), int(e["image/class/label"])) for e in ds]
compare(f"tf.data TFRecordDataset ({len(shards)} shards, CRCs checked by TF)", got)

# WebDataset tar, read by webdataset
import webdataset as wds

shards = sorted(glob.glob(os.path.join(out, "wds", "*.tar")))
got = []
for s in wds.WebDataset(shards, shardshuffle=False):
    ext = next(k for k in ("jpg", "png", "webp", "bmp") if k in s)
    got.append((s[ext], int(s["cls"])))
compare(f"webdataset.WebDataset ({len(shards)} shards)", got)

# safetensors, read by safetensors
from safetensors.numpy import load_file

shards = sorted(glob.glob(os.path.join(out, "safetensors", "*.safetensors")))
got = []
for s in shards:
    t = load_file(s)
    enc, off, lab = t["encoded"], t["offsets"], t["labels"]
    got += [(enc[off[i]:off[i + 1]].tobytes(), int(lab[i])) for i in range(len(lab))]
compare(f"safetensors.numpy.load_file ({len(shards)} shards)", got)

shards = sorted(glob.glob(os.path.join(out, "pixels", "*.safetensors")))
n = 0
for s in shards:
    t = load_file(s)
    assert t["images"].dtype == np.uint8 and t["images"].ndim == 4 and t["images"].shape[3] == 3
    assert list(t["labels"]) == want_labels[n:n + len(t["labels"])]
    n += len(t["labels"])
assert n == len(files)
print(f"safetensors pixels: {n} images {tuple(t['images'].shape[1:])} u8, labels equal")
print("interop check passed")
