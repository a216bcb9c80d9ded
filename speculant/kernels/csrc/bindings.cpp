// The native kernels as a torch extension module (built by speculant/kernels/native.py).
#include <torch/extension.h>

#include "kernels.h"

namespace speculant {
void bind_stack(pybind11::module& m);
}  // namespace speculant

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &speculant::int4_linear, "x [T, K] f32 times int4 groups packed 8 rows at a time -> [T, n_out] f32");
  m.def("int8_linear", &speculant::int8_linear, "x [T, K] f32 times int8 rows packed 8 at a time -> [T, n_out] f32");
  m.def("dense_linear", &speculant::dense_linear, "x [T, K] f32 times f32/bf16 [N, K] -> [T, N] f32");
  m.def("rms_norm", &speculant::rms_norm, "RMSNorm of each row of x [T, H] f32");
  m.def("add_rms_norm", &speculant::add_rms_norm, "(x + residual, RMSNorm of x + residual)");
  m.def("rotary_", &speculant::rotary_, "rotary embedding in place on the first heads of each row");
  m.def("argmax_rows", &speculant::argmax_rows, "first index of each row's maximum (NaN largest), as torch.argmax");
  m.def("paged_attention", &speculant::paged_attention, "row-invariant attention over paged K/V");
  speculant::bind_stack(m);
}
