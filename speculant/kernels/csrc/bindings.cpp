// The native kernels as a torch extension module (built by speculant/kernels/native.py).
#include <torch/extension.h>

namespace speculant {
torch::Tensor int4_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor d, torch::Tensor m, bool avx2);
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor wq, torch::Tensor scale, bool avx2);
torch::Tensor dense_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, bool avx2);
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots,
                              torch::Tensor tok_seq, torch::Tensor tok_keys, c10::optional<torch::Tensor> mask,
                              double scale, bool avx2);
}  // namespace speculant

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &speculant::int4_linear, "x [T, K] f32 times int4 groups -> [T, N] f32");
  m.def("int8_linear", &speculant::int8_linear, "x [T, K] f32 times int8 rows -> [T, N] f32");
  m.def("dense_linear", &speculant::dense_linear, "x [T, K] f32 times f32/bf16 [N, K] -> [T, N] f32");
  m.def("paged_attention", &speculant::paged_attention, "row-invariant attention over paged K/V");
}
