// FP8 quantization with dynamic scaling in blocks of the whole tensor, of rows or of columns.
// e4m3 or e5m2, into x's layout, x^T's, or both. Semantics: turbo_inductor/kernels/reference/fp8_quant.py.
//   row blocks:    fp8_row_kernel reduces a row and writes its q from registers;
//   tensor blocks: amax_tensor_kernel (a maximum per thread block), then scale_one_kernel over those;
//   column blocks: amax_column_kernel (maxima per row split), then scale_kernel over the splits;
//   both layouts of a rowwise operand: amax_column_kernel also takes the row maxima, in the same read.
// fp8_cast_kernel then writes 64 x 64 tiles, transposing through shared memory for x^T.
// Maxima are integer maxima on the float32 bits of |x| (abs_bits): NaN's bits win, as torch.amax's NaN does.
// Design and measurements: docs/kernels.md, FP8 quantization.

#include "common.cuh"

#include <torch/library.h>

#include <optional>

namespace turbo_inductor {
namespace {

enum class Blocks : int { kTensor, kRow, kColumn };

constexpr float kAmaxFloor = 1e-12f;
constexpr int kThreads = 256;
constexpr int kTile = 64;

// |v| as a float32's bits (a bfloat16 is its float32's upper half: one shift).
template <typename T>
__device__ __forceinline__ uint32_t abs_bits(T v) {
  return __float_as_uint(static_cast<float>(v)) & 0x7fffffffu;
}

// The float32 bits of a 16-bit T given by its bits (those of a non-negative value: they order as its float32's do).
template <typename T>
__device__ __forceinline__ uint32_t float_bits_of(uint32_t bits) {
  const T value(static_cast<unsigned short>(bits), T::from_bits());
  return abs_bits(value);
}

__device__ __forceinline__ float block_scale(float amax, float fmax, bool power_of_two) {
  float scale = amax != amax ? amax : fmaxf(amax, kAmaxFloor);
  scale = scale / fmax;  // IEEE division, as in the reference
  if (power_of_two && ::isfinite(scale)) {  // the smallest power of two >= scale
    int exponent;
    const float mantissa = frexpf(scale, &exponent);
    if (mantissa == 0.5f) exponent -= 1;
    scale = ldexpf(1.f, exponent);
  }
  return scale;
}

// Vectors of a row each thread keeps in registers between the two passes.
// Rows up to kRowItems * 1024 vectors are read once; the rest of a longer row is read again.
constexpr int kRowItems = 4;

template <typename T, int V, Fp8Kind K>
__global__ void __launch_bounds__(1024) fp8_row_kernel(const T* __restrict__ x, uint8_t* __restrict__ q,
                                                       float* __restrict__ scale, float* __restrict__ recip,
                                                       int cols, float fmax, bool power_of_two) {
  __shared__ float shared[kMaxWarps];
  const int n_vec = cols / V;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  float kept[kRowItems][V];
  uint32_t amax = 0;
#pragma unroll
  for (int n = 0; n < kRowItems; ++n) {
    const int i = threadIdx.x + n * blockDim.x;
    if (i < n_vec) {
      const Vec<T, V> v = load_vec<T, V>(x + base + i * V);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        kept[n][j] = static_cast<float>(v.v[j]);
        amax = max(amax, abs_bits(kept[n][j]));
      }
    }
  }
  for (int i = threadIdx.x + kRowItems * blockDim.x; i < n_vec; i += blockDim.x) {
    const Vec<T, V> v = load_vec<T, V>(x + base + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) amax = max(amax, abs_bits(v.v[j]));
  }
  const float s = block_scale(block_reduce(__uint_as_float(amax), MaxOp(), shared), fmax, power_of_two);
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

// Each thread block writes its maximum (bits) to partial[blockIdx.x]: no zeroed accumulator, no atomics.
template <typename T, int V>
__global__ void amax_tensor_kernel(const T* __restrict__ x, int64_t n_vec, int* __restrict__ partial) {
  __shared__ float shared[kMaxWarps];
  uint32_t amax = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * blockDim.x) {
    const Vec<T, V> v = load_vec<T, V>(x + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) amax = max(amax, abs_bits(v.v[j]));
  }
  const float block_amax = block_reduce(__uint_as_float(amax), MaxOp(), shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = __float_as_int(block_amax);
}

// The maximum over 32 lanes. On AMD that is half a wavefront, and the shuffles stay in that half.
__device__ __forceinline__ uint32_t max_over_32_lanes(uint32_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, WARP_SHFL_XOR(v, offset, 32));
  return v;
}

// Column (and row) maxima. Thread blocks of kColumnWarps warps sit side by side on a row, 32 lanes x V columns each.
// Row splits interleave: split y takes rows y, y + gridDim.y, ...
// Blocks running at one time then read neighbouring rows, as a grid-stride loop does.
// kRowsInFlight rows are loaded before any is reduced. Each thread keeps the maxima of its own V columns.
// With row_partial, the block also reduces each row across its warps.
// Partial maxima (as bits) go to one row per split or column block; scale_kernel reduces them deterministically.
// The kernel is bound by instructions, not memory: see docs/kernels.md, FP8 quantization.
constexpr int kColumnWarps = 8;
constexpr int kRowsInFlight = 8;

template <typename T, int V>
__global__ void __launch_bounds__(kColumnWarps * 32)
    amax_column_kernel(const T* __restrict__ x, int64_t rows, int cols, int* __restrict__ column_partial,
                       int* __restrict__ row_partial) {
  __shared__ uint32_t row_amax[kRowsInFlight][kColumnWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t col = ((static_cast<int64_t>(blockIdx.x) * kColumnWarps + warp) * 32 + lane) * V;
  const int64_t splits = gridDim.y;
  // 16-bit types take maxima on their own bits, two per instruction (max_u16x2).
  // amax[k] then holds columns 2k and 2k + 1 in its halves. Float32 takes one per instruction.
  constexpr bool kPairs = sizeof(T) == 2 && V % 2 == 0;
  uint32_t amax[V] = {};
  // Rows r0 + u * splits, u < kRowsInFlight, per step. Uniform over the block: every thread takes the barriers.
  for (int64_t r0 = blockIdx.y; r0 < rows; r0 += splits * kRowsInFlight) {
    Vec<T, V> v[kRowsInFlight];
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      const int64_t r = r0 + u * splits;
      v[u] = col < cols && r < rows ? load_vec<T, V>(x + r * cols + col) : Vec<T, V>{};  // zeros raise no maximum
    }
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      uint32_t amax_row = 0;
      if constexpr (kPairs) {
        const auto& words = *reinterpret_cast<const Vec<uint32_t, V / 2>*>(&v[u]);
#pragma unroll
        for (int k = 0; k < V / 2; ++k) {
          const uint32_t a = words.v[k] & 0x7fff7fffu;
          amax[k] = max_u16x2(amax[k], a);
          amax_row = max_u16x2(amax_row, a);
        }
        amax_row = float_bits_of<T>(max(amax_row & 0xffffu, amax_row >> 16));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const uint32_t a = abs_bits(v[u].v[j]);
          amax[j] = max(amax[j], a);
          amax_row = max(amax_row, a);
        }
      }
      if (row_partial != nullptr) {
        amax_row = max_over_32_lanes(amax_row);
        if (lane == 0) row_amax[u][warp] = amax_row;
      }
    }
    if (row_partial != nullptr) {
      __syncthreads();
      const int64_t r = r0 + threadIdx.x * splits;
      if (threadIdx.x < kRowsInFlight && r < rows) {
        uint32_t m = row_amax[threadIdx.x][0];
        for (int w = 1; w < kColumnWarps; ++w) m = max(m, row_amax[threadIdx.x][w]);
        row_partial[blockIdx.x * rows + r] = static_cast<int>(m);
      }
      __syncthreads();  // row_amax is written again for the next rows
    }
  }
  if (col >= cols) return;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    uint32_t bits = amax[j];
    if constexpr (kPairs) bits = float_bits_of<T>((amax[j / 2] >> (16 * (j % 2))) & 0xffffu);
    column_partial[blockIdx.y * int64_t{cols} + col + j] = static_cast<int>(bits);
  }
}

