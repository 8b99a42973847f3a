// FP8 quantization with dynamic scaling: blocks of the whole tensor, of rows and of columns (the tensorwise,
// rowwise, and transposed-rowwise granularities), e4m3 / e5m2, into x's layout, x^T's, or both.
// Semantics: turbo_inductor/kernels/reference/fp8_quant.py (scale = max(amax, 1e-12) / fmax, q = sat(x * (1/scale))).
//   row blocks:    fp8_row_kernel reduces a row and writes its q in one thread block, from registers;
//   tensor blocks: amax_tensor_kernel (grid-stride, one atomic per thread block) then scale_kernel;
//   column blocks: amax_column_kernel (column sums over row splits, one atomic per column and split) then
//                  scale_kernel;
// then fp8_cast_kernel writes the 64 x 64 tiles, transposing through shared memory for x^T's layout.
// Maxima of |x| are combined with atomicMax on their bits: non-negative floats (and NaN, whose bits are larger
// still) order as integers.
#include "common.cuh"

#include <torch/library.h>

namespace turbo_inductor {
namespace {

enum class Blocks : int { kTensor, kRow, kColumn };

constexpr float kAmaxFloor = 1e-12f;
constexpr int kThreads = 256;
constexpr int kTile = 64;

__device__ __forceinline__ float block_scale(float amax, float fmax, bool power_of_two) {
  float scale = amax != amax ? amax : fmaxf(amax, kAmaxFloor);
  scale = scale / fmax;  // IEEE division, as the reference
  if (power_of_two && ::isfinite(scale)) {  // the smallest power of two >= scale
    int exponent;
    const float mantissa = frexpf(scale, &exponent);
    if (mantissa == 0.5f) exponent -= 1;
    scale = ldexpf(1.f, exponent);
  }
  return scale;
}

// Vectors of a row each thread keeps in registers between the two passes (rows up to kRowItems * 1024 vectors
// are read once; the rest of a longer row is read again).
constexpr int kRowItems = 4;

template <typename T, int V, Fp8Kind K>
__global__ void __launch_bounds__(1024) fp8_row_kernel(const T* __restrict__ x, uint8_t* __restrict__ q,
                                                       float* __restrict__ scale, float* __restrict__ recip,
                                                       int cols, float fmax, bool power_of_two) {
  __shared__ float shared[kMaxWarps];
  const int n_vec = cols / V;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  float kept[kRowItems][V];
  float amax = 0.f;
#pragma unroll
  for (int n = 0; n < kRowItems; ++n) {
    const int i = threadIdx.x + n * blockDim.x;
    if (i < n_vec) {
      const Vec<T, V> v = load_vec<T, V>(x + base + i * V);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        kept[n][j] = static_cast<float>(v.v[j]);
        amax = MaxOp()(amax, fabsf(kept[n][j]));
      }
    }
  }
  for (int i = threadIdx.x + kRowItems * blockDim.x; i < n_vec; i += blockDim.x) {
    const Vec<T, V> v = load_vec<T, V>(x + base + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) amax = MaxOp()(amax, fabsf(static_cast<float>(v.v[j])));
  }
  amax = block_reduce(amax, MaxOp(), shared);
  const float s = block_scale(amax, fmax, power_of_two);
  const float inv = 1.f / s;
  if (threadIdx.x == 0) {
    scale[blockIdx.x] = s;
    recip[blockIdx.x] = inv;
  }
  if (q == nullptr) return;
#pragma unroll
  for (int n = 0; n < kRowItems; ++n) {
    const int i = threadIdx.x + n * blockDim.x;
    if (i < n_vec) {
      Vec<uint8_t, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = to_fp8<K>(kept[n][j] * inv);
      store_vec<uint8_t, V>(q + base + i * V, out);
    }
  }
  for (int i = threadIdx.x + kRowItems * blockDim.x; i < n_vec; i += blockDim.x) {
    const Vec<T, V> v = load_vec<T, V>(x + base + i * V);
    Vec<uint8_t, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = to_fp8<K>(static_cast<float>(v.v[j]) * inv);
    store_vec<uint8_t, V>(q + base + i * V, out);
  }
}

template <typename T, int V>
__global__ void amax_tensor_kernel(const T* __restrict__ x, int64_t n_vec, int* __restrict__ amax_bits) {
  __shared__ float shared[kMaxWarps];
  float amax = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * blockDim.x) {
    const Vec<T, V> v = load_vec<T, V>(x + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) amax = MaxOp()(amax, fabsf(static_cast<float>(v.v[j])));
  }
  amax = block_reduce(amax, MaxOp(), shared);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_int(amax));
}

