#!/usr/bin/env bash
# The CUDA path's check, in two halves.
#
#   scripts/gpu-check.sh build   # on a machine without a GPU (this project's): builds
#                                # release binaries with --features cuda into gpu-check/
#   scripts/gpu-check.sh run     # on the GPU machine, repo root, gpu-check/ carried along
#                                # (device tool: carry ["gpu-check"], timeout ~480 s)
#
# build: nvcc 13.0 from PyPI wheels (scripts/nvcc-env.sh), CUDA libraries
# linked against stubs with the real sonames (shared/gpu/make-stubs.sh); the
# binaries load the real libcuda/cudart/cublas/curand/nvrtc at run time.
# run: (a) the CUDA integration tests (tests/tests/cuda.rs: every output on
# both device kinds equal to the CPU bit for bit through consumer-side ops;
# large batches under a consumer queuing ~20 ms of GPU work per batch;
# AUTOTUNE resizing the pinned pool; skipped samples, dropped epochs, held
# batches); (b) the mutation check: the large-batch test once per ordering
# guard removed (WICK_SKIP_GUARD), each must fail; (c) compute-sanitizer
# memcheck over the small tests, where the machine has it; (d) H2D
# bandwidth: pageable vs pinned peak vs the loader's copies timed with
# copy-stream events; (e) training on the built-in shapes dataset (a
# learnable signal: corrupted batches would show as accuracy), printing the
# validation accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-check
case "${1:-}" in
build)
  . scripts/nvcc-env.sh
  stubs=$PWD/target/gpu-stubs
  mkdir -p "$stubs" "$out"
  export CARGO_TARGET_DIR=$PWD/target/gpu RUSTFLAGS="-L native=$stubs"
  # The same packages and features in both commands, so candle's kernels
  # build once and the second command only links.
  build() {
    cargo build --release -p train-example -p benches -p tests \
      --features train-example/cuda,benches/cuda,tests/cuda \
      --bin train-example --bin h2d --bin make-dataset
    cargo test --release -p train-example -p benches -p tests \
      --features train-example/cuda,benches/cuda,tests/cuda \
      --test cuda --no-run --message-format=json \
      | grep -o '"executable":"[^"]*cuda-[^"]*"' | cut -d'"' -f4 | tail -1 >"$out/test-path"
  }
  # The first pass stops at the link step (no CUDA libraries here) with every
  # rlib built; the stubs come from their undefined symbols; the second links.
  build >/dev/null 2>&1 || true
  bash ../shared/gpu/make-stubs.sh "$stubs" "$CARGO_TARGET_DIR"/release/deps/*.rlib \
    "$CARGO_TARGET_DIR"/release/build/candle-kernels-*/out/*.a >/dev/null
  build
  cp "$CARGO_TARGET_DIR"/release/train-example "$CARGO_TARGET_DIR"/release/h2d \
    "$CARGO_TARGET_DIR"/release/make-dataset "$out/"
  cp "$(cat "$out/test-path")" "$out/cuda-tests"
  # Stripped and gzipped: ~40 MB in all, under the device tool's 64 MiB carry.
  for f in train-example h2d make-dataset cuda-tests; do
    strip "$out/$f" && gzip -f "$out/$f"
  done
  ls -la "$out"
  ;;
run)
  for f in "$out"/*.gz; do gunzip -kf "$f"; done
  chmod +x "$out"/train-example "$out"/h2d "$out"/make-dataset "$out"/cuda-tests
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  # cudart/cublas/curand/nvrtc 13 from the pip `nvidia` packages there (PyTorch's);
  # libcuda comes with the driver.
  for root in $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
    for d in "$root"/*/lib "$root"/cu13/lib; do
      [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    done
  done
  status=0
  echo "== (a) CUDA integration tests"
  "$out/cuda-tests" --test-threads 1 --nocapture || status=1
  echo "== (b) mutation check: each guard removed must fail the large-batch test"
  for g in Pinned Staged Consumed Ready Undelivered; do
    if WICK_SKIP_GUARD=$g "$out/cuda-tests" --test-threads 1 large_batches >"$out/mutant-$g.log" 2>&1; then
      # Undelivered needs the loader's stream to lag a dropped epoch by the
      # whole channel, which the test cannot force (the model covers it).
      echo "mutant $g: NOT caught (the test passed without the guard)"
    else
      echo "mutant $g: caught: $(grep -m1 -o 'batches \[.*differ' "$out/mutant-$g.log" || tail -n 3 "$out/mutant-$g.log" | head -n 1)"
    fi
  done
  echo "== (c) compute-sanitizer memcheck"
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1 || true)
  if [ -n "$cs" ]; then
    "$cs" --tool memcheck --error-exitcode 3 "$out/cuda-tests" --test-threads 1 \
      every_output skipped_samples 2>&1 | tail -n 15 || status=1
  else
    echo "compute-sanitizer: not on this machine, skipped"
  fi
  echo "== (d) H2D bandwidth"
  data=$("$out/make-dataset" 2000 "$PWD/target/gpu-data")
  "$out/h2d" "$data" || status=1
  echo "== (e) training on the built-in shapes dataset (learnable), ResNet-20 width 32"
  "$out/train-example" --depth 20 --width 32 --image-size 40 --batch-size 128 \
    --epochs 6 --workers 0 --prefetch 3 || status=1
  exit $status
  ;;
*)
  echo "usage: $0 build|run" >&2
  exit 2
  ;;
esac
