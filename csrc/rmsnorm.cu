// RMSNorm forward and backward, plain and with a residual add. Semantics: turbo_inductor/kernels/reference/rmsnorm.py.
// Forward: one thread block per row. Backward: a persistent grid of row groups, with deterministic dw.
// Design and measurements: docs/kernels.md, RMSNorm.
#include "common.cuh"

#include <torch/library.h>

namespace turbo_inductor {
namespace {

// Items (vectors of V elements) per thread and row: the row stays in registers between passes.
// With 1024 threads, a row holds at most 16384 bf16 or 8192 fp32 vectorized, 16384 elements otherwise.
template <int V>
constexpr int kItems = V == 1 ? 16 : 2;

// Rows of up to this many threads compile for blocks of that size: up to 128 registers a thread.
// Wider rows compile for 1024 threads (64 registers), which 14336 bf16 in 896 threads need to launch.
// Narrow rows under the 1024 bound ran 25% slower (8192 bf16, H200).
constexpr int kNarrowRowThreads = 512;

template <typename T, typename W, int V, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    rmsnorm_fwd_kernel(const T* __restrict__ x, const W* __restrict__ weight, const T* __restrict__ residual,
                       T* __restrict__ y, T* __restrict__ sum_out, float* __restrict__ rstd, int H, float eps) {
  constexpr int kN = kItems<V>;
  __shared__ float shared[kMaxWarps];
  const int n_vec = H / V;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * H;
  float s[kN][V];
  float sum_sq = 0.f;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int i = threadIdx.x + n * blockDim.x;
    if (i < n_vec) {
      Vec<T, V> xv = load_vec<T, V>(x + base + i * V);
      if (residual != nullptr) {  // s = x + residual in fp32, rounded to T: the unfused sum, bit for bit
        const Vec<T, V> rv = load_vec<T, V>(residual + base + i * V);
#pragma unroll
        for (int j = 0; j < V; ++j) xv.v[j] = static_cast<T>(static_cast<float>(xv.v[j]) + static_cast<float>(rv.v[j]));
        store_vec<T, V>(sum_out + base + i * V, xv);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        s[n][j] = static_cast<float>(xv.v[j]);
        sum_sq += s[n][j] * s[n][j];
      }
    }
  }
  sum_sq = block_reduce(sum_sq, SumOp(), shared);
  const float r = rsqrtf(sum_sq / H + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int i = threadIdx.x + n * blockDim.x;
    if (i < n_vec) {
      Vec<T, V> out;
      if (weight != nullptr) {
        const Vec<W, V> wv = load_vec<W, V>(weight + i * V);
#pragma unroll
        for (int j = 0; j < V; ++j) out.v[j] = static_cast<T>(s[n][j] * r * static_cast<float>(wv.v[j]));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) out.v[j] = static_cast<T>(s[n][j] * r);
      }
      store_vec<T, V>(y + base + i * V, out);
    }
  }
}

// Backward blocks: narrow rows share blocks of kNarrowRowThreads as row groups (blockDim.y groups of blockDim.x).
// Wider rows take blocks of 1024. A thread holds the current row, the next one in flight, and its dw sums.
// That is 100-120 registers at 16 elements a thread, within the narrow bound's 128.
// A 1024-thread row has 64 registers a thread: no room to prefetch, so it loads each row when it starts on it.

// V elements of T as a thread loads and keeps them: 32-bit words where they fill whole words.
// A row in flight then takes one register per word, unpacked where used.
// 16-bit elements kept apart would take a register each; unpacking at the load would wait for it.
template <typename T, int V>
using Packed = std::conditional_t<sizeof(T) * V % 4 == 0, Vec<uint32_t, sizeof(T) * V / 4>, Vec<T, V>>;

