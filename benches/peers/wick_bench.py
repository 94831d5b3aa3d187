"""Runs `wick bench --json` and prints its result as a peer-table line,
scored like the peers: the best pass after the first.

usage: python wick_bench.py WICK_BINARY DATA_DIR u8|f32 [train|eval]
"""
import json
import subprocess
import sys

wick, root, output = sys.argv[1:4]
transform = sys.argv[4] if len(sys.argv) > 4 else "train"
out = subprocess.run([wick, "bench", root, "--output", output, "--batch-size", "64",
                      "--image-size", "224", "--epochs", "3", "--transforms", transform,
                      "--json"],
                     check=True, capture_output=True, text=True).stdout
r = json.loads(out)
rates = r["epoch_images_per_sec"]
decoder = "turbojpeg" if "turbo" in r["jpeg_decoder"] else "pure Rust"
label = output if transform == "train" else f"{output} {transform}"
print(json.dumps({"peer": f"wick, {decoder} ({r['workers']} workers)", "output": label,
                  "images_per_sec": max(rates[1:] or rates),
                  "passes": [round(x) for x in rates],
                  "peak_rss_mb": round(r["peak_rss_mb"] or 0)}))
