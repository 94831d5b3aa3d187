#!/usr/bin/env bash
# wick beside tf.data, PyTorch's DataLoader and DALI's CPU pipeline, on the
# same 2,000 JPEGs cut from real photographs, in one run. Not run in CI.
#
#   benches/peers/run.sh [COUNT]
#   benches/peers/run.sh COUNT large
#
# With `large`, the dataset is COUNT large photos (2-3 MP, made from the
# same photographs: see make_dataset.py) and the runs are wick (both
# builds), tf.data and DALI, RandomResizedCrop and eval (resize 256, centre
# crop 224), u8 and f32.
#
# Installs the peers into a venv (target/peers-venv, ~8 GB: PyTorch from PyPI
# brings its CUDA libraries), writes the dataset (target/bench-data/photos-N),
# builds `wick` twice (pure-Rust default, and --features turbojpeg; the
# latter needs cmake and nasm), runs each loader for 3 passes (RandomResizedCrop 224 + flip,
# batch 64, all cores), scores each by its best pass after the first, and
# prints one table.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
count=${1:-2000}
venv=${WICK_PEERS_VENV:-$root/target/peers-venv}
py=$venv/bin/python
have() { for m in "$@"; do "$py" -c "import $m" 2>/dev/null || return 1; done; }
# One import per process: TensorFlow, PyTorch and DALI loaded together can abort.
if ! have tensorflow torch torchvision skimage; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q tensorflow-cpu==2.21.0 torch==2.15.0 torchvision==0.29.2 \
    scikit-image==0.26.0 pillow
  "$venv/bin/pip" install -q nvidia-dali-cuda120==2.4.0 || echo "DALI did not install; skipping it"
fi
large=${2:-}
if [ "$large" = large ]; then
  data=$root/target/bench-data/large-$count
  "$py" "$here/make_dataset.py" "$data" "$count" 0 large >/dev/null
else
  data=$root/target/bench-data/photos-$count
  "$py" "$here/make_dataset.py" "$data" "$count" 0 >/dev/null
fi
# Two wick builds: the pure-Rust default and the turbojpeg feature.
(cd "$root" && cargo build --release -q -p candle-wick --features cli,turbojpeg \
  && cp target/release/wick target/release/wick-turbojpeg \
  && cargo build --release -q -p candle-wick --features cli)
wick=$root/target/release/wick

out=$(mktemp)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >&2
cd "$here"
if [ "$large" = large ]; then
  for transform in train eval; do
    for output in u8 f32; do
      "$py" wick_bench.py "$wick" "$data" "$output" "$transform" | tee -a "$out" >&2
      "$py" wick_bench.py "$wick-turbojpeg" "$data" "$output" "$transform" | tee -a "$out" >&2
      "$py" tf_data.py "$data" "$output" fixed "$transform" 2>/dev/null | tee -a "$out" >&2
      if have nvidia.dali; then
        "$py" dali_cpu.py "$data" "$output" "$transform" 2>/dev/null | tee -a "$out" >&2
      fi
    done
  done
  "$py" table.py "$out"
  exit 0
fi
for output in u8 f32; do
  "$py" wick_bench.py "$wick" "$data" "$output" | tee -a "$out" >&2
  "$py" wick_bench.py "$wick-turbojpeg" "$data" "$output" | tee -a "$out" >&2
  "$py" tf_data.py "$data" "$output" fixed 2>/dev/null | tee -a "$out" >&2
  "$py" tf_data.py "$data" "$output" autotune 2>/dev/null | tee -a "$out" >&2
  "$py" torch_loader.py "$data" "$output" tvio 2>/dev/null | tee -a "$out" >&2
  "$py" torch_loader.py "$data" "$output" pil 2>/dev/null | tee -a "$out" >&2
  if have nvidia.dali; then
    "$py" dali_cpu.py "$data" "$output" 2>/dev/null | tee -a "$out" >&2
  fi
done
"$py" tf_data.py "$data" decode 2>/dev/null | tee -a "$out" >&2
"$py" table.py "$out"
