"""PyTorch DataLoader, 2 workers: torchvision.io decode + transforms.v2
(RandomResizedCrop antialiased + flip), or PIL + classic transforms.

usage: python torch_loader.py DATA_DIR u8|f32 [tvio|pil]
"""
import sys

import torch
from torch.utils.data import DataLoader, Dataset

from common import BATCH, MEAN, SIZE, STD, files, report, timed_epochs


class Images(Dataset):
    def __init__(self, root, output, backend):
        self.items = files(root)
        self.backend = backend
        if backend == "tvio":
            from torchvision.transforms import v2
            steps = [v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()]
            if output == "f32":
                steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
            self.tf = v2.Compose(steps)
        else:
            from torchvision import transforms as T
            steps = [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]
            if output == "f32":
                steps += [T.ToTensor(), T.Normalize(MEAN, STD)]
            else:
                steps += [T.PILToTensor()]
            self.tf = T.Compose(steps)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        if self.backend == "tvio":
            from torchvision.io import ImageReadMode, decode_image, read_file
            img = decode_image(read_file(path), mode=ImageReadMode.RGB)
        else:
            from PIL import Image
            with open(path, "rb") as f:
                img = Image.open(f).convert("RGB")
        return self.tf(img), label


def worker_init(_):
    torch.set_num_threads(1)


def main():
    root, output = sys.argv[1], sys.argv[2]
    backend = sys.argv[3] if len(sys.argv) > 3 else "tvio"
    torch.manual_seed(0)
    loader = DataLoader(Images(root, output, backend), batch_size=BATCH, shuffle=True,
                        num_workers=2, persistent_workers=True, prefetch_factor=4,
                        worker_init_fn=worker_init)

    def epoch(_):
        for images, _labels in loader:
            yield int(images.shape[0])

    rates = timed_epochs(epoch)
    name = "PyTorch DataLoader (" + ("torchvision.io + v2" if backend == "tvio" else "PIL") + ")"
    del loader  # joins the workers, so their peak RSS is counted
    report(name, output, rates)


if __name__ == "__main__":
    main()
