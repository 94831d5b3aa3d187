#!/usr/bin/env bash
# Parquet through `wick bench`, on the photo set: the ImageNet-like JPEGs of
# the `make-dataset` bench binary (default 4,000) as a folder, and the same
# JPEGs converted by `wick convert --format parquet` to the Hugging Face
# Hub's layout (image struct + ClassLabel, row groups of 100 rows as
# `datasets` writes image datasets), read from disk and from a loopback S3
# server (moto_server, `pip install "moto[server]"`).
# Usage: benches/parquet.sh [ROUNDS] [COUNT]. Rounds run the cases in turn
# so machine noise hits them alike; each cell is the median over rounds of
# `wick bench`'s median of 3 epochs. RRC 224 + flip, u8 output, all cores,
# shuffled (Parquet: block shuffle).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
count=${2:-4000}
cargo build --release -q -p candle-wick --features cli
cargo build --release -q -p benches --bin make-dataset
src=$(./target/release/make-dataset "$count")
out=target/bench-data/parquet-$count
w=./target/release/wick
if [ ! -f "$out/.done" ]; then
  rm -rf "$out"
  $w convert "$src" "$out/hub" --format parquet --row-group 100 --shard-size 1000 >/dev/null
  touch "$out/.done"
fi
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
moto_server -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
moto_pid=$!
trap 'kill $moto_pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
python3 - "$port" "$out/hub" <<'PY'
import boto3, os, sys
port, root = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
s3.create_bucket(Bucket="photos")
for d, _, files in os.walk(root):
    for f in files:
        p = os.path.join(d, f)
        s3.upload_file(p, "photos", "hub/" + os.path.relpath(p, root))
PY
export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test \
  AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
cases=(
  "folder (JPEG files)|$src"
  "Parquet, Hub layout, local|$out/hub"
  "Parquet, Hub layout, loopback S3|s3://photos/hub"
)
for r in $(seq 1 "$rounds"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name data <<< "${cases[$i]}"
    $w bench "$data" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["median_images_per_sec"], r["peak_rss_mb"], r["epoch_cpu_cores"][len(r["epoch_cpu_cores"])//2])' >> "$tmp/$i"
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
    rows.append((name, statistics.median(v[0] for v in vals), max(v[1] for v in vals),
                 statistics.median(v[2] for v in vals), len(vals)))
print("| data | images/s | vs folder | vs local Parquet | CPU cores | peak RSS MB |")
print("|---|---:|---:|---:|---:|---:|")
for name, ips, rss, cpu, k in rows:
    print(f"| {name} | {ips:,.0f} | {ips / rows[0][1]:.2f}x | {ips / rows[1][1]:.2f}x | {cpu:.2f} | {rss:.0f} |")
print(f"(median of {rows[0][4]} rounds, each the median of 3 epochs)")
PY
