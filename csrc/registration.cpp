// The turbo_inductor_native operator library: schemas and Meta (shape-only) kernels.
// The CUDA kernels register beside their code (rmsnorm.cu, fp8_quant.cu).
// Python reaches these ops only through turbo_inductor/kernels/native, the dispatcher.
// ATen's Tensor and empty alone, not torch/extension.h: this file builds in a third of the time (the meta-kernel
// tests build it on CPU). The Python module is module.cpp's.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace {

using at::Tensor;

std::tuple<Tensor, Tensor, Tensor> rmsnorm_fwd_meta(const Tensor& x, const std::optional<Tensor>& weight,
                                                    const std::optional<Tensor>& residual, double eps) {
  Tensor y = at::empty_symint(x.sym_sizes(), x.options());
  Tensor sum_out = residual.has_value() ? at::empty_symint(x.sym_sizes(), x.options()) : at::empty({0}, x.options());
  Tensor rstd = at::empty_symint({x.sym_size(0)}, x.options().dtype(at::kFloat));
  return {y, sum_out, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_bwd_meta(const Tensor& dy, const Tensor& x, const std::optional<Tensor>& weight,
                                            const Tensor& rstd, const std::optional<Tensor>& dresidual) {
  Tensor dx = at::empty_symint(x.sym_sizes(), x.options());
  Tensor dw = weight.has_value() ? at::empty_symint(weight->sym_sizes(), weight->options())
                                 : at::empty({0}, x.options());
  return {dx, dw};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fp8_quantize_meta(const Tensor& x, at::ScalarType fp8_dtype,
                                                             int64_t block_rows, int64_t block_cols, bool transpose,
                                                             bool power_of_two, bool both_layouts) {
  const c10::SymInt rows = x.sym_size(0), cols = x.sym_size(1);
  const auto fp8_options = x.options().dtype(fp8_dtype), float_options = x.options().dtype(at::kFloat);
  Tensor q = transpose ? at::empty_symint({cols, rows}, fp8_options) : at::empty_symint({rows, cols}, fp8_options);
  Tensor scale = at::empty_symint({(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols},
                                  float_options);
  if (!both_layouts) return {q, scale, at::empty({0}, fp8_options), at::empty({0}, float_options)};
  Tensor scale_t = at::empty_symint({(cols + block_rows - 1) / block_rows, (rows + block_cols - 1) / block_cols},
                                    float_options);
  return {q, scale, at::empty_symint({cols, rows}, fp8_options), scale_t};
}

}  // namespace

TORCH_LIBRARY(turbo_inductor_native, m) {
  // Optional outputs are empty tensors: the sum without a residual, dw without a weight,
  // and fp8_quantize's x^T layout and scales without both_layouts.
  m.def("rmsnorm_fwd(Tensor x, Tensor? weight, Tensor? residual, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("rmsnorm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor rstd, Tensor? dresidual) -> (Tensor, Tensor)");
  m.def("fp8_quantize(Tensor x, ScalarType fp8_dtype, int block_rows, int block_cols, bool transpose, "
        "bool power_of_two, bool both_layouts) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(turbo_inductor_native, Meta, m) {
  m.impl("rmsnorm_fwd", &rmsnorm_fwd_meta);
  m.impl("rmsnorm_bwd", &rmsnorm_bwd_meta);
  m.impl("fp8_quantize", &fp8_quantize_meta);
}
