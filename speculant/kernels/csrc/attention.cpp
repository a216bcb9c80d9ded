// Row-invariant attention over a paged K/V cache: each (query token, head) reads its visible
// keys straight from their cache slots in slot-list order, scores them, takes one softmax
// (max, exp, sum in key order) and sums the values in key order. Nothing depends on how many
// other queries, sequences or padded keys share the call, so a verification row attends
// exactly as a one-token decode step over the same keys.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "simd.h"

namespace speculant {

namespace {

template <typename C>
SPECULANT_AVX2 float dot_avx2(const float* q, const C* k, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k + i + 8), a1);
  }
  for (; i + 8 <= d; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), a0);
  float acc = hsum_avx2(_mm256_add_ps(a0, a1));
  for (; i < d; ++i) acc = std::fma(q[i], widen(k[i]), acc);
  return acc;
}

template <typename C>
void axpy_scalar(float p, const C* v, float* out, int64_t d) {
  for (int64_t i = 0; i < d; ++i) out[i] = std::fma(p, widen(v[i]), out[i]);
}

// out[i] = sum over visible keys j, in order, of fma(p[j], v_j[i], .) from 0: the values of a
// query's keys weighted by its softmax. Columns go 64 at a time with the running sums in
// registers (each column still takes one FMA per key, in key order, as a lone column would).
template <typename C>
SPECULANT_AVX2 void weighted_sum_avx2(const float* p, const C* vc, const int64_t* row, const bool* visible, int64_t n,
                                      int64_t stride, float* out, int64_t dv) {
  int64_t c = 0;
  for (; c + 64 <= dv; c += 64) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      if (visible && !visible[j]) continue;
      const __m256 pv = _mm256_set1_ps(p[j]);
      const C* v = vc + row[j] * stride + c;
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(pv, load8(v + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + c + 8 * i, acc[i]);
  }
  for (; c + 8 <= dv; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j)
      if (!visible || visible[j]) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), load8(vc + row[j] * stride + c), acc);
    _mm256_storeu_ps(out + c, acc);
  }
  for (; c < dv; ++c) {
    float acc = 0.f;
    for (int64_t j = 0; j < n; ++j)
      if (!visible || visible[j]) acc = std::fma(p[j], widen(vc[row[j] * stride + c]), acc);
    out[c] = acc;
  }
}

template <typename C>
void attend(const float* q, int64_t q_stride, const C* kc, const C* vc, const int64_t* slots, const int64_t* tok_seq,
            const int64_t* tok_keys, const bool* mask, float* out, int64_t tokens, int64_t heads,
            int64_t kv_heads, int64_t d, int64_t dv, int64_t max_keys, float scale, bool avx2) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, tokens * heads, 1, [&](int64_t a, int64_t e) {
    std::vector<float> score(max_keys);
    for (int64_t th = a; th < e; ++th) {
      const int64_t t = th / heads, h = th % heads, kh = h / group, n = tok_keys[t];
      const int64_t* row = slots + tok_seq[t] * max_keys;
      const bool* visible = mask ? mask + t * max_keys : nullptr;
      const float* qv = q + t * q_stride + h * d;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        if (visible && !visible[j]) continue;
        const C* key = kc + (row[j] * kv_heads + kh) * d;
        score[j] = (avx2 ? dot_avx2(qv, key, d) : dot_scalar(qv, key, d)) * scale;
        top = std::fmax(top, score[j]);
      }
      float total = 0.f;
      for (int64_t j = 0; j < n; ++j) {
        if (visible && !visible[j]) continue;
        score[j] = std::exp(score[j] - top);
        total += score[j];
      }
      float* o = out + th * dv;
      if (avx2) {
        weighted_sum_avx2(score.data(), vc + kh * dv, row, visible, n, kv_heads * dv, o, dv);
      } else {
        for (int64_t i = 0; i < dv; ++i) o[i] = 0.f;
        for (int64_t j = 0; j < n; ++j)
          if (!visible || visible[j]) axpy_scalar(score[j], vc + (row[j] * kv_heads + kh) * dv, o, dv);
      }
      const float inv = 1.f / total;
      for (int64_t i = 0; i < dv; ++i) o[i] *= inv;
    }
  });
}

