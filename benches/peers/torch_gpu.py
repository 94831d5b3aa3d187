"""PyTorch twin of wick's GPU feed bench (`benches/src/bin/feed.rs`): the
same photos, batch, transforms, device-side output, simulated training step
and JSON lines, so `gpu_table.py` can set the two side by side.

Peers (`--peer`):
- tvio: DataLoader workers read each file (torchvision.io.read_file), decode
  it on the CPU (decode_jpeg; decode_image for the rare PNG) and apply
  transforms.v2 to the u8 CHW tensor; pinned batches, `.cuda(non_blocking=True)`.
- pil: the common recipe: PIL open + convert("RGB"), the same v2 transforms
  on the PIL image, PILToTensor; pinned, the same upload.
- nvjpeg: workers only read the bytes; the main process decodes the whole
  batch on the GPU (decode_jpeg(list, device="cuda"), one batched call) and
  applies the transforms per image on the GPU, then stacks. PNGs (and any
  file nvJPEG refuses) are decoded on the CPU and uploaded. The bytes are
  not pinned (nvJPEG reads host bytes itself).

On the GPU, f32/bf16 are cast and normalized with ImageNet's mean/std (NCHW);
u8 stays u8 NCHW. Each batch is then consumed: a checksum (one multi-block
`sum` accumulated on the GPU, read once per epoch) and, with
`--step matmul:N`, N chained 4096x4096 f32 matmuls `y = (y @ a) / 4096` on
the default stream between two CUDA events, ended by a one-element loss
read (`y[0, 0].item()`), which waits for the step.

Per epoch: images/s over the epoch's wall time (until the GPU is idle), the
wait share (time in `next(iterator)` plus the device-side enqueue of the
batch, i.e. the upload and normalize, or nvJPEG's decode and the
transforms, over the epoch's wall time; the first batch is left out and
reported as first_batch_s), and the median step time from the events.
`--no-loader` times the step alone (no loader, one synthetic device batch
of the same shape and dtype, the same checksum and loss read): `--epochs`
epochs of ceil(files / batch) steps.

usage: python3 torch_gpu.py DIR [--peer tvio|pil|nvjpeg] [--batch-size 256]
           [--image-size 224] [--epochs 3] [--workers 16] [--output u8|f32|bf16]
           [--transforms train|eval] [--step none|matmul:N] [--no-loader] [--json FILE]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MEAN, STD, files  # noqa: E402

SIDE = 4096


def step_arg(s):
    if s == "none":
        return 0
    if s.startswith("matmul:") and s[7:].isdigit() and int(s[7:]) > 0:
        return int(s[7:])
    raise argparse.ArgumentTypeError(f"--step {s!r}: none or matmul:N")


def parse(argv=None):
    p = argparse.ArgumentParser(description="PyTorch twin of wick's GPU feed bench")
    p.add_argument("dir", help="ImageFolder: DIR/<class>/<image>")
    p.add_argument("--peer", choices=["tvio", "pil", "nvjpeg"], default="tvio")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=16, help="DataLoader num_workers")
    p.add_argument("--output", choices=["u8", "f32", "bf16"], default="u8")
    p.add_argument("--transforms", choices=["train", "eval"], default="train")
    p.add_argument("--step", type=step_arg, default=0, metavar="none|matmul:N")
    p.add_argument("--no-loader", action="store_true", help="time the step alone")
    p.add_argument("--json", help="append one JSON line per epoch to this file")
    return p.parse_args(argv)


def pipeline(kind, size, v2):
    """The crop: RandomResizedCrop + flip (train), or resize the shorter side
    to size*256/224 and center crop (eval)."""
    if kind == "train":
        return [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
    return [v2.Resize(size * 256 // 224, antialias=True), v2.CenterCrop(size)]


class Decoded:
    """Map-style dataset: (u8 CHW tensor, label), decoded on the CPU."""

    def __init__(self, items, peer, kind, size):
        from torchvision.transforms import v2
        steps = pipeline(kind, size, v2)
        if peer == "pil":
            steps.append(v2.PILToTensor())
        self.items, self.peer, self.tf = items, peer, v2.Compose(steps)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        if self.peer == "pil":
            from PIL import Image
            with open(path, "rb") as f:
                img = Image.open(f).convert("RGB")
        else:
            from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
            data = read_file(path)
            if path.lower().endswith((".jpg", ".jpeg")):
                img = decode_jpeg(data, mode=ImageReadMode.RGB)
            else:
                img = decode_image(data, mode=ImageReadMode.RGB)
        return self.tf(img), label


class Bytes:
    """Map-style dataset: (file bytes as a u8 tensor, label, is_jpeg)."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from torchvision.io import read_file
        path, label = self.items[i]
        data = read_file(path)
        return data, label, data[:2].tolist() == [0xFF, 0xD8]


