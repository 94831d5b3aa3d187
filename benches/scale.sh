#!/usr/bin/env bash
# What opening a sharded dataset over the network costs one rank, with and
# without its manifest, at 1, 64 and 4,096 ranks, random access and
# streaming (see src/bin/scale-open.rs). Writes 4,096 WebDataset shards of
# 16 samples (about 320 MB) into ${WICK_SCALE_DIR:-target/scale-data} once.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${WICK_SCALE_DIR:-target/scale-data}
cargo build -q --release -p benches --bin scale-open
bin=target/release/scale-open
if [ ! -f "$dir/manifest.json" ]; then
  "$bin" make "$dir" 4096 16
fi
for ranks in "0 1" "17 64" "17 4096"; do
  for mode in manifest scan; do
    for how in random stream; do
      echo "== rank/world $ranks, $mode, $how"
      # shellcheck disable=SC2086
      "$bin" "$dir" $ranks "$mode" "$how"
    done
  done
done
# A rank's whole epoch read at random sample by sample, then by shard
# blocks: requests and bytes against its share, and the shuffle it saw.
for how in random blocks; do
  echo "== epoch, rank 3 of 8, $how"
  "$bin" epoch "$dir" 3 8 "$how"
done
# The 8 ranks of a node by shard blocks, one part for the node or a part
# a rank, the chunks in memory or in one cache directory.
for parts in 1 8; do
  for how in alone dir; do
    echo "== node epoch, 8 ranks, $parts part(s), $how"
    "$bin" node-epoch "$dir" 8 "$parts" "$how"
  done
done
# TFRecord shards opened read through, from their .idx files, and from a
# manifest, and Parquet files from their footers and from a manifest:
# requests and bytes of the open, and what a record's read asks; last,
# 8 ranks of a node opening with the manifest, sharing a cache directory.
for format in tfrecord parquet; do
  echo "== $format, 256 files of 200 records"
  "$bin" "$format" "${dir}-$format" 256 200
done
