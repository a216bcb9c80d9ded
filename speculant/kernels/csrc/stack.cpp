// A whole Llama-style decoder stack in one call from Python. Per layer: RMSNorm, the fused QKV
// product, RoPE in place, paged attention (writing the new K/V), the output product, residual add
// with RMSNorm, the fused gate/up product, SiLU(gate) x up, the down product, residual add: the
// same kernels on the same operands in the same order as `models/llama.py: decoder_layer` with
// the native backend, so every row has the Python path's bits; only the per-op dispatch between
// them (about 20 Python calls a layer) is gone. `forward_taps` also hands back the residual stream
// after chosen layers (a draft head's feature layers) from the same one call.
#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "kernels.h"

namespace speculant {

namespace {

enum Kind : int64_t { kInt4 = 0, kInt8 = 1, kDense = 2 };

struct Product {  // one `layers/linear.py` layer's native operands
  int64_t kind, n_out;
  std::vector<at::Tensor> ops;  // int4: packed, d, m; int8: packed, scale; dense: weight
  c10::optional<at::Tensor> bias;

  at::Tensor operator()(const at::Tensor& x, int64_t simd) const {  // simd as int4_linear takes it
    const bool avx2 = simd >= 1;
    if (kind == kDense) return dense_linear(x.contiguous(), ops[0], bias, avx2);
    at::Tensor out = kind == kInt4 ? int4_linear(x.contiguous(), ops[0], ops[1], ops[2], n_out, simd)
                                   : int8_linear(x.contiguous(), ops[0], ops[1], n_out, simd);
    return bias ? out.add_(*bias) : out;
  }
};

struct Layer {
  at::Tensor input_norm, post_norm;
  Product qkv, o, gate_up, down;
};

Product product(int64_t kind, std::vector<at::Tensor> ops, c10::optional<at::Tensor> bias, int64_t n_out) {
  TORCH_CHECK(kind == kInt4 ? ops.size() == 3 : kind == kInt8 ? ops.size() == 2 : kind == kDense && ops.size() == 1,
              "a product of kind ", kind, " takes its operands: int4 (packed, d, m), int8 (packed, scale), dense (weight)");
  return Product{kind, n_out, std::move(ops), std::move(bias)};
}

struct Stack {
  std::vector<Layer> layers;
  int64_t heads, kv_heads, head_dim;
  double eps, scale;

  // x [T, hidden] f32; cos, sin [T, head_dim]; caches [layers, S, Hk, D]; the attention plan as
  // `NativeAttentionMeta` holds it -> [T, hidden]
  at::Tensor forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& slots, const at::Tensor& tok_seq,
                     const at::Tensor& tok_keys, const c10::optional<at::Tensor>& mask, const at::Tensor& slot_mapping,
                     int64_t simd) const {
    return run(std::move(x), cos, sin, k_cache, v_cache, slots, tok_seq, tok_keys, mask, slot_mapping, simd, {}).back();
  }

  // The same forward, also handing back the residual stream after each of `ends` layers (sorted
  // layer counts, the last of them all the layers): [T, hidden] per end, from one call.
  std::vector<at::Tensor> forward_taps(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                                       const at::Tensor& v_cache, const at::Tensor& slots, const at::Tensor& tok_seq,
                                       const at::Tensor& tok_keys, const c10::optional<at::Tensor>& mask,
                                       const at::Tensor& slot_mapping, int64_t simd, std::vector<int64_t> ends) const {
    TORCH_CHECK(!ends.empty() && ends.back() == static_cast<int64_t>(layers.size()) && std::is_sorted(ends.begin(), ends.end()),
                "ends: sorted layer counts, the last of them all ", layers.size(), " layers");
    return run(std::move(x), cos, sin, k_cache, v_cache, slots, tok_seq, tok_keys, mask, slot_mapping, simd, ends);
  }

 private:
  // The layers in order; the stream after layer i - 1 is kept where i is in `ends` (and at the end).
  std::vector<at::Tensor> run(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const at::Tensor& slots, const at::Tensor& tok_seq,
                              const at::Tensor& tok_keys, const c10::optional<at::Tensor>& mask,
                              const at::Tensor& slot_mapping, int64_t simd, const std::vector<int64_t>& ends) const {
    const bool avx2 = simd >= 1;
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [T, hidden] float32");
    TORCH_CHECK(k_cache.size(0) == static_cast<int64_t>(layers.size()), "one cache layer per decoder layer");
    const int64_t tokens = x.size(0), q_size = heads * head_dim, kv_size = kv_heads * head_dim;
    std::vector<at::Tensor> kept;
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& w = layers[i];
      at::Tensor kc = k_cache.select(0, i), vc = v_cache.select(0, i);
      at::Tensor qkv = w.qkv(rms_norm(x.contiguous(), w.input_norm, eps, avx2), simd);  // [T, q + 2 kv]
      rotary_(qkv, cos, sin, heads + kv_heads, head_dim);
      at::Tensor q = qkv.narrow(1, 0, q_size).view({tokens, heads, head_dim});
      at::Tensor k = qkv.narrow(1, q_size, kv_size).view({tokens, kv_heads, head_dim});
      at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, kv_heads, head_dim});
      if (k.scalar_type() != kc.scalar_type()) k = k.to(kc.scalar_type()).contiguous(), v = v.to(vc.scalar_type()).contiguous();
      at::Tensor attn = paged_attention(q, kc, vc, slots, tok_seq, tok_keys, mask, k, v, slot_mapping, scale, avx2);
      auto [summed, h] = add_rms_norm(x.contiguous(), w.o(attn, simd).contiguous(), w.post_norm, eps, avx2);
      at::Tensor gate_up = w.gate_up(h, simd);  // [T, 2 I]
      const int64_t inter = gate_up.size(1) / 2;
      x = summed + w.down(at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter), simd);
      const int64_t done = static_cast<int64_t>(i) + 1;  // a new tensor each layer: a kept one stays as it was
      if (std::binary_search(ends.begin(), ends.end(), done) && done < static_cast<int64_t>(layers.size())) kept.push_back(x);
    }
    kept.push_back(x);
    return kept;
  }
};

}  // namespace

void bind_stack(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<Product>(m, "Product");
  py::class_<Layer>(m, "Layer");
  py::class_<Stack>(m, "Stack").def("forward", &Stack::forward).def("forward_taps", &Stack::forward_taps);
  m.def("product", &product, "one product's native operands: kind 0 int4, 1 int8, 2 dense");
  m.def("layer", [](at::Tensor input_norm, at::Tensor post_norm, Product qkv, Product o, Product gate_up, Product down) {
    return Layer{std::move(input_norm), std::move(post_norm), std::move(qkv), std::move(o), std::move(gate_up), std::move(down)};
  });
  m.def("stack", [](std::vector<Layer> layers, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale) {
    return Stack{std::move(layers), heads, kv_heads, head_dim, eps, scale};
  }, "a decoder stack run by one forward call per model forward");
}

}  // namespace speculant
