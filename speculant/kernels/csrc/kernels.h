// The native kernels' entry points, for the bindings and for the decoder stack that chains them.
#pragma once
#include <ATen/ATen.h>

#include <tuple>

namespace speculant {
at::Tensor int4_linear(at::Tensor x, at::Tensor packed, at::Tensor d, at::Tensor m, int64_t n_out, int64_t simd);
at::Tensor int8_linear(at::Tensor x, at::Tensor packed, at::Tensor scale, int64_t n_out, int64_t simd);
at::Tensor dense_linear(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias, bool avx2);
at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots, at::Tensor tok_seq,
                           at::Tensor tok_keys, c10::optional<at::Tensor> mask, c10::optional<at::Tensor> k_new,
                           c10::optional<at::Tensor> v_new, c10::optional<at::Tensor> slot_mapping, double scale, bool avx2);
at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps, bool avx2);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(at::Tensor x, at::Tensor residual, at::Tensor w, double eps, bool avx2);
at::Tensor argmax_rows(at::Tensor x, bool avx2);
void rotary_(at::Tensor x, at::Tensor cos, at::Tensor sin, int64_t heads, int64_t head_dim);
}  // namespace speculant