// scale and 1/scale of n blocks, from n_partials maxima each (bits; partial p of block i at p * n + i).
// A thread block takes 32 blocks side by side, for coalesced reads.
// Their partials split over 8 lanes and meet in shared memory.
constexpr int kScaleLanes = 32, kScalePartialLanes = 8;

__global__ void scale_kernel(const int* __restrict__ amax_bits, int64_t n_partials, float* __restrict__ scale,
                             float* __restrict__ recip, int64_t n, float fmax, bool power_of_two) {
  __shared__ int partial[kScalePartialLanes][kScaleLanes];
  const int tx = threadIdx.x % kScaleLanes, ty = threadIdx.x / kScaleLanes;
  const int64_t i = blockIdx.x * int64_t{kScaleLanes} + tx;
  int bits = 0;
  if (i < n) {
    for (int64_t p = ty; p < n_partials; p += kScalePartialLanes) bits = max(bits, amax_bits[p * n + i]);
  }
  partial[ty][tx] = bits;
  __syncthreads();
  if (ty != 0 || i >= n) return;
  for (int t = 1; t < kScalePartialLanes; ++t) bits = max(bits, partial[t][tx]);
  const float s = block_scale(__int_as_float(bits), fmax, power_of_two);
  scale[i] = s;
  recip[i] = 1.f / s;
}

