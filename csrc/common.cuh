// What the native kernels share: 16-byte vector access, block reductions and FP8 conversion.
// CUDA C++ that hipify turns into HIP on ROCm, hence portable spellings: ATen's warp size and shuffles,
// no inline assembly, and vendor headers behind USE_ROCM.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/DeviceUtils.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>

#include <limits>
#include <string>
#include <type_traits>

#if defined(USE_ROCM)
#include <hip/hip_fp8.h>
#else
#include <cuda_fp8.h>
#endif

namespace turbo_inductor {

// Elements of T in one 16-byte load or store.
template <typename T>
constexpr int kVec = 16 / sizeof(T);

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// A max that keeps NaN, as torch.amax does; fmaxf drops it. A NaN input makes its block's scale NaN.
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return (a != a || a > b) ? a : b; }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int offset = C10_WARP_SIZE / 2; offset > 0; offset /= 2) v = op(v, WARP_SHFL_XOR(v, offset));
  return v;
}

// The reduction of v over the thread block, returned to every thread. `shared` holds one float per warp.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float* shared) {
  const int lane = threadIdx.x % C10_WARP_SIZE, warp = threadIdx.x / C10_WARP_SIZE;
  const int n_warps = (blockDim.x + C10_WARP_SIZE - 1) / C10_WARP_SIZE;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous reduction may still be reading `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float result = shared[0];
  for (int w = 1; w < n_warps; ++w) result = op(result, shared[w]);
  return result;
}

// The larger of each 16-bit half, as unsigned integers. One max.u16x2 on sm_90; HIP has no __vmaxu2.
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(USE_ROCM)
  return max(a & 0xffffu, b & 0xffffu) | max(a & 0xffff0000u, b & 0xffff0000u);
#else
  return __vmaxu2(a, b);
#endif
}

constexpr int kMaxWarps = 1024 / 32;

inline int sm_count() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// FP8 formats in the encoding the target implements: fnuz on gfx942 (MI300), OCP on gfx950 and NVIDIA.
// The choice is per compile target, so one multi-target build serves both.
enum class Fp8Kind { E4M3, E5M2 };

#if defined(USE_ROCM) && defined(__gfx942__)
#define TURBO_INDUCTOR_FP8_FNUZ 1
#endif

// x and y rounded to nearest even and saturated (NaN stays NaN), as raw bits with x in the low byte.
// One conversion instruction for both: cvt...x2 on sm_89+, v_cvt_pk_fp8_f32 on gfx942.
template <Fp8Kind K>
__device__ __forceinline__ uint16_t to_fp8x2(float x, float y) {
#if defined(USE_ROCM)
#if defined(TURBO_INDUCTOR_FP8_FNUZ)
  constexpr auto kind = K == Fp8Kind::E4M3 ? __HIP_E4M3_FNUZ : __HIP_E5M2_FNUZ;
#else
  constexpr auto kind = K == Fp8Kind::E4M3 ? __HIP_E4M3 : __HIP_E5M2;
#endif
  return static_cast<uint16_t>(__hip_cvt_float2_to_fp8x2(make_float2(x, y), __HIP_SATFINITE, kind));
#else
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, K == Fp8Kind::E4M3 ? __NV_E4M3 : __NV_E5M2));
#endif
}

// One value. The single-value conversions also convert a pair, with a dummy.
template <Fp8Kind K>
__device__ __forceinline__ uint8_t to_fp8(float x) {
  return static_cast<uint8_t>(to_fp8x2<K>(x, 0.f) & 0xffu);
}

}  // namespace turbo_inductor

namespace turbo_inductor {

// A launch error (bad configuration, too many resources) as a Python RuntimeError naming the kernel.
inline void check_launch(const char* kernel) {
  const auto error = cudaGetLastError();
  TORCH_CHECK(error == cudaSuccess, "turbo_inductor native ", kernel, ": ", cudaGetErrorString(error));
}

// AT_DISPATCH over float32, float16 and bfloat16 (scalar_t in the body).
// float64 is not compiled: the ops reject it before dispatching.
#define TURBO_INDUCTOR_DISPATCH_FLOATS(TYPE, NAME, ...)                                                    \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

// Calls f with std::integral_constant<int, V>: V = kVec<T> (16-byte accesses) when `vectorized`, else 1.
template <typename T, typename F>
void with_vector_width(bool vectorized, F&& f) {
  if (vectorized) {
    f(std::integral_constant<int, kVec<T>>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

// Threads for one row of n items, `per_thread` items each. Whole wavefronts of 64 (two NVIDIA warps), at most 1024.
inline int row_threads(int64_t n, int per_thread) {
  const int64_t threads = ((n + per_thread - 1) / per_thread + 63) / 64 * 64;
  return static_cast<int>(std::min<int64_t>(threads, 1024));
}

}  // namespace turbo_inductor
