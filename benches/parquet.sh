#!/usr/bin/env bash
# Parquet through `wick bench`, on the photo set: the ImageNet-like JPEGs of
# the `make-dataset` bench binary (default 4,000) as a folder, and the same
# JPEGs converted by `wick convert --format parquet` to the Hugging Face
# Hub's layout (image struct + ClassLabel, row groups of 100 rows as
# `datasets` writes image datasets), read from disk and from a loopback S3
# server: s3rver (npm, Node; installed under target/bench-tools) by default,
# or moto_server (`pip install "moto[server]"`, Python) with S3_SERVER=moto.
# The server shares this machine's cores with the loader: its CPU time is
# printed beside the table.
# Usage: benches/parquet.sh [ROUNDS] [COUNT]; WORKERS=N fixes the decode
# workers (default: AUTOTUNE), e.g. one core left for the server and I/O. Rounds run the cases in turn
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
server=${S3_SERVER:-s3rver}
if [ "$server" = moto ]; then
  key=test
  moto_server -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
else
  key=S3RVER
  [ -x target/bench-tools/node_modules/.bin/s3rver ] ||
    npm install -s --prefix target/bench-tools s3rver@3 >/dev/null
  mkdir -p "$tmp/s3"
  target/bench-tools/node_modules/.bin/s3rver -d "$tmp/s3" --address 127.0.0.1 --port "$port" \
    --silent --configure-bucket photos >/dev/null 2>&1 &
fi
server_pid=$!
trap 'kill $server_pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
python3 - "$port" "$out/hub" "$key" <<'PY'
import boto3, os, sys
port, root, key = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                  aws_access_key_id=key, aws_secret_access_key=key)
if "photos" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
    s3.create_bucket(Bucket="photos")
for d, _, files in os.walk(root):
    for f in files:
        p = os.path.join(d, f)
        s3.upload_file(p, "photos", "hub/" + os.path.relpath(p, root))
PY
export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=$key \
  AWS_SECRET_ACCESS_KEY=$key AWS_REGION=us-east-1
cases=(
  "folder (JPEG files)|$src"
  "Parquet, Hub layout, local|$out/hub"
  "Parquet, Hub layout, loopback S3 ($server)|s3://photos/hub"
)
for r in $(seq 1 "$rounds"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name data <<< "${cases[$i]}"
    $w bench "$data" --json --workers "${WORKERS:-0}" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["median_images_per_sec"], r["peak_rss_mb"], r["epoch_cpu_cores"][len(r["epoch_cpu_cores"])//2])' >> "$tmp/$i"
  done
  echo "round $r done" >&2
done
echo "S3 server ($server) CPU over the whole run: $(awk '{printf "%.1f s", ($14+$15)/100}' /proc/$server_pid/stat)"
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