// The scale of one block (a whole tensor): every thread strides over the partials, then the warps meet in shared
// memory. scale_kernel's layout leaves 31 lanes of each warp idle: 189 us a step over Qwen2.5's 30 tensorwise
// quantizations in inference on the H200, against 60 us for this kernel.
__global__ void scale_one_kernel(const int* __restrict__ amax_bits, int64_t n_partials, float* __restrict__ scale,
                                 float* __restrict__ recip, float fmax, bool power_of_two) {
  __shared__ uint32_t warp_max[kThreads / 32];
  uint32_t bits = 0;
  for (int64_t p = threadIdx.x; p < n_partials; p += blockDim.x) bits = max(bits, static_cast<uint32_t>(amax_bits[p]));
  bits = max_over_32_lanes(bits);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = bits;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) bits = max(bits, warp_max[w]);
  const float s = block_scale(__uint_as_float(bits), fmax, power_of_two);
  scale[0] = s;
  recip[0] = 1.f / s;
}

// One 64 x 64 tile of x per thread block: q in x's layout and/or qt in x^T's, both in whole rows.
// qt takes q's values, or its own with recip_t (the reciprocal scales of x's columns).
// A thread converts V columns of kRowsPerThread adjacent rows, two values per conversion.
// It stores each column's run of rows into the transposed tile two bytes at a time.
constexpr int kTileStride = kTile + 4;  // bytes per row of the transposed tile: 4-byte rows spread over the banks