// Writes each new token's key and value rows into its cache slot: src [T, Hk, D] with rows at any
// stride (a view of the fused QKV product), each row's heads contiguous.
void write_rows(const at::Tensor& src, at::Tensor& cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(src.dim() == 3 && src.scalar_type() == cache.scalar_type() && src.size(1) == cache.size(1) &&
                  src.size(2) == cache.size(2) && src.stride(2) == 1 && src.stride(1) == src.size(2),
              "new keys/values must be [T, Hk, D] in the cache's dtype, each row's heads contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == src.size(0), "slot_mapping must be [T] int64");
  const int64_t row = src.size(1) * src.size(2), bytes = row * src.element_size(), slots = cache.size(0);
  const int64_t* map = slot_mapping.data_ptr<int64_t>();
  const auto* from = static_cast<const char*>(src.data_ptr());
  auto* to = static_cast<char*>(cache.data_ptr());
  for (int64_t t = 0; t < src.size(0); ++t) {
    TORCH_CHECK(map[t] >= 0 && map[t] < slots, "slot ", map[t], " is outside the cache");
    std::memcpy(to + map[t] * bytes, from + t * src.stride(0) * src.element_size(), bytes);
  }
}

}  // namespace

// q [T, H, D] f32 (rows at any stride, each row's heads contiguous); k_cache [S, Hk, D], v_cache
// [S, Hk, Dv] (f32 or bf16); slots [B, L] i64 (each sequence's key slots in position order);
// tok_seq [T] i64; tok_keys [T] i64 (query t reads slots[tok_seq[t], :tok_keys[t]]); mask [T, L]
// bool or undefined (a tree: which of those it sees); new_kv: (k [T, Hk, D], v [T, Hk, Dv],
// slot_mapping [T] i64) written into the caches first, or undefined -> [T, H * Dv] f32
at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots,
                              at::Tensor tok_seq, at::Tensor tok_keys, c10::optional<at::Tensor> mask,
                              c10::optional<at::Tensor> k_new, c10::optional<at::Tensor> v_new,
                              c10::optional<at::Tensor> slot_mapping, double scale, bool avx2) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q must be [T, H, D] float32, each row's heads contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k and v caches must share a dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && tok_seq.scalar_type() == at::kLong && tok_keys.scalar_type() == at::kLong,
              "slots, tok_seq and tok_keys must be int64");
  if (k_new && k_new->defined()) {
    TORCH_CHECK(v_new && v_new->defined() && slot_mapping && slot_mapping->defined(), "new keys need values and slots");
    write_rows(*k_new, k_cache, *slot_mapping);
    write_rows(*v_new, v_cache, *slot_mapping);
  }
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(1), dv = v_cache.size(2), max_keys = slots.size(1);
  TORCH_CHECK(heads % kv_heads == 0 && k_cache.size(2) == d, "head shapes do not match");
  const bool* m = nullptr;
  if (mask && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->size(0) == tokens && mask->size(1) == max_keys, "mask must be [T, L] bool");
    m = mask->data_ptr<bool>();
  }
  auto out = at::empty({tokens, heads * dv}, q.options());
  const int64_t *sp = slots.data_ptr<int64_t>(), *ts = tok_seq.data_ptr<int64_t>(), *tk = tok_keys.data_ptr<int64_t>();
  const float sc = static_cast<float>(scale);
  if (k_cache.scalar_type() == at::kFloat) {
    attend(q.data_ptr<float>(), q.stride(0), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), sp, ts, tk, m, out.data_ptr<float>(),
           tokens, heads, kv_heads, d, dv, max_keys, sc, avx2);
  } else {
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16, "caches must be float32 or bfloat16");
    attend(q.data_ptr<float>(), q.stride(0), reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()),
           reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()), sp, ts, tk, m, out.data_ptr<float>(), tokens,
           heads, kv_heads, d, dv, max_keys, sc, avx2);
  }
  return out;
}

}  // namespace speculant