// Thread blocks of 32 column lanes (V columns each) x 8 row lanes, over rows [row0, row0 + rows_per_split).
template <typename T, int V>
__global__ void amax_column_kernel(const T* __restrict__ x, int64_t rows, int cols, int64_t rows_per_split,
                                   int* __restrict__ amax_bits) {
  __shared__ float partial[8][32 * V];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * 32 + tx) * V;
  const int64_t row0 = blockIdx.y * rows_per_split;
  const int64_t row1 = row0 + rows_per_split < rows ? row0 + rows_per_split : rows;
  float amax[V] = {};
  if (col < cols) {
    for (int64_t r = row0 + ty; r < row1; r += 8) {
      const Vec<T, V> v = load_vec<T, V>(x + r * cols + col);
#pragma unroll
      for (int j = 0; j < V; ++j) amax[j] = MaxOp()(amax[j], fabsf(static_cast<float>(v.v[j])));
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) partial[ty][tx * V + j] = amax[j];
  __syncthreads();
  if (ty != 0 || col >= cols) return;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    for (int t = 1; t < 8; ++t) amax[j] = MaxOp()(amax[j], partial[t][tx * V + j]);
    atomicMax(amax_bits + col + j, __float_as_int(amax[j]));
  }
}

__global__ void scale_kernel(const int* __restrict__ amax_bits, float* __restrict__ scale, float* __restrict__ recip,
                             int64_t n, float fmax, bool power_of_two) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const float s = block_scale(__int_as_float(amax_bits[i]), fmax, power_of_two);
  scale[i] = s;
  recip[i] = 1.f / s;
}

// One 64 x 64 tile of x per thread block: q in x's layout and/or (qt) in x^T's, through shared memory so that both
// are written in whole rows.
template <typename T, int V, Fp8Kind K>
__global__ void fp8_cast_kernel(const T* __restrict__ x, const float* __restrict__ recip, Blocks blocks,
                                uint8_t* __restrict__ q, uint8_t* __restrict__ qt, int64_t rows, int64_t cols,
                                int64_t n_tile_cols) {
  constexpr int kThreadsPerRow = kTile / V;
  constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  __shared__ uint8_t tile_t[kTile][kTile + 4];  // [column][row]; the padding spreads a column's bytes over banks
  const int64_t r0 = (blockIdx.x / n_tile_cols) * kTile, c0 = (blockIdx.x % n_tile_cols) * kTile;
  const int tc = (threadIdx.x % kThreadsPerRow) * V, tr = threadIdx.x / kThreadsPerRow;
#pragma unroll
  for (int pass = 0; pass < kTile / kRowsPerPass; ++pass) {
    const int lr = tr + pass * kRowsPerPass;
    const int64_t r = r0 + lr, c = c0 + tc;
    if (r < rows && c < cols) {  // cols % V == 0: a vector is all in or all out
      const Vec<T, V> v = load_vec<T, V>(x + r * cols + c);
      Vec<uint8_t, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float inv = blocks == Blocks::kRow ? recip[r] : blocks == Blocks::kColumn ? recip[c + j] : recip[0];
        out.v[j] = to_fp8<K>(static_cast<float>(v.v[j]) * inv);
      }
      if (q != nullptr) store_vec<uint8_t, V>(q + r * cols + c, out);
      if (qt != nullptr) {
#pragma unroll
        for (int j = 0; j < V; ++j) tile_t[tc + j][lr] = out.v[j];
      }
    }
  }
  if (qt == nullptr) return;
  __syncthreads();
  // x^T's tile: kTile rows (x's columns c0...) of kTile bytes (x's rows r0...), 16 bytes per thread.
  const int lrow = threadIdx.x / (kTile / 16), lcol = (threadIdx.x % (kTile / 16)) * 16;
  const int64_t qrow = c0 + lrow, qcol = r0 + lcol;
  if (qrow >= cols) return;
  uint8_t* dst = qt + qrow * rows + qcol;
  if (qcol + 16 <= rows && rows % 16 == 0) {
    Vec<uint8_t, 16> out;
#pragma unroll
    for (int j = 0; j < 16; ++j) out.v[j] = tile_t[lrow][lcol + j];
    store_vec<uint8_t, 16>(dst, out);
  } else {
    for (int j = 0; j < 16 && qcol + j < rows; ++j) dst[j] = tile_t[lrow][lcol + j];
  }
}

