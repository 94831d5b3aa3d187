# Shared by the bench scripts (sourced, from the repository root).

# Builds wick (with its command line) and the bench binaries make-dataset
# and those named ("$@" after the count), and writes the ImageNet-like
# photo set of $1 images once (the `make-dataset` bench binary): sets `w`,
# the wick binary, and `src`, the set's folder.
photo_set() {
  local count=$1 bins=(--bin make-dataset) b
  shift
  for b in "$@"; do bins+=(--bin "$b"); done
  cargo build --release -q -p candle-wick --features cli
  cargo build --release -q -p benches "${bins[@]}"
  src=$(./target/release/make-dataset "$count")
  w=./target/release/wick
}

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
