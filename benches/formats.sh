#!/usr/bin/env bash
# Throughput of every shard format through `wick bench`, on the same images:
# an ImageFolder of ImageNet-like JPEGs (default 2,000, written by the
# `make-dataset` bench binary) converted with `wick convert`.
# Usage: benches/formats.sh [ROUNDS] [COUNT]. Rounds run the formats in
# turn so machine noise hits them alike; each cell is the median over rounds
# of `wick bench`'s median of 3 epochs. RRC 224 + flip, u8 output, all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
count=${2:-2000}
. benches/common.sh
photo_set "$count"
out=target/bench-data/formats-$count
if [ ! -f "$out/.done" ]; then
  rm -rf "$out"
  $w convert "$src" "$out/tfrecord" --format tfrecord --shard-size 256
  $w convert "$src" "$out/wds" --format wds --shard-size 256
  $w convert "$src" "$out/safetensors" --format safetensors --shard-size 256
  $w convert "$src" "$out/tfrecord-256" --format tfrecord --max-side 256 --shard-size 256
  $w convert "$src" "$out/pixels-256" --format safetensors-pixels --pixels-size 256 --shard-size 256
  touch "$out/.done"
fi
cases=(
  "folder (JPEG files)|$src|"
  "TFRecord, random access|$out/tfrecord|"
  "TFRecord, stream interleave(4,1) + buffer 1024|$out/tfrecord|--interleave 4,1 --shuffle-buffer 1024"
  "WebDataset tar, random access|$out/wds|"
  "WebDataset tar, stream interleave(1,1) + buffer 1024|$out/wds|--interleave 1,1 --shuffle-buffer 1024"
  "safetensors JPEG bytes|$out/safetensors|"
  "TFRecord pre-resized JPEG (max side 256)|$out/tfrecord-256|"
  "safetensors pre-resized u8 256x256|$out/pixels-256|"
)
tmp=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name data extra <<< "${cases[$i]}"
    # shellcheck disable=SC2086
    $w bench "$data" --json $extra | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["median_images_per_sec"], r["peak_rss_mb"])' >> "$tmp/$i"
  done
  echo "round $r done" >&2
done
python3 - "$tmp" "${#cases[@]}" "${cases[@]}" <<'PY'
import statistics, sys
tmp, n = sys.argv[1], int(sys.argv[2])
names = [c.split("|")[0] for c in sys.argv[3:3 + n]]
rows = []
for i, name in enumerate(names):
    vals = [tuple(map(float, l.split())) for l in open(f"{tmp}/{i}")]
    rows.append((name, statistics.median(v[0] for v in vals), max(v[1] for v in vals), len(vals)))
base = rows[0][1]
print(f"| format | images/s | vs folder | peak RSS MB |")
print(f"|---|---:|---:|---:|")
for name, ips, rss, k in rows:
    print(f"| {name} | {ips:,.0f} | {ips / base:.2f}x | {rss:.0f} |")
print(f"(median of {rows[0][3]} rounds, each the median of 3 epochs)")
PY
rm -rf "$tmp"
