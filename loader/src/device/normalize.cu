// u8 NHWC -> NCHW float in one pass: out[n][c][p] = fma(in[n][p][c], scale[c], bias[c]),
// the host's arithmetic (one fused multiply-add in f32, then round to the output type
// to nearest even), so device and host normalization give the same bits.
// Compiled to PTX by loader/build.rs (nvcc --ptx) when the `cuda` feature is on.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// `pixels`: h * w of one image; `total`: n * h * w.
template <typename T>
__device__ void normalize(const unsigned char *src, T *dst, unsigned long long pixels,
                          unsigned long long total, float s0, float s1, float s2, float b0,
                          float b1, float b2) {
  unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
  for (unsigned long long p = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; p < total;
       p += step) {
    unsigned long long n = p / pixels, q = p - n * pixels;
    const unsigned char *px = src + 3 * p;
    T *out = dst + n * 3 * pixels + q;
    out[0] = from_f32<T>(__fmaf_rn((float)px[0], s0, b0));
    out[pixels] = from_f32<T>(__fmaf_rn((float)px[1], s1, b1));
    out[2 * pixels] = from_f32<T>(__fmaf_rn((float)px[2], s2, b2));
  }
}

#define WICK_NORMALIZE(NAME, T)                                                                    \
  extern "C" __global__ void NAME(const unsigned char *src, T *dst, unsigned long long pixels,     \
                                  unsigned long long total, float s0, float s1, float s2,          \
                                  float b0, float b1, float b2) {                                  \
    normalize<T>(src, dst, pixels, total, s0, s1, s2, b0, b1, b2);                                 \
  }

WICK_NORMALIZE(wick_normalize_f32, float)
WICK_NORMALIZE(wick_normalize_f16, __half)
WICK_NORMALIZE(wick_normalize_bf16, __nv_bfloat16)
