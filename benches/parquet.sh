#!/usr/bin/env bash
# Parquet through `wick bench`, on the photo set: the ImageNet-like JPEGs of
# the `make-dataset` bench binary (default 4,000) as a folder, and the same
# JPEGs converted by `wick convert --format parquet` to the Hugging Face
# Hub's layout (image struct + ClassLabel, row groups of 100 rows as
# `datasets` writes image datasets), read from disk and from a loopback S3
# server: s3rver (npm, Node; installed under target/bench-tools) by default,
# or moto_server (`pip install "moto[server]"`, Python) with S3_SERVER=moto.
# When nginx is installed, a second S3 endpoint puts nginx in front of the
# same server: it answers the object GETs and HEADs (ranged, by sendfile)
# from the server's own object files and passes every other request (LIST,
# uploads) to it, as a lean S3 front end would. The servers share this
# machine's cores with the loader: the table gives their CPU beside the
# loader's.
# Usage: benches/parquet.sh [ROUNDS] [COUNT]; WORKERS=N fixes the decode
# workers (default: AUTOTUNE), e.g. one core left for the server and I/O.
# Rounds run the cases in turn so machine noise hits them alike; each cell
# is the median over rounds of `wick bench`'s median of 3 epochs. RRC 224 +
# flip, u8 output, shuffled (Parquet: block shuffle).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
count=${2:-4000}
. benches/common.sh
photo_set "$count"
out=target/bench-data/parquet-$count
if [ ! -f "$out/.done" ]; then
  rm -rf "$out"
  $w convert "$src" "$out/hub" --format parquet --row-group 100 --shard-size 1000 >/dev/null
  touch "$out/.done"
fi
tmp=$(mktemp -d)
port=$(free_port)
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
trap 'kill $server_pid $(cat "$tmp/nginx.pid" 2>/dev/null) 2>/dev/null; rm -rf "$tmp"' EXIT
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
export AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=$key AWS_SECRET_ACCESS_KEY=$key AWS_REGION=us-east-1
# name|data|S3 endpoint; servers[i]: the server processes case i uses.
cases=(
  "folder (JPEG files)|$src|"
  "Parquet, Hub layout, local|$out/hub|"
  "Parquet, Hub layout, loopback S3 ($server)|s3://photos/hub|http://127.0.0.1:$port"
)
servers=("" "" "$server_pid")
if [ "$server" = s3rver ] && command -v nginx >/dev/null; then
  # nginx answers an object's GET/HEAD from s3rver's own object file
  # (KEY._S3rver_object: the uploaded bytes); a request with a query
  # (LIST) or another method goes on to s3rver.
  port2=$(free_port)
  cat > "$tmp/nginx.conf" <<EOF
worker_processes 1;
daemon off;
error_log $tmp/nginx.log;
pid $tmp/nginx.pid;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  client_body_temp_path $tmp;
  proxy_temp_path $tmp;
  upstream s3 { server 127.0.0.1:$port; keepalive 16; }
  server {
    listen 127.0.0.1:$port2;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Host \$http_host;
    location / {
      if (\$request_method !~ ^(GET|HEAD)$) { proxy_pass http://s3; }
      if (\$args != "") { proxy_pass http://s3; }
      root $tmp/s3;
      try_files \$uri._S3rver_object @s3;
    }
    location @s3 { proxy_pass http://s3; }
  }
}
EOF
  nginx -c "$tmp/nginx.conf" >/dev/null 2>&1 &
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port2/" && break; sleep 0.1; done
  cases+=("Parquet, Hub layout, loopback S3 ($server, objects by nginx)|s3://photos/hub|http://127.0.0.1:$port2")
  servers+=("$server_pid $(cat "$tmp/nginx.pid") $(pgrep -P "$(cat "$tmp/nginx.pid")" | tr '\n' ' ')")
fi
# CPU ticks (1/100 s) used so far by the processes "$@".
cpu() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
for r in $(seq 1 "$rounds"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name data endpoint <<< "${cases[$i]}"
    # shellcheck disable=SC2086
    c0=$(cpu ${servers[$i]}); t0=$(date +%s.%N)
    json=$(AWS_ENDPOINT_URL=$endpoint $w bench "$data" --json --workers "${WORKERS:-0}")
    # shellcheck disable=SC2086
    c1=$(cpu ${servers[$i]}); t1=$(date +%s.%N)
    echo "$json" | python3 -c '
import json, sys
r = json.load(sys.stdin)
c = sorted(r["epoch_cpu_cores"])
server = (int(sys.argv[2]) - int(sys.argv[1])) / 100 / (float(sys.argv[4]) - float(sys.argv[3]))
print(r["median_images_per_sec"], r["peak_rss_mb"], c[len(c) // 2], server)' "$c0" "$c1" "$t0" "$t1" >> "$tmp/$i"
  done
  echo "round $r done" >&2
done
python3 - "$tmp" "${#cases[@]}" "${cases[@]}" <<'PY'
import statistics, sys
tmp, n = sys.argv[1], int(sys.argv[2])
names = [c.split("|")[0] for c in sys.argv[3:3 + n]]
runs = [[tuple(map(float, l.split())) for l in open(f"{tmp}/{i}")] for i in range(n)]
med = statistics.median
# Ratios pair by pair: each case against the folder and the local Parquet
# of the same round, then the median over rounds.
ratio = lambda i, j: med(a[0] / b[0] for a, b in zip(runs[i], runs[j]))
print("| data | images/s | vs folder | vs local Parquet | loader CPU cores | server CPU cores | peak RSS MB |")
print("|---|---:|---:|---:|---:|---:|---:|")
for i, name in enumerate(names):
    v = runs[i]
    srv = f"{med(x[3] for x in v):.2f}" if "S3" in name else "-"
    print(f"| {name} | {med(x[0] for x in v):,.0f} | {ratio(i, 0):.2f}x | {ratio(i, 1):.2f}x "
          f"| {med(x[2] for x in v):.2f} | {srv} | {max(x[1] for x in v):.0f} |")
print(f"(images/s: median of {len(runs[0])} rounds, each `wick bench`'s median of 3 epochs; "
      "ratios: median over rounds of the ratio within a round; server CPU: the S3 server's "
      "processes over the whole `wick bench` run, start-up included)")
PY
