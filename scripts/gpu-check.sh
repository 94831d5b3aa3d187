#!/usr/bin/env bash
# The CUDA path's check, in two halves.
#
#   scripts/gpu-check.sh build   # on a machine without a GPU (this project's): builds
#                                # release binaries with --features cuda into gpu-check/
#   scripts/gpu-check.sh run     # on the GPU machine, repo root, gpu-check/ carried along
#
# The device tool's call for `run` (one try, about 6 min of the session's
# 15 min of device time, plus the machine's start):
#   run(command="bash scripts/gpu-check.sh run", carry=["gpu-check"], timeout_s=420)
# The log (run.log), the feed bench's JSON lines (feed.jsonl), each part's
# own log and an nvidia-smi trace of the feed runs come back under $OUT.
#
# build: nvcc 13.0 from PyPI wheels (scripts/nvcc-env.sh), CUDA libraries
# linked against stubs with the real sonames (shared/gpu/make-stubs.sh); the
# binaries load the real libcuda/cudart/cublas/curand/nvrtc at run time.
# run (ends within ~345 s: each part is capped by what is left of that, and
# a part with too little left is skipped and said so):
# (a) the CUDA integration tests (tests/tests/cuda.rs: every output on
# both device kinds equal to the CPU bit for bit through consumer-side ops;
# large batches under a consumer queuing ~20 ms of GPU work per batch;
# AUTOTUNE resizing the pinned pool; skipped samples, dropped epochs, held
# batches); meanwhile 16 processes of benches/peers/make_dataset.py write
# the feed bench's photos. (b) the mutation check: the large-batch test
# once per ordering guard removed (WICK_SKIP_GUARD), 60 s each at most;
# each must fail: a pass is "NOT caught", a timeout "INCONCLUSIVE", both
# fail the check (Undelivered is run and reported, never counted: the
# test cannot force it; the model in loader/src/device/ring.rs covers it).
# Pinned, which ran past 40 s in the first run, runs beside (c), whose
# result does not depend on timing; the other guards run alone.
# (c) compute-sanitizer memcheck over the small tests, where the machine
# has it; (d) H2D bandwidth: pageable vs pinned peak vs the loader's copies
# timed with copy-stream events; (e) training on the built-in shapes
# dataset (a learnable signal: corrupted batches would show as accuracy),
# printing the validation accuracy; (f) the feed bench: gpu-check/feed (wick)
# and benches/peers/torch_gpu.py (PyTorch DataLoader with torchvision.io or
# PIL, and nvJPEG) over the photos, batch 256, 224 px, with and without a
# simulated training step (22 chained 4096^2 f32 matmuls), then
# benches/peers/gpu_table.py's table and a summary; exit status non-zero
# if any check failed (a wick feed run that fails counts, a PyTorch one
# does not).
#
# Estimated wall time of `run` (rates from shared/gpu/RUN-2026-12-04.md):
# setup 5 s; (a) 35-45 s (12 s of it the driver compiling candle's PTX on
# first use); (b)+(c) 90-100 s (Pinned's 60 s beside (c), the other four
# ~7 s each); (d) 10 s; (e) 15 s; (f) ~100 s over 9,600 files: wick ~3-5 s
# a run without the step (16k images/s), ~7-12 s with it (37 steps of
# ~60 ms an epoch), PyTorch ~10-15 s a run (import, workers, 3.5-6k
# images/s); table and summary 2 s. About 270 s in all.
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
      --bin train-example --bin h2d --bin make-dataset --bin feed
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
    "$CARGO_TARGET_DIR"/release/make-dataset "$CARGO_TARGET_DIR"/release/feed "$out/"
  cp "$(cat "$out/test-path")" "$out/cuda-tests"
  # Stripped and gzipped: ~40 MB in all before feed was added; the device
  # tool's carry takes 64 MiB (see the listing below).
  for f in train-example h2d make-dataset feed cuda-tests; do
    strip "$out/$f" && gzip -f "$out/$f"
  done
  ls -la "$out"
  ;;