def collate_bytes(items):
    import torch
    return ([d for d, _, _ in items], torch.tensor([l for _, l, _ in items]),
            [j for _, _, j in items])


def file_system_sharing(_worker=None):
    import torch.multiprocessing as mp
    # The default (file_descriptor) ran out of descriptors with many small
    # byte tensors in flight: `OSError: Bad file descriptor` (first GPU run).
    mp.set_sharing_strategy("file_system")


class GpuDecode:
    """nvJPEG: one batched decode of the batch's JPEGs, transforms per image
    on the GPU, stacked; PNGs and refused files decoded on the CPU."""

    def __init__(self, kind, size):
        from torchvision.transforms import v2
        self.tf = v2.Compose(pipeline(kind, size, v2))
        self.cpu_decoded = 0

    def __call__(self, datas, is_jpeg):
        import torch
        from torchvision.io import ImageReadMode, decode_image, decode_jpeg
        rgb = ImageReadMode.RGB
        imgs = [None] * len(datas)
        idx = [i for i, j in enumerate(is_jpeg) if j]
        if idx:
            try:
                out = decode_jpeg([datas[i] for i in idx], mode=rgb, device="cuda")
            except Exception:  # noqa: BLE001 (torchvision's error types vary)
                # One file nvJPEG refuses fails the batched call: retry one
                # by one, the refused ones on the CPU.
                out = []
                for i in idx:
                    try:
                        out.append(decode_jpeg(datas[i], mode=rgb, device="cuda"))
                    except Exception:  # noqa: BLE001
                        out.append(None)
            for i, img in zip(idx, out):
                imgs[i] = img
        for i, img in enumerate(imgs):
            if img is None:
                imgs[i] = decode_image(datas[i], mode=rgb).cuda()
                self.cpu_decoded += 1
        return torch.stack([self.tf(img) for img in imgs])


class Consumer:
    """The training step's stand-in: checksum, matmul chain, loss read."""

    def __init__(self, torch, matmuls):
        self.torch = torch
        self.n = matmuls
        self.acc = torch.zeros((), dtype=torch.float32, device="cuda")
        if matmuls:
            self.a = torch.ones((SIDE, SIDE), dtype=torch.float32, device="cuda")
            self.y0 = torch.ones((SIDE, SIDE), dtype=torch.float32, device="cuda")
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

    def __call__(self, x):
        """Consumes a batch; returns the step's event time in ms (or None)."""
        self.acc.add_(x.sum(dtype=self.torch.float32))
        if not self.n:
            return None
        self.start.record()
        y = self.y0
        for _ in range(self.n):
            y = self.torch.mm(y, self.a).mul_(1.0 / SIDE)
        self.end.record()
        loss = y[0, 0].item()
        if loss != 1.0:
            raise SystemExit(f"step: loss {loss}, expected 1.0")
        return self.start.elapsed_time(self.end)

    def warm_up(self, x):
        for _ in range(2):
            self(x)
        self.torch.cuda.synchronize()
        self.acc.zero_()