template <typename T, int V>
__device__ __forceinline__ Packed<T, V> load_packed(const T* p) {
  return *reinterpret_cast<const Packed<T, V>*>(p);
}

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> unpack(const Packed<T, V>& packed) {
  static_assert(sizeof(Packed<T, V>) == sizeof(Vec<T, V>), "a packed vector holds V elements");
  Vec<T, V> v;
  memcpy(&v, &packed, sizeof(v));
  return v;
}

// v as float; bfloat16 by its bits. c10's portable conversion uses integer operations.
// The compiler redoes those where a value is used again, rather than hold it across the row's barrier.
template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}

template <>
__device__ __forceinline__ float to_float(c10::BFloat16 v) {
  return c10::detail::f32_from_bits(v.x);
}

// What a thread loads of one row: its items of dy and x, and the row's rstd.
template <typename T, int V>
struct BwdRow {
  Packed<T, V> dy[kItems<V>];
  Packed<T, V> x[kItems<V>];
  float rstd;
};

// Row `row` of this thread's group, or zeros past the last row.
template <typename T, int V>
__device__ __forceinline__ BwdRow<T, V> load_bwd_row(const T* __restrict__ dy, const T* __restrict__ x,
                                                     const float* __restrict__ rstd, int64_t row, int64_t n_rows,
                                                     int H) {
  BwdRow<T, V> loaded{};
  if (row < n_rows) {
    const int64_t base = row * H;
#pragma unroll
    for (int n = 0; n < kItems<V>; ++n) {
      const int i = threadIdx.x + n * blockDim.x;
      if (i < H / V) {
        loaded.dy[n] = load_packed<T, V>(dy + base + i * V);
        loaded.x[n] = load_packed<T, V>(x + base + i * V);
      }
    }
    loaded.rstd = rstd[row];
  }
  return loaded;
}

// The sum of v over this thread's row group (whole warps), returned to each of its threads.
// One barrier per row: consecutive rows use alternate halves of `sums` (`parity`).
// No thread writes a half again before every thread passed the next barrier, so reads are done.
__device__ __forceinline__ float group_sum(float v, float (*sums)[kMaxWarps], int parity) {
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  v = warp_reduce(v, SumOp());
  if (tid % C10_WARP_SIZE == 0) sums[parity][tid / C10_WARP_SIZE] = v;
  __syncthreads();
  const int group_warps = blockDim.x / C10_WARP_SIZE, first = threadIdx.y * group_warps;
  float sum = sums[parity][first];
  for (int w = 1; w < group_warps; ++w) sum += sums[parity][first + w];
  return sum;
}