struct Fp8Format {
  Fp8Kind kind;
  float fmax;
};

Fp8Format fp8_format(at::ScalarType dtype, const at::Device& device) {
  const bool fnuz = dtype == at::kFloat8_e4m3fnuz || dtype == at::kFloat8_e5m2fnuz;
  TORCH_CHECK(fnuz || dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2,
              "turbo_inductor_native::fp8_quantize: fp8_dtype must be an FP8 dtype, got ", dtype);
#if defined(USE_ROCM)
  const bool device_fnuz = std::string(at::cuda::getDeviceProperties(device.index())->gcnArchName).find("gfx942") !=
                           std::string::npos;
#else
  const bool device_fnuz = false;
#endif
  TORCH_CHECK(fnuz == device_fnuz, "turbo_inductor_native::fp8_quantize: this GPU's FP8 format is ",
              device_fnuz ? "fnuz (float8_e4m3fnuz / float8_e5m2fnuz)" : "OCP (float8_e4m3fn / float8_e5m2)",
              ", got ", dtype);
  const bool e4m3 = dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e4m3fnuz;
  const float fmax = dtype == at::kFloat8_e4m3fn ? 448.f : dtype == at::kFloat8_e4m3fnuz ? 240.f : 57344.f;
  return {e4m3 ? Fp8Kind::E4M3 : Fp8Kind::E5M2, fmax};
}

template <typename F>
void with_fp8_kind(Fp8Kind kind, F&& f) {
  if (kind == Fp8Kind::E4M3) {
    f(std::integral_constant<Fp8Kind, Fp8Kind::E4M3>{});
  } else {
    f(std::integral_constant<Fp8Kind, Fp8Kind::E5M2>{});
  }
}

