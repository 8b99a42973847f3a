// RMSNorm forward and backward, plain and with a residual add. Semantics: turbo_inductor/kernels/reference/rmsnorm.py.
// One thread block per row in the forward; in the backward a grid of thread blocks strides over the rows and each
// sums its rows' weight gradient in registers, reduced afterwards in a fixed order (deterministic, no atomics).
#include "common.cuh"

#include <torch/library.h>

namespace turbo_inductor {
namespace {

// Items (vectors of V elements) per thread and row: the row stays in registers between the passes over it. With
// 1024 threads this bounds a row at 2048 vectors (16384 bf16 / 8192 fp32) vectorized, 16384 elements otherwise.
template <int V>
constexpr int kItems = V == 1 ? 16 : 2;

// Rows take up to 1024 threads: the register budget must allow that many (64 registers each).
template <typename T, typename W, int V>
__global__ void __launch_bounds__(1024)
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
      if (residual != nullptr) {  // s = x + residual in fp32, rounded to T: the unfused program's sum, bit for bit
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

template <typename T, typename W, int V>
__global__ void __launch_bounds__(1024)
    rmsnorm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ weight,
                       const float* __restrict__ rstd, const T* __restrict__ dresidual, T* __restrict__ dx,
                       float* __restrict__ dw_partial, int64_t n_rows, int H) {
  constexpr int kN = kItems<V>;
  __shared__ float shared[kMaxWarps];
  const int n_vec = H / V;
  float dw[kN][V] = {};
  for (int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
    const int64_t base = row * H;
    float s[kN][V], g[kN][V];  // the normalized input and dy
    float dot = 0.f;           // sum(dy * w * s)
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int i = threadIdx.x + n * blockDim.x;
      if (i < n_vec) {
        const Vec<T, V> xv = load_vec<T, V>(x + base + i * V);
        const Vec<T, V> gv = load_vec<T, V>(dy + base + i * V);
        Vec<W, V> wv;
        if (weight != nullptr) wv = load_vec<W, V>(weight + i * V);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          s[n][j] = static_cast<float>(xv.v[j]);
          g[n][j] = static_cast<float>(gv.v[j]);
          dot += (weight != nullptr ? g[n][j] * static_cast<float>(wv.v[j]) : g[n][j]) * s[n][j];
        }
      }
    }
    const float c = block_reduce(dot, SumOp(), shared) / H;
    const float r = rstd[row];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int i = threadIdx.x + n * blockDim.x;
      if (i < n_vec) {
        Vec<W, V> wv;
        Vec<T, V> rv, out;
        if (weight != nullptr) wv = load_vec<W, V>(weight + i * V);
        if (dresidual != nullptr) rv = load_vec<T, V>(dresidual + base + i * V);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float gw = weight != nullptr ? g[n][j] * static_cast<float>(wv.v[j]) : g[n][j];
          float d = r * (gw - s[n][j] * (r * r * c));
          if (dresidual != nullptr) d += static_cast<float>(rv.v[j]);
          out.v[j] = static_cast<T>(d);
          dw[n][j] += g[n][j] * s[n][j] * r;
        }
        store_vec<T, V>(dx + base + i * V, out);
      }
    }
  }
  if (dw_partial == nullptr) return;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int i = threadIdx.x + n * blockDim.x;
    if (i < n_vec) {
#pragma unroll
      for (int j = 0; j < V; ++j) dw_partial[static_cast<int64_t>(blockIdx.x) * H + i * V + j] = dw[n][j];
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

// Whether the row-wise tensors allow 16-byte accesses (V elements of x), their weight V elements of its dtype.
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

// Calls f with TypeTag<W>: W = float for an fp32 weight (of 16-bit activations), else the activations' type T.
template <typename T, typename F>
void with_weight_type(const std::optional<at::Tensor>& weight, F&& f) {
  if (weight.has_value() && weight->scalar_type() == at::kFloat) {
    f(TypeTag<float>{});
  } else {
    f(TypeTag<T>{});
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rmsnorm_fwd", [&] {
    with_weight_type<scalar_t>(weight, [&](auto weight_type) {
      using W = typename decltype(weight_type)::type;
      with_vector_width<scalar_t>(vectorized, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        rmsnorm_fwd_kernel<scalar_t, W, V><<<static_cast<unsigned>(n_rows), row_threads(H / V, kItems<V>), 0,
                                             at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<scalar_t>(), ptr_or_null<W>(weight), ptr_or_null<scalar_t>(residual),
            y.data_ptr<scalar_t>(), residual.has_value() ? sum_out.data_ptr<scalar_t>() : nullptr,
            rstd.data_ptr<float>(), H, static_cast<float>(eps));
        check_launch("rmsnorm_fwd_kernel");
      });
    });
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rmsnorm_bwd", [&] {
    with_weight_type<scalar_t>(weight, [&](auto weight_type) {
      using W = typename decltype(weight_type)::type;
      with_vector_width<scalar_t>(vectorized, [&](auto vec) {
        constexpr int V = decltype(vec)::value;
        const int threads = row_threads(H / V, kItems<V>);
        const int64_t n_blocks = std::min<int64_t>(n_rows, int64_t{sm_count()} * std::max(1, 2048 / threads));
        at::Tensor partial;
        if (weight.has_value()) partial = at::empty({n_blocks, H}, x.options().dtype(at::kFloat));
        const auto stream = at::cuda::getCurrentCUDAStream();
        rmsnorm_bwd_kernel<scalar_t, W, V><<<static_cast<unsigned>(n_blocks), threads, 0, stream>>>(
            dy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), ptr_or_null<W>(weight), rstd.data_ptr<float>(),
            ptr_or_null<scalar_t>(dresidual), dx.data_ptr<scalar_t>(),
            weight.has_value() ? partial.data_ptr<float>() : nullptr, n_rows, H);
        check_launch("rmsnorm_bwd_kernel");
        if (weight.has_value()) {
          dw_reduce_kernel<W><<<(H + 31) / 32, 256, 0, stream>>>(partial.data_ptr<float>(), dw.data_ptr<W>(),
                                                                 static_cast<int>(n_blocks), H);
          check_launch("dw_reduce_kernel");
        }
      });
    });
  });
  return {dx, dw};
}

}  // namespace

TORCH_LIBRARY_IMPL(turbo_inductor_native, CUDA, m) {
  m.impl("rmsnorm_fwd", &rmsnorm_fwd);
  m.impl("rmsnorm_bwd", &rmsnorm_bwd);
}

}  // namespace turbo_inductor