// Persistent: row group (block b, group y) of G takes rows b * G + y, then steps by G * gridDim.x.
// It sums dw over its rows in fp32 registers. The block's groups add theirs in a fixed order into one partial row,
// which dw_reduce_kernel sums in a fixed order: deterministic, no atomics.
// Narrow rows load the next row before reducing the current one, so the loads land meanwhile.
// Dynamic shared memory: blockDim.x * V floats when G > 1.
template <typename T, typename W, int V, int kThreads>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ weight,
                       const float* __restrict__ rstd, const T* __restrict__ dresidual, T* __restrict__ dx,
                       float* __restrict__ dw_partial, int64_t n_rows, int H) {
  constexpr int kN = kItems<V>;
  constexpr bool kPrefetch = kThreads <= kNarrowRowThreads;
  __shared__ float sums[2][kMaxWarps];
  extern __shared__ float group_dw[];
  const int n_vec = H / V;
  const int64_t rows_per_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  float dw[kN][V] = {};
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  BwdRow<T, V> cur;
  if constexpr (kPrefetch) cur = load_bwd_row<T, V>(dy, x, rstd, row, n_rows, H);
  // The block steps while its first group has a row, so that all its threads take every barrier.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y, step = 0; first < n_rows;
       first += rows_per_step, row += rows_per_step, ++step) {
    BwdRow<T, V> next;
    if constexpr (kPrefetch) {
      next = load_bwd_row<T, V>(dy, x, rstd, row + rows_per_step, n_rows, H);
    } else {
      cur = load_bwd_row<T, V>(dy, x, rstd, row, n_rows, H);
    }
    const bool active = row < n_rows;
    const int64_t base = row * H;
    const float r = cur.rstd;
    Packed<T, V> res[kN];
    float dot = 0.f;  // sum(dy * w * s)
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int i = threadIdx.x + n * blockDim.x;
      if (active && i < n_vec) {
        if (dresidual != nullptr) res[n] = load_packed<T, V>(dresidual + base + i * V);  // in flight meanwhile
        Vec<W, V> wv;
        if (weight != nullptr) wv = load_vec<W, V>(weight + i * V);
        const Vec<T, V> gv = unpack<T, V>(cur.dy[n]), sv = unpack<T, V>(cur.x[n]);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float g = to_float(gv.v[j]), s = to_float(sv.v[j]);
          dot += (weight != nullptr ? g * to_float(wv.v[j]) : g) * s;
          dw[n][j] += g * s * r;
        }
      }
    }
    const float c = group_sum(dot, sums, static_cast<int>(step & 1)) / H;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int i = threadIdx.x + n * blockDim.x;
      if (active && i < n_vec) {
        Vec<W, V> wv;
        Vec<T, V> out;
        if (weight != nullptr) wv = load_vec<W, V>(weight + i * V);  // an L1 hit: every row of the SM reads it
        const Vec<T, V> gv = unpack<T, V>(cur.dy[n]), sv = unpack<T, V>(cur.x[n]);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float g = to_float(gv.v[j]), s = to_float(sv.v[j]);
          const float gw = weight != nullptr ? g * to_float(wv.v[j]) : g;
          float d = r * (gw - s * (r * r * c));
          if (dresidual != nullptr) d += to_float(unpack<T, V>(res[n]).v[j]);
          out.v[j] = static_cast<T>(d);
        }
        store_vec<T, V>(dx + base + i * V, out);
      }
    }
    if constexpr (kPrefetch) cur = next;
  }
  if (dw_partial == nullptr) return;
  // Groups 0, 1, ... add their dw in turn into group_dw, laid out [j][thread] to avoid bank conflicts.
  // The last group writes the block's partial row.
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int i = threadIdx.x + n * blockDim.x;
    for (int group = 0; group < static_cast<int>(blockDim.y); ++group) {
      if (threadIdx.y == group && i < n_vec) {
        Vec<float, V> sum;
#pragma unroll
        for (int j = 0; j < V; ++j) sum.v[j] = group > 0 ? group_dw[j * blockDim.x + threadIdx.x] + dw[n][j] : dw[n][j];
        if (group + 1 < static_cast<int>(blockDim.y)) {
#pragma unroll
          for (int j = 0; j < V; ++j) group_dw[j * blockDim.x + threadIdx.x] = sum.v[j];
        } else {
          store_vec<float, V>(dw_partial + static_cast<int64_t>(blockIdx.x) * H + i * V, sum);
        }
      }
      __syncthreads();
    }
  }
}

// dw[col] = sum over p of partial[p, col], in a fixed order. Thread blocks of 32 columns x 8 partial-row lanes.
template <typename T>
__global__ void dw_reduce_kernel(const float* __restrict__ partial, T* __restrict__ dw, int n_partial, int H) {
  __shared__ float sums[8][32];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + tx;
  float sum = 0.f;
  if (col < H) {
    for (int p = ty; p < n_partial; p += 8) sum += partial[static_cast<int64_t>(p) * H + col];
  }
  sums[ty][tx] = sum;
  __syncthreads();
  if (ty == 0 && col < H) {
    for (int t = 1; t < 8; ++t) sum += sums[t][tx];
    dw[col] = static_cast<T>(sum);
  }
}

void check_rows(const char* op, const at::Tensor& t, const at::Tensor& x, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == x.device(), op, ": ", name, " must be on x's device");
  TORCH_CHECK(t.scalar_type() == x.scalar_type() && t.sizes() == x.sizes() && t.is_contiguous(), op, ": ", name,
              " must be a contiguous tensor of x's shape and dtype");
}

