"""Shared pieces of the peer benchmarks: file listing, timing, reporting."""
import json
import os
import resource
import sys
import time

BATCH = 64
SIZE = 224
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def files(root):
    """ImageFolder listing: sorted classes, sorted files, (path, label)."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    out = []
    for label, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
            if f.lower().endswith((".jpg", ".jpeg", ".png")):
                out.append((os.path.join(root, c, f), label))
    return out


def peak_rss_mb():
    """Peak RSS of this process plus its (joined) children, in MB."""
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (me + kids) / 1024.0


def timed_epochs(make_iter, epochs=3):
    """Runs `epochs` full passes; returns images/s of each pass."""
    rates = []
    for e in range(epochs):
        t = time.perf_counter()
        n = 0
        for batch_len in make_iter(e):
            n += batch_len
        rates.append(n / (time.perf_counter() - t))
    return rates


def report(name, output, rates, **extra):
    """One JSON line: the best pass after the first (the first warms caches)."""
    steady = rates[1:] or rates
    line = {"peer": name, "output": output, "images_per_sec": max(steady),
            "passes": [round(r) for r in rates], "peak_rss_mb": round(peak_rss_mb())}
    line.update(extra)
    print(json.dumps(line))
    sys.stdout.flush()
