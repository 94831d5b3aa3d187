# Source this: puts a CUDA 13.0 nvcc (PyPI wheels, no GPU needed) on PATH so
# `--features cuda` builds here. The venv is cached in $WICK_CACHE (default
# ~/.cache/wick). The five wheels are pinned together: pip mixes versions
# otherwise (see shared/gpu/NOTES.md).
wick_cache=${WICK_CACHE:-$HOME/.cache/wick}
wick_nvcc_venv=$wick_cache/nvcc-venv
wick_nvcc_bin=$wick_nvcc_venv/lib/python3.11/site-packages/nvidia/cu13/bin
if [ ! -x "$wick_nvcc_bin/nvcc" ]; then
  echo "== installing nvcc 13.0 wheels into $wick_nvcc_venv"
  python3 -m venv "$wick_nvcc_venv"
  "$wick_nvcc_venv/bin/pip" install -q nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 \
    nvidia-cuda-cccl==13.0.85 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
fi
export PATH="$wick_nvcc_bin:$PATH"
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