// (q, scale, q^T): q in x's layout unless `transpose` (then x^T's, and the third output is empty), q^T also with
// `both_layouts`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fp8_quantize(const at::Tensor& x, at::ScalarType fp8_dtype,
                                                            int64_t block_rows, int64_t block_cols, bool transpose,
                                                            bool power_of_two, bool both_layouts) {
  constexpr const char* op = "turbo_inductor_native::fp8_quantize";
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.is_contiguous(), op, ": x must be a contiguous 2-D CUDA tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, op,
              ": x must be float32, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(!(transpose && both_layouts), op, ": both_layouts needs transpose=False");
  TORCH_CHECK(block_rows >= 1 && block_cols >= 1, op, ": blocks must be >= 1");
  const c10::cuda::CUDAGuard guard(x.device());
  const Fp8Format format = fp8_format(fp8_dtype, x.device());
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t br = std::min(block_rows, rows), bc = std::min(block_cols, cols);
  Blocks blocks;
  if (br == rows && bc == cols) {
    blocks = Blocks::kTensor;
  } else if (br == 1 && bc == cols) {
    blocks = Blocks::kRow;
  } else {
    TORCH_CHECK(br == rows && bc == 1, op, ": blocks of the whole tensor, of rows or of columns only, got ",
                block_rows, " x ", block_cols, " on ", rows, " x ", cols);
    blocks = Blocks::kColumn;
  }
  TORCH_CHECK(cols <= std::numeric_limits<int>::max(), op, ": too many columns");
  const auto fp8_options = x.options().dtype(fp8_dtype);
  const bool write_q = !transpose, write_qt = transpose || both_layouts;
  at::Tensor q = write_q ? at::empty({rows, cols}, fp8_options) : at::Tensor();
  at::Tensor qt = write_qt ? at::empty({cols, rows}, fp8_options) : at::Tensor();
  const int64_t n_scales = blocks == Blocks::kTensor ? 1 : blocks == Blocks::kRow ? rows : cols;
  at::Tensor scale = at::empty({(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols},
                               x.options().dtype(at::kFloat));
  at::Tensor empty = at::empty({0}, fp8_options);
  auto outputs = [&] { return std::make_tuple(transpose ? qt : q, scale, both_layouts ? qt : empty); };
  if (rows == 0 || cols == 0) {
    scale.fill_(1.f);
    return outputs();
  }
  at::Tensor recip = at::empty({n_scales}, x.options().dtype(at::kFloat));
  uint8_t* q_ptr = write_q ? reinterpret_cast<uint8_t*>(q.data_ptr()) : nullptr;
  uint8_t* qt_ptr = write_qt ? reinterpret_cast<uint8_t*>(qt.data_ptr()) : nullptr;
  const bool vectorized = aligned16(x.data_ptr()) && (cols * x.element_size()) % 16 == 0;
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fp8_quantize", [&] {
    with_vector_width<scalar_t>(vectorized, [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      with_fp8_kind(format.kind, [&](auto kind) {
        constexpr Fp8Kind KIND = decltype(kind)::value;
        const scalar_t* x_ptr = x.data_ptr<scalar_t>();
        if (blocks == Blocks::kRow) {
          // Rows are reduced and (in x's layout) written by one kernel; x^T's layout takes the cast kernel.
          const int threads = row_threads(cols / V, kRowItems);
          fp8_row_kernel<scalar_t, V, KIND><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
              x_ptr, q_ptr, scale.data_ptr<float>(), recip.data_ptr<float>(), static_cast<int>(cols), format.fmax,
              power_of_two);
          check_launch("fp8_row_kernel");
          q_ptr = nullptr;
          if (qt_ptr == nullptr) return;
        } else {
          at::Tensor amax_bits = at::zeros({n_scales}, x.options().dtype(at::kInt));
          if (blocks == Blocks::kTensor) {
            const int64_t n_vec = rows * cols / V;
            const int64_t n_blocks = std::min<int64_t>((n_vec + kThreads - 1) / kThreads, int64_t{sm_count()} * 8);
            amax_tensor_kernel<scalar_t, V><<<static_cast<unsigned>(n_blocks), kThreads, 0, stream>>>(
                x_ptr, n_vec, amax_bits.data_ptr<int>());
            check_launch("amax_tensor_kernel");
          } else {
            const int64_t col_blocks = (cols / V + 31) / 32;
            const int64_t splits = std::max<int64_t>(
                1, std::min<int64_t>((rows + 7) / 8, int64_t{sm_count()} * 4 / col_blocks));
            const int64_t rows_per_split = (rows + splits - 1) / splits;
            amax_column_kernel<scalar_t, V><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits)),
                                              kThreads, 0, stream>>>(x_ptr, rows, static_cast<int>(cols),
                                                                     rows_per_split, amax_bits.data_ptr<int>());
            check_launch("amax_column_kernel");
          }
          scale_kernel<<<static_cast<unsigned>((n_scales + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
              amax_bits.data_ptr<int>(), scale.data_ptr<float>(), recip.data_ptr<float>(), n_scales, format.fmax,
              power_of_two);
          check_launch("scale_kernel");
        }
        const int64_t n_tile_cols = (cols + kTile - 1) / kTile;
        const int64_t n_tiles = (rows + kTile - 1) / kTile * n_tile_cols;
        fp8_cast_kernel<scalar_t, V, KIND><<<static_cast<unsigned>(n_tiles), kThreads, 0, stream>>>(
            x_ptr, recip.data_ptr<float>(), blocks, q_ptr, qt_ptr, rows, cols, n_tile_cols);
        check_launch("fp8_cast_kernel");
      });
    });
  });
  return outputs();
}

}  // namespace

TORCH_LIBRARY_IMPL(turbo_inductor_native, CUDA, m) { m.impl("fp8_quantize", &fp8_quantize); }

}  // namespace turbo_inductor
