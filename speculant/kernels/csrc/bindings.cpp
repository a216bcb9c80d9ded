// The native kernels as a torch extension module (built by speculant/kernels/native.py).
#include <torch/extension.h>

namespace speculant {
torch::Tensor int4_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor d, torch::Tensor m, int64_t n_out, bool avx2);
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scale, int64_t n_out, bool avx2);
torch::Tensor dense_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, bool avx2);
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots,
                              torch::Tensor tok_seq, torch::Tensor tok_keys, c10::optional<torch::Tensor> mask,
                              c10::optional<torch::Tensor> k_new, c10::optional<torch::Tensor> v_new,
                              c10::optional<torch::Tensor> slot_mapping, double scale, bool avx2);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps, bool avx2);
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps,
                                                     bool avx2);
void rotary_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t head_dim);
}  // namespace speculant

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &speculant::int4_linear, "x [T, K] f32 times int4 groups packed 8 rows at a time -> [T, n_out] f32");
  m.def("int8_linear", &speculant::int8_linear, "x [T, K] f32 times int8 rows packed 8 at a time -> [T, n_out] f32");
  m.def("dense_linear", &speculant::dense_linear, "x [T, K] f32 times f32/bf16 [N, K] -> [T, N] f32");
  m.def("rms_norm", &speculant::rms_norm, "RMSNorm of each row of x [T, H] f32");
  m.def("add_rms_norm", &speculant::add_rms_norm, "(x + residual, RMSNorm of x + residual)");
  m.def("rotary_", &speculant::rotary_, "rotary embedding in place on the first heads of each row");
  m.def("paged_attention", &speculant::paged_attention, "row-invariant attention over paged K/V");
}