def emit(args, peer, epoch, rate, wait, step_ms, first):
    workers = "0" if args.no_loader else str(args.workers)
    line = {"bench": "gpu-feed", "peer": peer, "workers": workers, "output": args.output,
            "transforms": args.transforms,
            "step": f"matmul:{args.step}" if args.step else "none", "epoch": epoch,
            "images_per_sec": rate, "wait_share": wait, "step_ms": step_ms,
            "step_alone_ms": None, "first_batch_s": first}
    parts = []
    if rate is not None:
        parts.append(f"{rate:.0f} images/s, wait {wait:.1%}, first batch {first or 0:.2f} s")
    if step_ms is not None:
        parts.append(f"step {step_ms:.2f} ms (median)")
    print(f"{peer} epoch {epoch}: " + ", ".join(parts), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(line) + "\n")


def median(xs):
    return statistics.median(xs) if xs else None


def main():
    args = parse()
    items = files(args.dir)
    if not items:
        raise SystemExit(f"{args.dir}: no jpg/jpeg/png under DIR/<class>/")

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 matmuls, as candle's
    torch.manual_seed(0)
    b, s = args.batch_size, args.image_size
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"{len(items)} files", file=sys.stderr, flush=True)
    dtype = {"u8": torch.uint8, "f32": torch.float32, "bf16": torch.bfloat16}[args.output]
    consume = Consumer(torch, args.step)

    if args.no_loader:
        if args.output == "u8":
            x = torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8, device="cuda")
        else:
            x = torch.randn((b, 3, s, s), device="cuda").to(dtype)
        consume.warm_up(x)
        steps = math.ceil(len(items) / b)
        for epoch in range(args.epochs):
            ms = [consume(x) for _ in range(steps)]
            torch.cuda.synchronize()
            emit(args, "torch-step-alone", epoch, None, None, median([m for m in ms if m is not None]), None)
        return

    from torch.utils.data import DataLoader
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
    inv_std = 1 / (torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255)

    def normalize(x):
        if args.output == "u8":
            return x
        return x.to(torch.float32).sub_(mean).mul_(inv_std).to(dtype)

    kw = dict(batch_size=b, shuffle=True, num_workers=args.workers)
    if args.workers > 0:
        kw["persistent_workers"] = True
    if args.peer == "nvjpeg":
        file_system_sharing()
        gpu = GpuDecode(args.transforms, s)
        dataset = Bytes(items)
        kw.update(collate_fn=collate_bytes, worker_init_fn=file_system_sharing)

        def to_device(batch):
            datas, labels, is_jpeg = batch
            return normalize(gpu(datas, is_jpeg)), labels.cuda(non_blocking=True)
    else:
        dataset = Decoded(items, args.peer, args.transforms, s)
        kw["pin_memory"] = True

        def to_device(batch):
            x, labels = batch
            return (normalize(x.cuda(non_blocking=True)), labels.cuda(non_blocking=True))
    loader = DataLoader(dataset, **kw)

    # cuBLAS and the normalize kernels warmed on a stand-in of the batch.
    consume.warm_up(normalize(torch.zeros((b, 3, s, s), dtype=torch.uint8, device="cuda")))
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        it = iter(loader)
        wait, first, n, ms = 0.0, None, 0, []
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            x, _labels = to_device(batch)
            now = time.perf_counter()
            if first is None:
                first = now - t0
            else:
                wait += now - t
            n += x.shape[0]
            m = consume(x)
            if m is not None:
                ms.append(m)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        check = consume.acc.item()
        consume.acc.zero_()
        emit(args, f"torch-{args.peer}", epoch, n / wall, wait / wall, median(ms), first)
        extra = f", {gpu.cpu_decoded} decoded on the CPU so far" if args.peer == "nvjpeg" else ""
        print(f"  {n} images in {wall:.2f} s, checksum {check:.6g}{extra}",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