run)
  # Every check's status is collected; one failure must not end the run.
  set +e
  logs=${OUT:-$out} # the device tool brings back what is under $OUT
  mkdir -p "$logs"
  # Never a bare `wait` from here on: it would also wait for tee.
  exec > >(tee "$logs/run.log") 2>&1
  tee_pid=$!
  budget=345 # seconds; the table and the summary need the last ~10
  reserve=10
  status=0
  now() { echo "$EPOCHREALTIME"; }
  since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
  # cap WANT: WANT seconds, or what is left of the budget if less.
  cap() {
    local left=$((budget - reserve - SECONDS))
    if ((left < $1)); then echo "$left"; else echo "$1"; fi
  }
  # room NAME MIN: whether MIN seconds are left for part NAME; says so if not.
  room() {
    if (($(cap "$2") < $2)); then
      echo "$1: skipped, out of time ($((budget - reserve - SECONDS)) s left, $2 s needed)"
      return 1
    fi
  }
  took() { echo "-- took $(since "$1") s (at ${SECONDS} s of ${budget})"; }

  for f in "$out"/*.gz; do gunzip -kf "$f"; done
  for f in train-example h2d make-dataset feed cuda-tests; do
    if [ -f "$out/$f" ]; then chmod +x "$out/$f"; else echo "$out/$f: missing"; fi
  done
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)'
  # cudart/cublas/curand/nvrtc 13 from the pip `nvidia` packages there (PyTorch's);
  # libcuda comes with the driver.
  nvroots=$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)
  for root in $nvroots; do
    for d in "$root"/*/lib "$root"/cu13/lib; do
      if [ -d "$d" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; fi
    done
  done

  # The feed bench's photos, written while (a) runs (niced below the
  # tests): 16 x 300 ImageNet-sized photos, 1% PNG and ~4% grayscale JPEGs
  # among them, kept (both loaders handle them).
  parts=$PWD/target/gpu-photo-parts
  photos=$PWD/target/gpu-photos
  copies=2 # hard links: 9,600 files (x3, the first run's 14k, would add ~35 s to (f))
  photo_pids=()
  for i in $(seq 1 16); do
    nice -n 10 python3 benches/peers/make_dataset.py "$parts/s$i" 300 "$i" \
      >/dev/null 2>"$logs/make-photos-$i.log" &
    photo_pids+=($!)
  done
  nice -n 10 "$out/make-dataset" 2000 "$PWD/target/gpu-data" \
    >"$logs/h2d-data.path" 2>"$logs/h2d-data.log" &
  data_pid=$!

  echo "== (a) CUDA integration tests"
  t=$(now)
  tests="skipped (out of time)"
  if room "(a)" 60; then
    timeout -k 5 "$(cap 150)" "$out/cuda-tests" --test-threads 1 --nocapture \
      >"$logs/tests.log" 2>&1
    rc=$?
    cat "$logs/tests.log"
    tests=$(sed -n 's/^test result: \([A-Za-z]*\)\. \([0-9]* passed\); \([0-9]* failed\).*/\1: \2, \3/p' \
      "$logs/tests.log" | head -n 1)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then tests="timed out"; fi
    if [ "$rc" != 0 ]; then status=1; fi
    tests="${tests:-no result line} (rc $rc)"
  else
    status=1
  fi
  took "$t"

  echo "== (b) mutation check: the large-batch test once per ordering guard removed"
  verdicts=()
  # mutant GUARD: the large-batch test without GUARD; its rc and seconds.
  mutant() {
    local t rc
    t=$(now)
    timeout -k 5 60 env WICK_SKIP_GUARD="$1" "$out/cuda-tests" --test-threads 1 --nocapture \
      large_batches >"$logs/mutant-$1.log" 2>&1
    rc=$?
    echo "$rc $(since "$t")" >"$logs/mutant-$1.rc"
  }
  # evidence LOG: the first line that shows how the test failed.
  evidence() {
    local e
    # The assertion's message ("batches [3, 7] of 16 differ"), not the
    # per-configuration progress lines ("0 of 16 differ").
    if e=$(grep -m1 'batches \[[0-9]' "$1"); then :
    elif e=$(grep -m1 -A1 'panicked at' "$1" | tr -s '\n' ' '); then :
    elif e=$(grep -m1 -o 'CUDA_ERROR_[A-Z_]*.*' "$1"); then :
    else e=$(tail -n 3 "$1" | head -n 1); fi
    e=${e% }
    echo "${e:0:300}"
  }
  verdict() {
    local g=$1 rc=none secs=0 v
    if [ -f "$logs/mutant-$g.rc" ]; then read -r rc secs <"$logs/mutant-$g.rc"; fi
    if [ "$g" = Undelivered ] && [ "$rc" = none ]; then
      v="mutant $g: not run (out of time); not expected to be caught by this test anyway"
    elif [ "$g" = Undelivered ]; then
      v="mutant $g (rc $rc, $secs s): not expected to be caught by this test (covered by the model in loader/src/device/ring.rs)"
    elif [ "$rc" = none ]; then
      v="mutant $g: NOT RUN (out of time)"
      status=1
    elif [ "$rc" = 0 ]; then
      v="mutant $g: NOT caught (the test passed without the guard, $secs s)"
      status=1
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      v="mutant $g: INCONCLUSIVE (timed out after 60 s; last progress: $(grep 'large batches:' "$logs/mutant-$g.log" | tail -n 1))"
      status=1
    else
      v="mutant $g: caught in $secs s: $(evidence "$logs/mutant-$g.log")"
    fi
    echo "$v"
    verdicts+=("$v")
  }
  t=$(now)
  pinned_pid=
  if room "mutant Pinned" 70; then
    echo "mutant Pinned: running beside (c)"
    mutant Pinned &
    pinned_pid=$!
  fi

  echo "== (c) compute-sanitizer memcheck"
  sanitizer="not on this machine"
  cs=$(command -v compute-sanitizer)
  if [ -z "$cs" ]; then
    for c in /usr/local/cuda*/bin/compute-sanitizer; do
      if [ -x "$c" ]; then cs=$c; fi
    done
    for root in $nvroots; do
      for c in "$root"/*/bin/compute-sanitizer; do
        if [ -x "$c" ]; then cs=$c; fi
      done
    done
  fi
  if [ -z "$cs" ]; then
    echo "compute-sanitizer: not on this machine, skipped"
  elif room "(c)" 30; then
    timeout -k 5 "$(cap 120)" "$cs" --tool memcheck --error-exitcode 3 "$out/cuda-tests" \
      --test-threads 1 every_output skipped_samples >"$logs/sanitizer.log" 2>&1
    rc=$?
    tail -n 15 "$logs/sanitizer.log"
    sanitizer=$(grep -m1 -o 'ERROR SUMMARY: .*' "$logs/sanitizer.log")
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then sanitizer="INCONCLUSIVE (timed out)"; fi
    sanitizer="${sanitizer:-no summary line} (rc $rc)"
    if [ "$rc" != 0 ]; then status=1; fi
  else
    sanitizer="skipped (out of time)"
    status=1
  fi
  took "$t"

  echo "== (b) continued"
  if [ -n "$pinned_pid" ]; then wait "$pinned_pid"; fi
  verdict Pinned
  for g in Staged Consumed Ready Undelivered; do
    if room "mutant $g" 70; then mutant "$g"; fi
    verdict "$g"
  done
  took "$t"

  echo "== (d) H2D bandwidth"
  t=$(now)
  h2d="skipped (out of time)"
  wait "$data_pid"
  data=$(head -n 1 "$logs/h2d-data.path")
  if room "(d)" 20; then
    if timeout -k 5 "$(cap 60)" "$out/h2d" "$data"; then h2d=ok; else h2d="failed (rc $?)"; status=1; fi
  else
    status=1
  fi
  took "$t"

  echo "== (e) training on the built-in shapes dataset (learnable), ResNet-20 width 32"
  t=$(now)
  train="skipped (out of time)"
  if room "(e)" 30; then
    if timeout -k 5 "$(cap 90)" "$out/train-example" --depth 20 --width 32 --image-size 40 \
      --batch-size 128 --epochs 6 --workers 0 --prefetch 3; then
      train=ok
    else
      train="failed (rc $?)"
      status=1
    fi
  else
    status=1
  fi
  took "$t"

  echo "== (f) feed bench: wick and PyTorch, batch 256, 224 px"
  t=$(now)
  bad=0
  for pid in "${photo_pids[@]}"; do wait "$pid" || bad=$((bad + 1)); done
  if [ "$bad" != 0 ]; then echo "make_dataset.py: $bad of 16 failed:"; cat "$logs"/make-photos-*.log; fi
  # One ImageFolder (n00..n09) of every part's files, hard-linked `copies`
  # times under new names.
  rm -rf "$photos"
  python3 - "$photos" "$copies" "$parts"/s* <<'PY'
import os, sys
dst, copies, parts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
n = 0
for k in range(copies):
    for part in parts:
        for cls in sorted(os.listdir(part)):
            src = os.path.join(part, cls)
            if not os.path.isdir(src):
                continue
            os.makedirs(os.path.join(dst, cls), exist_ok=True)
            for f in os.listdir(src):
                os.link(os.path.join(src, f),
                        os.path.join(dst, cls, f"{k}-{os.path.basename(part)}-{f}"))
                n += 1
print(f"{dst}: {n} files ({copies} hard links of each photo)")
PY
  du -sh --apparent-size "$photos"
  jsonl=$logs/feed.jsonl
  : >"$jsonl"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu,clocks_event_reasons.active \
    --format=csv -lms 500 >"$logs/smi-feed.csv" 2>&1 &
  smi_pid=$!
  runs=0
  feed_failed=()
  feed_skipped=()
  # feed NAME CAP CMD...: one bench run, at most CAP seconds (less if the
  # budget says so); its output's tail; a failure prints its error and the
  # run goes on.
  feed() {
    local name=$1 want=$2 t rc log
    shift 2
    runs=$((runs + 1))
    log=$logs/feed-$runs.log
    if ! room "-- $name" 15; then
      feed_skipped+=("$name")
      return
    fi
    if [ "$1" = "$out/feed" ] && [ ! -x "$1" ]; then
      echo "-- $name: FAILED: $1 is missing (scripts/gpu-check.sh build makes it)"
      feed_failed+=("$name")
      status=1
      return
    fi
    echo "-- $name"
    t=$(now)
    timeout -k 5 "$(cap "$want")" "$@" >"$log" 2>&1
    rc=$?
    if [ "$rc" = 0 ]; then
      tail -n 8 "$log"
      echo "   ($(since "$t") s)"
    else
      echo "-- $name FAILED (rc $rc, $(since "$t") s); the end of its output:"
      tail -n 12 "$log"
      feed_failed+=("$name")
      if [ "$1" = "$out/feed" ]; then status=1; fi
    fi
  }
  common=(--batch-size 256 --image-size 224 --json "$jsonl")
  wick=("$out/feed" "$photos" --device cuda "${common[@]}")
  torch=(python3 benches/peers/torch_gpu.py "$photos" "${common[@]}")
  if [ -d "$photos" ]; then
    feed "wick, 16 workers, u8" 30 "${wick[@]}" --workers 16 --output u8 --transforms train --epochs 3
    feed "wick, 16 workers, f32" 30 "${wick[@]}" --workers 16 --output f32 --transforms train --epochs 3
    feed "wick, 16 workers, bf16, eval" 30 "${wick[@]}" --workers 16 --output bf16 --transforms eval --epochs 3
    feed "wick, AUTOTUNE, f32 (4 epochs: the ramp)" 40 "${wick[@]}" --workers 0 --output f32 --transforms train --epochs 4
    feed "wick, step alone (matmul:22, no loader)" 30 "${wick[@]}" --no-loader --output f32 --transforms train --step matmul:22 --epochs 2
    feed "wick, AUTOTUNE, f32, step matmul:22" 40 "${wick[@]}" --workers 0 --output f32 --transforms train --step matmul:22 --epochs 3
    feed "wick, 16 workers, f32, step matmul:22" 40 "${wick[@]}" --workers 16 --output f32 --transforms train --step matmul:22 --epochs 3
    feed "torch, step alone (matmul:22, no loader)" 40 "${torch[@]}" --no-loader --output f32 --transforms train --step matmul:22 --epochs 2
    feed "torch tvio, 16 workers, f32, step matmul:22" 50 "${torch[@]}" --peer tvio --workers 16 --output f32 --transforms train --step matmul:22 --epochs 3
    feed "torch tvio, 16 workers, u8" 40 "${torch[@]}" --peer tvio --workers 16 --output u8 --transforms train --epochs 3
    feed "torch pil, 16 workers, u8" 50 "${torch[@]}" --peer pil --workers 16 --output u8 --transforms train --epochs 3
    feed "torch nvjpeg, 8 byte-reading workers, u8" 50 "${torch[@]}" --peer nvjpeg --workers 8 --output u8 --transforms train --epochs 2
  else
    echo "no photos: (f) skipped"
    status=1
  fi
  kill "$smi_pid" 2>/dev/null
  wait "$smi_pid" 2>/dev/null
  took "$t"
  echo
  python3 benches/peers/gpu_table.py "$jsonl"

  echo
  echo "== summary (${SECONDS} s)"
  echo "(a) tests: $tests"
  for v in "${verdicts[@]}"; do echo "(b) $v"; done
  echo "(c) sanitizer: $sanitizer"
  echo "(d) h2d: $h2d"
  echo "(e) train-example: $train"
  echo "(f) feed: $((runs - ${#feed_skipped[@]})) runs, ${#feed_failed[@]} failed, ${#feed_skipped[@]} skipped (out of time)"
  for n in "${feed_failed[@]}"; do echo "    failed: $n"; done
  for n in "${feed_skipped[@]}"; do echo "    skipped: $n"; done
  echo "status: $status"
  # tee ends when nothing writes to it any more.
  exec >/dev/null 2>&1
  wait "$tee_pid"
  exit $status
  ;;
*)
  echo "usage: $0 build|run" >&2
  exit 2
  ;;
esac
