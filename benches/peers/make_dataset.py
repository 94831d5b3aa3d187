"""Writes an ImageNet-like ImageFolder cut from real photographs.

The photographs are the ones shipped inside scikit-image's wheel (no network):
astronaut, coffee, chelsea, rocket, Hubble deep field, immunohistochemistry,
the stereo motorcycle pair, retina, plus grayscale camera, moon, grass, gravel,
brick, clock and coins. Each sample is a random window of a random photo,
resized to about ImageNet's mean training size (300..500 x 250..450, mean
~400x350), colour-jittered, and re-encoded: JPEG at quality 85..96 (10%
progressive, ~4% grayscale), and 1% PNG. Deterministic for a given seed.

With `large`, the photos are large instead (2-3 MP, 1,700..2,100 x
1,150..1,450, the size of COCO/OpenImages originals and phone photos
scaled for the web): each is 70..100% of a whole photograph, upscaled with
bicubic filtering (the sources are 300..1,400 px, so 1.2-6x), colour
jittered, with Gaussian noise of sigma 3 added (sensor grain: an upscaled
photo alone is smoother than a camera's, and cheaper to entropy-decode),
and encoded as JPEG at quality 85..96 (10% progressive, ~4% grayscale).

usage: python make_dataset.py OUT_DIR [COUNT] [SEED] [large]
"""
import io
import os
import sys

import numpy as np
from PIL import Image
import skimage.data as data

COLOR = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
         "immunohistochemistry", "retina"]
GRAY = ["camera", "moon", "grass", "gravel", "brick", "clock", "coins"]


def photos():
    out = [getattr(data, n)() for n in COLOR]
    left, right, _ = data.stereo_motorcycle()
    out += [left, right]
    out += [np.stack([getattr(data, n)()] * 3, axis=-1) for n in GRAY]
    return [np.ascontiguousarray(p[..., :3]).astype(np.uint8) for p in out]


def main():
    out_dir = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    large = len(sys.argv) > 4 and sys.argv[4] == "large"
    marker = os.path.join(out_dir, f".complete-{count}-{seed}{'-large' if large else ''}")
    if os.path.exists(marker):
        print(out_dir)
        return
    rng = np.random.default_rng(seed)
    srcs = photos()
    total = 0
    for i in range(count):
        src = srcs[rng.integers(len(srcs))]
        h, w = src.shape[:2]
        if large:
            tw, th = int(rng.integers(1700, 2101)), int(rng.integers(1150, 1451))
        else:
            tw, th = int(rng.integers(300, 501)), int(rng.integers(250, 451))
        # A window of the photo with the target's aspect ratio, 40..100% of
        # the largest one that fits (70..100% for large photos).
        scale = min(w / tw, h / th) * rng.uniform(0.7 if large else 0.4, 1.0)
        cw, ch = max(16, int(tw * scale)), max(16, int(th * scale))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        img = Image.fromarray(src[y0:y0 + ch, x0:x0 + cw]).resize((tw, th), Image.BICUBIC)
        arr = np.asarray(img).astype(np.float32)
        arr = arr[..., rng.permutation(3)] * rng.uniform(0.7, 1.2) + rng.uniform(-20, 20)
        if large:
            arr = arr + rng.normal(0.0, 3.0, arr.shape).astype(np.float32)
        if rng.random() < 0.5:
            arr = arr[:, ::-1]
        img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
        cls = f"n{i % 10:02d}"
        os.makedirs(os.path.join(out_dir, cls), exist_ok=True)
        buf = io.BytesIO()
        r = rng.random()
        if r < 0.01 and not large:
            img.save(buf, "PNG")
            ext = "png"
        else:
            if r < 0.05:
                img = img.convert("L")
            img.save(buf, "JPEG", quality=int(rng.integers(85, 97)),
                     progressive=bool(rng.random() < 0.10))
            ext = "jpg"
        with open(os.path.join(out_dir, cls, f"{i:05d}.{ext}"), "wb") as f:
            f.write(buf.getvalue())
        total += buf.tell()
    open(marker, "w").close()
    print(out_dir)
    print(f"{count} files, mean {total / count / 1024:.1f} KiB", file=sys.stderr)


if __name__ == "__main__":
    main()
