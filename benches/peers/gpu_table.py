"""Prints the GPU feed bench's table from the JSON lines that wick's `feed`
and `torch_gpu.py` append (one line per epoch, "bench": "gpu-feed").

One row per (peer, workers, output, transforms, step): epoch 0 apart
("first epoch" images/s and its first-batch time), then the medians over
epochs >= 1 of images/s, wait share and step ms (step ms over every epoch
where a run has only epoch 0), and, where the same step was also timed alone
(peer "step-alone" for wick's rows, "torch-step-alone" for torch's), the
slowdown step_ms / step-alone ms. Then the AUTOTUNE rows epoch by epoch.

usage: python3 gpu_table.py FILE.jsonl
"""
import json
import statistics
import sys

KEY = ("peer", "workers", "output", "transforms", "step")
ALONE = {"wick": "step-alone", "torch": "torch-step-alone"}


def load(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"{path}:{n}: skipped ({e})", file=sys.stderr)
                continue
            if r.get("bench") == "gpu-feed":
                rows.append(r)
    return rows


def steady(lines, field, or_all=False):
    """The field's values over epochs >= 1 (or over every epoch if there are
    none and `or_all`)."""
    later = [r[field] for r in lines if r.get("epoch", 0) >= 1 and r.get(field) is not None]
    if later or not or_all:
        return later
    return [r[field] for r in lines if r.get(field) is not None]


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, spec, suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def family(peer):
    return "torch" if peer.startswith("torch-") else "wick"


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: gpu_table.py FILE.jsonl")
    rows = load(sys.argv[1])
    if not rows:
        print(f"no gpu-feed lines in {sys.argv[1]}")
        return 1
    groups = {}
    for r in rows:
        groups.setdefault(tuple(str(r.get(k)) for k in KEY), []).append(r)
    for lines in groups.values():
        lines.sort(key=lambda r: r.get("epoch", 0))

    # The step timed alone, per (step-alone peer, step), all its runs pooled.
    alone = {}
    for key, lines in groups.items():
        if key[0] in ALONE.values():
            alone.setdefault((key[0], key[4]), []).extend(steady(lines, "step_ms", True))

    print("| peer | workers | output | transforms | step | first epoch img/s | first batch s "
          "| img/s (epochs >= 1) | wait share | step ms | step alone ms | slowdown |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, lines in groups.items():
        peer, workers, output, transforms, step = key
        e0 = next((r for r in lines if r.get("epoch") == 0), None)
        step_ms = median(steady(lines, "step_ms", True))
        ref = None
        if peer not in ALONE.values() and step != "none":
            ref = median(alone.get((ALONE[family(peer)], step), []))
        slowdown = step_ms / ref if step_ms is not None and ref else None
        print(f"| {peer} | {workers} | {output} | {transforms} | {step} "
              f"| {fmt(e0 and e0.get('images_per_sec'), '.0f')} "
              f"| {fmt(e0 and e0.get('first_batch_s'), '.2f')} "
              f"| {fmt(median(steady(lines, 'images_per_sec')), '.0f')} "
              f"| {fmt(median(steady(lines, 'wait_share')), '.1%')} "
              f"| {fmt(step_ms, '.1f')} | {fmt(ref, '.1f')} | {fmt(slowdown, '.2f', 'x')} |")

    auto = [(k, v) for k, v in groups.items() if k[1] == "auto" and k[0] not in ALONE.values()]
    if auto:
        print()
        print("AUTOTUNE, images/s epoch by epoch:")
        for (peer, _, output, transforms, step), lines in auto:
            rates = " / ".join(fmt(r.get("images_per_sec"), ".0f") for r in lines)
            print(f"- {peer} {output} {transforms} step {step}: {rates}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
