#!/usr/bin/env bash
# The CUDA path's check, in two halves.
#
#   scripts/gpu-check.sh build   # on a machine without a GPU (this project's): builds
#                                # release binaries with --features cuda into gpu-check/
#   scripts/gpu-check.sh run     # on the GPU machine, repo root, gpu-check/ carried along
#
# build: nvcc 13.0 from PyPI wheels (scripts/nvcc-env.sh), CUDA libraries
# linked against stubs with the real sonames (shared/gpu/make-stubs.sh); the
# binaries load the real libcuda/cudart/cublas/curand/nvrtc at run time.
# run: (a) the CUDA integration tests (GPU batches == CPU batches bit for
# bit; pinned buffers not reused before their copy completes, prefetch 1 and a
# slow consumer; device normalization); (b) H2D bandwidth: pageable
# Tensor::from_slice vs pinned peak vs the loader's upload stage; (c) the
# training example for a fixed number of steps on a larger model (ResNet-56,
# width 32, at 128x128) over ImageNet-like JPEGs: images/s, data-wait share,
# step time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-check
case "${1:-}" in
build)
  . scripts/nvcc-env.sh
  stubs=$PWD/target/gpu-stubs
  mkdir -p "$stubs" "$out"
  export CARGO_TARGET_DIR=$PWD/target/gpu RUSTFLAGS="-L native=$stubs"
  build() {
    cargo build --release -p train-example --features cuda
    cargo build --release -p benches --features cuda --bin h2d --bin make-dataset
    cargo test --release -p tests --features cuda --test cuda --no-run --message-format=json \
      | grep -o '"executable":"[^"]*cuda-[^"]*"' | cut -d'"' -f4 | tail -1 >"$out/test-path"
  }
  # The first pass stops at the link step (no CUDA libraries here) with every
  # rlib built; the stubs come from their undefined symbols; the second links.
  build >/dev/null 2>&1 || true
  bash ../shared/gpu/make-stubs.sh "$stubs" "$CARGO_TARGET_DIR"/release/deps/*.rlib >/dev/null
  build
  cp "$CARGO_TARGET_DIR"/release/train-example "$CARGO_TARGET_DIR"/release/h2d \
    "$CARGO_TARGET_DIR"/release/make-dataset "$out/"
  cp "$(cat "$out/test-path")" "$out/cuda-tests"
  ls -la "$out"
  ;;
run)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  # The pip CUDA libraries on the GPU machine, if any, for cudart/cublas/curand/nvrtc.
  for d in /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
  done
  echo "== (a) CUDA integration tests"
  "$out/cuda-tests" --test-threads 1
  echo "== (b) H2D bandwidth"
  data=$("$out/make-dataset" 2000 "$PWD/target/gpu-data")
  "$out/h2d" "$data"
  echo "== (c) training: ResNet-56 width 32 at 128x128, 60 steps per epoch, 2 epochs"
  "$out/train-example" --data "$data" --depth 56 --width 32 --image-size 128 \
    --batch-size 128 --steps 60 --epochs 2 --workers 0 --prefetch 3
  ;;
*)
  echo "usage: $0 build|run" >&2
  exit 2
  ;;
esac