template <typename T, int V, Fp8Kind K>
__global__ void fp8_cast_kernel(const T* __restrict__ x, const float* __restrict__ recip, Blocks blocks,
                                const float* __restrict__ recip_t, uint8_t* __restrict__ q, uint8_t* __restrict__ qt,
                                int64_t rows, int64_t cols, int64_t n_tile_cols) {
  constexpr int kThreadsPerRow = kTile / V;
  constexpr int kRowsPerThread = kTile * kThreadsPerRow / kThreads;
  static_assert(kRowsPerThread % 2 == 0, "rows are converted and stored in pairs");
  __shared__ __align__(16) uint8_t tile_t[kTile][kTileStride];  // [column][row]
  const int64_t r0 = (blockIdx.x / n_tile_cols) * kTile, c0 = (blockIdx.x % n_tile_cols) * kTile;
  const int tc = (threadIdx.x % kThreadsPerRow) * V, tr = (threadIdx.x / kThreadsPerRow) * kRowsPerThread;
  const int64_t c = c0 + tc;
  if (c < cols) {  // cols % V == 0: a vector is all in or all out
    // The reciprocal scales, read once: per column or tensor for q, per row for row blocks,
    // and per column of x for qt.
    float inv_col[V], inv_col_t[V], inv_row[kRowsPerThread];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      inv_col[j] = blocks == Blocks::kColumn ? recip[c + j] : recip[0];
      inv_col_t[j] = recip_t != nullptr ? recip_t[c + j] : 0.f;
    }
    float value[kRowsPerThread][V];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t r = r0 + tr + i;
      const Vec<T, V> v = r < rows ? load_vec<T, V>(x + r * cols + c) : Vec<T, V>{};  // rows past the end: zeros
      inv_row[i] = blocks == Blocks::kRow && r < rows ? recip[r] : 0.f;
#pragma unroll
      for (int j = 0; j < V; ++j) value[i][j] = static_cast<float>(v.v[j]);
    }
    // q, row by row: bytes j, j + 1 of a row from one conversion (one at a time where a vector is one element).
    Vec<uint8_t, V> q_rows[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
      for (int j = 0; j < V; j += 2) {
        const float a = value[i][j] * (blocks == Blocks::kRow ? inv_row[i] : inv_col[j]);
        if constexpr (V == 1) {
          q_rows[i].v[j] = to_fp8<K>(a);
        } else {
          const uint16_t pair = to_fp8x2<K>(a, value[i][j + 1] * (blocks == Blocks::kRow ? inv_row[i] : inv_col[j + 1]));
          q_rows[i].v[j] = pair & 0xffu;
          q_rows[i].v[j + 1] = pair >> 8;
        }
      }
      if (q != nullptr && r0 + tr + i < rows) store_vec<uint8_t, V>(q + (r0 + tr + i) * cols + c, q_rows[i]);
    }
    if (qt != nullptr) {  // qt's tile: column j's rows i, i + 1 as one two-byte store
#pragma unroll
      for (int j = 0; j < V; ++j) {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; i += 2) {
          const uint16_t pair = recip_t != nullptr
              ? to_fp8x2<K>(value[i][j] * inv_col_t[j], value[i + 1][j] * inv_col_t[j])
              : static_cast<uint16_t>(q_rows[i].v[j] | (q_rows[i + 1].v[j] << 8));
          *reinterpret_cast<uint16_t*>(&tile_t[tc + j][tr + i]) = pair;
        }
      }
    }
  }
  if (qt == nullptr) return;
  __syncthreads();
  // x^T's tile: kTile rows (x's columns) of kTile bytes (x's rows), 16 bytes per thread.
  // A thread reads them as four 4-byte words: the tile's rows are 4-byte aligned.
  const int lrow = threadIdx.x / (kTile / 16), lcol = (threadIdx.x % (kTile / 16)) * 16;
  const int64_t qrow = c0 + lrow, qcol = r0 + lcol;
  if (qrow >= cols) return;
  uint8_t* dst = qt + qrow * rows + qcol;
  if (qcol + 16 <= rows && rows % 16 == 0) {
    Vec<uint32_t, 4> words;
#pragma unroll
    for (int k = 0; k < 4; ++k) words.v[k] = *reinterpret_cast<const uint32_t*>(&tile_t[lrow][lcol + 4 * k]);
    store_vec<uint32_t, 4>(reinterpret_cast<uint32_t*>(dst), words);
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

// The blocks of a [rows, cols] tensor these kernels take, if any. Blocks larger than the tensor are clipped.
std::optional<Blocks> blocks_of(int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols) {
  const int64_t br = std::min(block_rows, rows), bc = std::min(block_cols, cols);
  if (br == rows && bc == cols) return Blocks::kTensor;
  if (br == 1 && bc == cols) return Blocks::kRow;
  if (br == rows && bc == 1) return Blocks::kColumn;
  return std::nullopt;
}

void launch_scales(const int* amax_bits, int64_t n_partials, float* scale, float* recip, int64_t n,
                   const Fp8Format& format, bool power_of_two, cudaStream_t stream) {
  if (n == 1) {
    scale_one_kernel<<<1, kThreads, 0, stream>>>(amax_bits, n_partials, scale, recip, format.fmax, power_of_two);
    check_launch("scale_one_kernel");
    return;
  }
  scale_kernel<<<static_cast<unsigned>((n + kScaleLanes - 1) / kScaleLanes), kScaleLanes * kScalePartialLanes, 0,
                 stream>>>(amax_bits, n_partials, scale, recip, n, format.fmax, power_of_two);
  check_launch("scale_kernel");
}

// (q, scale, q_t, scale_t): q in x's layout, or x^T's with `transpose`.
// With `both_layouts`, q_t is x^T in blocks of the same shape over x^T; else q_t and scale_t are empty.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fp8_quantize(
    const at::Tensor& x, at::ScalarType fp8_dtype, int64_t block_rows, int64_t block_cols, bool transpose,
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
  const auto fp8_options = x.options().dtype(fp8_dtype), float_options = x.options().dtype(at::kFloat);
  const bool write_q = !transpose, write_qt = transpose || both_layouts;
  at::Tensor q = write_q ? at::empty({rows, cols}, fp8_options) : at::Tensor();
  at::Tensor qt = write_qt ? at::empty({cols, rows}, fp8_options) : at::Tensor();
  at::Tensor scale = at::empty({(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols},
                               float_options);
  at::Tensor scale_t = both_layouts ? at::empty({(cols + block_rows - 1) / block_rows,
                                                 (rows + block_cols - 1) / block_cols}, float_options)
                                    : at::empty({0}, float_options);
  auto outputs = [&] {
    return std::make_tuple(transpose ? qt : q, scale, both_layouts ? qt : at::empty({0}, fp8_options), scale_t);
  };
  if (rows == 0 || cols == 0) {
    scale.fill_(1.f);
    scale_t.fill_(1.f);
    return outputs();
  }
  const std::optional<Blocks> x_blocks = blocks_of(rows, cols, block_rows, block_cols);
  TORCH_CHECK(x_blocks.has_value(), op, ": blocks of the whole tensor, of rows or of columns only, got ", block_rows,
              " x ", block_cols, " on ", rows, " x ", cols);
  const Blocks blocks = *x_blocks;
  // Both layouts: x^T's blocks are x's (the whole tensor), or x^T's rows are x's columns (rowwise).
  TORCH_CHECK(!both_layouts || (blocks != Blocks::kColumn && blocks_of(cols, rows, block_rows, block_cols) == blocks),
              op, ": both layouts in blocks of the whole tensor or of whole rows (of x and of x^T) only, got ",
              block_rows, " x ", block_cols, " on ", rows, " x ", cols);
  const bool column_scales_t = both_layouts && blocks == Blocks::kRow;
  TORCH_CHECK(cols <= std::numeric_limits<int>::max(), op, ": too many columns");
  const int64_t n_scales = blocks == Blocks::kTensor ? 1 : blocks == Blocks::kRow ? rows : cols;
  at::Tensor recip = at::empty({n_scales + (column_scales_t ? cols : 0)}, float_options);
  float* recip_t = column_scales_t ? recip.data_ptr<float>() + n_scales : nullptr;
  uint8_t* q_ptr = write_q ? reinterpret_cast<uint8_t*>(q.data_ptr()) : nullptr;
  uint8_t* qt_ptr = write_qt ? reinterpret_cast<uint8_t*>(qt.data_ptr()) : nullptr;
  const bool vectorized = aligned16(x.data_ptr()) && (cols * x.element_size()) % 16 == 0;
  const auto stream = at::cuda::getCurrentCUDAStream();
  TURBO_INDUCTOR_DISPATCH_FLOATS(x.scalar_type(), "fp8_quantize", [&] {
    with_vector_width<scalar_t>(vectorized, [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      with_fp8_kind(format.kind, [&](auto kind) {
        constexpr Fp8Kind KIND = decltype(kind)::value;
        const scalar_t* x_ptr = x.data_ptr<scalar_t>();
        if (blocks == Blocks::kRow && !column_scales_t) {
          // Rows are reduced and (in x's layout) written by one kernel; x^T's layout takes the cast kernel.
          const int threads = row_threads(cols / V, kRowItems);
          fp8_row_kernel<scalar_t, V, KIND><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
              x_ptr, q_ptr, scale.data_ptr<float>(), recip.data_ptr<float>(), static_cast<int>(cols), format.fmax,
              power_of_two);
          check_launch("fp8_row_kernel");
          q_ptr = nullptr;
          if (qt_ptr == nullptr) return;
        } else {
          const auto int_options = x.options().dtype(at::kInt);
          if (blocks == Blocks::kTensor) {
            const int64_t n_vec = rows * cols / V;
            const int64_t n_blocks = std::min<int64_t>((n_vec + kThreads - 1) / kThreads, int64_t{sm_count()} * 8);
            at::Tensor partial = at::empty({n_blocks}, int_options);
            amax_tensor_kernel<scalar_t, V><<<static_cast<unsigned>(n_blocks), kThreads, 0, stream>>>(
                x_ptr, n_vec, partial.data_ptr<int>());
            check_launch("amax_tensor_kernel");
            launch_scales(partial.data_ptr<int>(), n_blocks, scale.data_ptr<float>(), recip.data_ptr<float>(), 1,
                          format, power_of_two, stream);
          } else {
            // Column maxima, and row maxima for both layouts, as partials per row split and column block.
            // About 4 thread blocks per SM.
            const int64_t col_blocks = (cols / V + kColumnWarps * 32 - 1) / (kColumnWarps * 32);
            const int64_t splits = std::max<int64_t>(1, std::min<int64_t>((rows + kRowsInFlight - 1) / kRowsInFlight,
                                                                          int64_t{sm_count()} * 4 / col_blocks));
            at::Tensor column_partial = at::empty({splits, cols}, int_options);
            at::Tensor row_partial = column_scales_t ? at::empty({col_blocks, rows}, int_options) : at::Tensor();
            int* row_ptr = column_scales_t ? row_partial.data_ptr<int>() : nullptr;
            amax_column_kernel<scalar_t, V><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits)),
                                              kColumnWarps * 32, 0, stream>>>(
                x_ptr, rows, static_cast<int>(cols), column_partial.data_ptr<int>(), row_ptr);
            check_launch("amax_column_kernel");
            if (column_scales_t) {
              launch_scales(row_ptr, col_blocks, scale.data_ptr<float>(), recip.data_ptr<float>(), rows, format,
                            power_of_two, stream);
              launch_scales(column_partial.data_ptr<int>(), splits, scale_t.data_ptr<float>(), recip_t, cols, format,
                            power_of_two, stream);
            } else {
              launch_scales(column_partial.data_ptr<int>(), splits, scale.data_ptr<float>(), recip.data_ptr<float>(),
                            cols, format, power_of_two, stream);
            }
          }
        }
        const int64_t n_tile_cols = (cols + kTile - 1) / kTile;
        const int64_t n_tiles = (rows + kTile - 1) / kTile * n_tile_cols;
        fp8_cast_kernel<scalar_t, V, KIND><<<static_cast<unsigned>(n_tiles), kThreads, 0, stream>>>(
            x_ptr, recip.data_ptr<float>(), blocks, recip_t, q_ptr, qt_ptr, rows, cols, n_tile_cols);
        check_launch("fp8_cast_kernel");
      });
    });
  });
  if (both_layouts && !column_scales_t) scale_t.copy_(scale);  // the whole tensor's one scale
  return outputs();
}

}  // namespace

TORCH_LIBRARY_IMPL(turbo_inductor_native, CUDA, m) { m.impl("fp8_quantize", &fp8_quantize); }

}  // namespace turbo_inductor