void check_x(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(), op, ": x must be a contiguous 2-D CUDA tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              op, ": x must be float32, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.size(1) * x.element_size() <= 32768, op, ": rows of at most 32 KiB (",
              x.size(1), " x ", x.element_size(), " bytes given)");
  TORCH_CHECK(x.size(0) <= std::numeric_limits<int>::max(), op, ": too many rows");
}

void check_weight(const char* op, const std::optional<at::Tensor>& weight, const at::Tensor& x) {
  if (!weight.has_value()) return;
  TORCH_CHECK(weight->is_cuda() && weight->device() == x.device() && weight->dim() == 1 &&
                  weight->size(0) == x.size(1) && weight->is_contiguous() &&
                  (weight->scalar_type() == x.scalar_type() || weight->scalar_type() == at::kFloat),
              op, ": weight must be a contiguous [H] tensor on x's device, of x's dtype or float32");
}

// Whether the row tensors allow 16-byte accesses (V elements of x), and the weight V of its elements.
bool vectorizable(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                  std::initializer_list<const at::Tensor*> rows) {
  if ((x.size(1) * x.element_size()) % 16 != 0) return false;
  for (const at::Tensor* t : rows) {
    if (t != nullptr && t->defined() && !aligned16(t->data_ptr())) return false;
  }
  const int64_t weight_vector_bytes = weight.has_value() ? 16 / x.element_size() * weight->element_size() : 1;
  return !weight.has_value() || reinterpret_cast<uintptr_t>(weight->data_ptr()) % weight_vector_bytes == 0;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}, TypeTag<W>{}, std::integral_constant<int, V>{}) with x's type T and the weight's W.
// W is float for an fp32 weight, else T. V is the vector width (with_vector_width).
template <typename F>
void with_row_types(const at::Tensor& x, const std::optional<at::Tensor>& weight, bool vectorized, F&& f) {
  TURBO_INDUCTOR_DISPATCH_FLOATS(x.scalar_type(), "rmsnorm", [&] {
    const auto with_weight = [&](auto weight_type) {
      with_vector_width<scalar_t>(vectorized, [&](auto vec) { f(TypeTag<scalar_t>{}, weight_type, vec); });
    };
    if (weight.has_value() && weight->scalar_type() == at::kFloat) {
      with_weight(TypeTag<float>{});
    } else {
      with_weight(TypeTag<scalar_t>{});
    }
  });
}

// Calls f(std::integral_constant<int, N>{}), N being the __launch_bounds__ for rows of `threads` threads.
template <typename F>
void with_thread_bound(int threads, F&& f) {
  if (threads <= kNarrowRowThreads) {
    f(std::integral_constant<int, kNarrowRowThreads>{});
  } else {
    f(std::integral_constant<int, 1024>{});
  }
}

const at::Tensor* maybe(const std::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; }

