#!/usr/bin/env bash
# The reverse interop check: shards written by `wick convert` are read back
# by TensorFlow, webdataset and safetensors (Python), image by image.
# Usage: scripts/interop-check.sh [IMAGE_FOLDER]   (default: the example's
# built-in dataset). Installs the Python packages into target/interop-venv
# unless PYTHON points at an interpreter that has them. Not run in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-target/wick-data/shapes-v1/train}
out=target/interop-check
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ ! -x target/interop-venv/bin/python ]; then
    python3 -m venv target/interop-venv
    target/interop-venv/bin/pip install -q tensorflow-cpu webdataset safetensors numpy pillow
  fi
  py=target/interop-venv/bin/python
fi
cargo build --release -q -p candle-wick --features cli
rm -rf "$out"
for f in tfrecord wds safetensors; do
  ./target/release/wick convert "$src" "$out/$f" --format "$f" --shard-size 500
done
./target/release/wick convert "$src" "$out/pixels" --format safetensors-pixels --pixels-size 64 --shard-size 500
TF_CPP_MIN_LOG_LEVEL=3 "$py" scripts/interop_check.py "$src" "$out"
