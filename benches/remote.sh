#!/usr/bin/env bash
# Remote vs local through `wick bench`, on the same shards: nginx serves
# them on loopback behind `slow-proxy`, which holds every request DELAY ms
# and caps each connection at MBPS MB/s, so the loader sees a remote store.
# Usage: benches/remote.sh [ROUNDS] [COUNT] [DELAY_MS] [MBPS]
# (defaults 3, 8000 ImageNet-like JPEGs, 20 ms, 100 MB/s). Needs nginx.
# Rounds run the cases in turn so machine noise hits them alike; each cell
# is the median over rounds of `wick bench`'s median of 3 epochs, at the
# same worker count (all cores); CPU is the process's CPU time over wall
# time (cores busy), the median over rounds of each run's median epoch.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
count=${2:-8000}
delay=${3:-20}
mbps=${4:-100}
# Worker counts compared: all cores, and all but one (a core left for
# the I/O of the remote run, and for the server and proxy on this machine).
all=$(nproc)
worker_counts=${WORKERS:-"$all $((all > 1 ? all - 1 : 1))"}
. benches/common.sh
photo_set "$count" slow-proxy
out=target/bench-data/remote-$count
if [ ! -f "$out/.done" ]; then
  rm -rf "$out"
  $w convert "$src" "$out/wds" --format wds --shard-size 256 >/dev/null
  $w convert "$src" "$out/tfrecord" --format tfrecord --shard-size 256 >/dev/null
  touch "$out/.done"
fi
tmp=$(mktemp -d)
nginx_port=$(free_port)
proxy_port=$(free_port)
user=""
[ "$(id -u)" = 0 ] && user="user root;"
cat > "$tmp/nginx.conf" <<EOF
$user master_process off; daemon off; pid $tmp/nginx.pid; error_log $tmp/error.log;
events { worker_connections 2048; }
http { access_log off; client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fcgi; uwsgi_temp_path $tmp/uwsgi; scgi_temp_path $tmp/scgi;
  keepalive_requests 100000;
  server { listen 127.0.0.1:$nginx_port; root $(realpath "$out"); } }
EOF
nginx -p "$tmp" -c "$tmp/nginx.conf" &
nginx_pid=$!
./target/release/slow-proxy "127.0.0.1:$proxy_port" "127.0.0.1:$nginx_port" "$delay" "$mbps" > "$tmp/proxy.out" &
proxy_pid=$!
trap 'kill $nginx_pid $proxy_pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do
  grep -q ready "$tmp/proxy.out" 2>/dev/null && curl -s -o /dev/null "http://127.0.0.1:$nginx_port/" && break
  sleep 0.1
done
# HTTP lists nothing: the shards are named with brace ranges.
http="http://127.0.0.1:$proxy_port"
wds_n=$(find "$out/wds" -name 'data-*.tar' | wc -l)
wds_range="wds/data-{000000..$(printf %06d $((wds_n - 1)))}.tar"
tf_n=$(find "$out/tfrecord" -name 'data-*.tfrecord' | wc -l)
tf_range="tfrecord/data-{00000..$(printf %05d $((tf_n - 1)))}-of-$(printf %05d "$tf_n").tfrecord"
for f in "$out/wds/data-000000.tar" "$out/tfrecord/data-00000-of-$(printf %05d "$tf_n").tfrecord"; do
  [ -f "$f" ] || { echo "unexpected shard names: no $f" >&2; exit 1; }
done
stream="--interleave 4,1 --shuffle-buffer 1024"
cases=()
for wk in $worker_counts; do
  cases+=(
    "WebDataset, random access, $wk workers|local|$out/wds|--workers $wk"
    "WebDataset, random access, $wk workers|remote|$http/$wds_range|--workers $wk"
    "WebDataset, stream interleave(4,1), $wk workers|local|$out/wds|--workers $wk $stream"
    "WebDataset, stream interleave(4,1), $wk workers|remote|$http/$wds_range|--workers $wk $stream"
    "TFRecord, random access, $wk workers|local|$out/tfrecord|--workers $wk"
    "TFRecord, random access, $wk workers|remote|$http/$tf_range|--workers $wk"
  )
done
# CPU seconds the server side (nginx and the proxy) has used so far.
server_cpu() { awk '{ s += ($14 + $15) } END { printf "%.2f", s / 100 }' "/proc/$nginx_pid/stat" "/proc/$proxy_pid/stat"; }
for r in $(seq 1 "$rounds"); do
  for i in "${!cases[@]}"; do
    IFS='|' read -r name where data extra <<< "${cases[$i]}"
    before=$(server_cpu); t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    report=$($w bench "$data" --json $extra)
    server=$(python3 -c "print(($(server_cpu) - $before) / ($(date +%s.%N) - $t0))")
    echo "$report" | python3 -c '
import json, statistics, sys
r = json.load(sys.stdin)
print(r["median_images_per_sec"], statistics.median(r["epoch_cpu_cores"]), r["read_ahead"], sys.argv[1])' "$server" >> "$tmp/$i"
  done
  echo "round $r done" >&2
done
python3 - "$tmp" "$delay" "$mbps" "${#cases[@]}" "${cases[@]}" <<'PY'
import statistics, sys
tmp, delay, mbps, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cases = [c.split("|") for c in sys.argv[5:5 + n]]
rows = []
for i, (name, where, _, _) in enumerate(cases):
    vals = [tuple(map(float, l.split())) for l in open(f"{tmp}/{i}")]
    rows.append((name, where, statistics.median(v[0] for v in vals),
                 statistics.median(v[1] for v in vals), max(v[2] for v in vals),
                 statistics.median(v[3] for v in vals), len(vals)))
print("| case | local images/s | remote images/s | remote/local | wick cores local | remote | server+proxy cores | read-ahead |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for j in range(0, len(rows), 2):
    (name, _, li, lc, _, _, k), (_, _, ri, rc, ra, sc, _) = rows[j], rows[j + 1]
    print(f"| {name} | {li:,.0f} | {ri:,.0f} | {ri / li:.2f} | {lc:.2f} | {rc:.2f} | {sc:.2f} | {ra:.0f} |")
print(f"(HTTP through nginx, {delay} ms added per request, {mbps} MB/s per connection; "
      f"median of {k} rounds, each the median of 3 epochs)")
PY