template <typename T>
const T* ptr_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rmsnorm_fwd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& residual, double eps) {
  constexpr const char* op = "turbo_inductor_native::rmsnorm_fwd";
  check_x(op, x);
  check_weight(op, weight, x);
  if (residual.has_value()) check_rows(op, *residual, x, "residual");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n_rows = x.size(0);
  const int H = static_cast<int>(x.size(1));
  at::Tensor y = at::empty_like(x);
  at::Tensor sum_out = residual.has_value() ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor rstd = at::empty({n_rows}, x.options().dtype(at::kFloat));
  if (n_rows == 0 || H == 0) return {y, sum_out, rstd};
  const bool vectorized = vectorizable(x, weight, {&x, maybe(residual), &y, &sum_out});
  with_row_types(x, weight, vectorized, [&](auto x_type, auto weight_type, auto vec) {
    using T = typename decltype(x_type)::type;
    using W = typename decltype(weight_type)::type;
    constexpr int V = decltype(vec)::value;
    const int threads = row_threads(H / V, kItems<V>);
    with_thread_bound(threads, [&](auto bound) {
      rmsnorm_fwd_kernel<T, W, V, decltype(bound)::value>
          <<<static_cast<unsigned>(n_rows), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
              x.data_ptr<T>(), ptr_or_null<W>(weight), ptr_or_null<T>(residual), y.data_ptr<T>(),
              residual.has_value() ? sum_out.data_ptr<T>() : nullptr, rstd.data_ptr<float>(), H,
              static_cast<float>(eps));
    });
    check_launch("rmsnorm_fwd_kernel");
  });
  return {y, sum_out, rstd};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                               const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                                               const std::optional<at::Tensor>& dresidual) {
  constexpr const char* op = "turbo_inductor_native::rmsnorm_bwd";
  check_x(op, x);
  check_rows(op, dy, x, "dy");
  check_weight(op, weight, x);
  if (dresidual.has_value()) check_rows(op, *dresidual, x, "dresidual");
  TORCH_CHECK(rstd.is_cuda() && rstd.scalar_type() == at::kFloat && rstd.dim() == 1 && rstd.size(0) == x.size(0) &&
                  rstd.is_contiguous(), op, ": rstd must be a contiguous float32 [rows] tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n_rows = x.size(0);
  const int H = static_cast<int>(x.size(1));
  at::Tensor dx = at::empty_like(x);
  at::Tensor dw = weight.has_value() ? at::zeros_like(*weight) : at::empty({0}, x.options());
  if (n_rows == 0 || H == 0) return {dx, dw};
  const bool vectorized = vectorizable(x, weight, {&x, &dy, maybe(dresidual), &dx});
  with_row_types(x, weight, vectorized, [&](auto x_type, auto weight_type, auto vec) {
    using T = typename decltype(x_type)::type;
    using W = typename decltype(weight_type)::type;
    constexpr int V = decltype(vec)::value;
    const int threads = row_threads(H / V, kItems<V>);
    const auto stream = at::cuda::getCurrentCUDAStream();
    at::Tensor partial;
    with_thread_bound(threads, [&](auto bound) {
      constexpr int kBlockThreads = decltype(bound)::value;
      const auto kernel = rmsnorm_bwd_kernel<T, W, V, kBlockThreads>;
      const dim3 block(threads, kBlockThreads / threads);
      const size_t group_dw_bytes = block.y > 1 ? threads * V * sizeof(float) : 0;
      int blocks_per_sm = 0;
      TORCH_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, block.x * block.y,
                                                                group_dw_bytes) == cudaSuccess,
                  op, ": occupancy query failed");
      const int64_t n_blocks = std::min<int64_t>((n_rows + block.y - 1) / block.y,
                                                 int64_t{sm_count()} * std::max(1, blocks_per_sm));
      if (weight.has_value()) partial = at::empty({n_blocks, H}, x.options().dtype(at::kFloat));
      kernel<<<static_cast<unsigned>(n_blocks), block, group_dw_bytes, stream>>>(
          dy.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<W>(weight), rstd.data_ptr<float>(),
          ptr_or_null<T>(dresidual), dx.data_ptr<T>(), weight.has_value() ? partial.data_ptr<float>() : nullptr,
          n_rows, H);
    });
    check_launch("rmsnorm_bwd_kernel");
    if (weight.has_value()) {
      dw_reduce_kernel<W><<<(H + 31) / 32, 256, 0, stream>>>(partial.data_ptr<float>(), dw.data_ptr<W>(),
                                                             static_cast<int>(partial.size(0)), H);
      check_launch("dw_reduce_kernel");
    }
  });
  return {dx, dw};
}

}  // namespace

TORCH_LIBRARY_IMPL(turbo_inductor_native, CUDA, m) {
  m.impl("rmsnorm_fwd", &rmsnorm_fwd);
  m.impl("rmsnorm_bwd", &rmsnorm_bwd);
}

}  // namespace turbo_inductor
