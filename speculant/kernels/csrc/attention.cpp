// Row-invariant attention over a paged K/V cache: each (query token, head) reads its visible
// keys straight from their cache slots in slot-list order, scores them, takes one softmax
// (max, exp, sum in key order) and sums the values in key order. Nothing depends on how many
// other queries, sequences or padded keys share the call, so a verification row attends
// exactly as a one-token decode step over the same keys.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
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

template <typename C>
SPECULANT_AVX2 void axpy_avx2(float p, const C* v, float* out, int64_t d) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, load8(v + i), _mm256_loadu_ps(out + i)));
  for (; i < d; ++i) out[i] = std::fma(p, widen(v[i]), out[i]);
}

template <typename C>
void attend(const float* q, const C* kc, const C* vc, const int64_t* slots, const int64_t* tok_seq,
            const int64_t* tok_keys, const bool* mask, float* out, int64_t tokens, int64_t heads,
            int64_t kv_heads, int64_t d, int64_t dv, int64_t max_keys, float scale, bool avx2) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, tokens * heads, 1, [&](int64_t a, int64_t e) {
    std::vector<float> score(max_keys);
    for (int64_t th = a; th < e; ++th) {
      const int64_t t = th / heads, h = th % heads, kh = h / group, n = tok_keys[t];
      const int64_t* row = slots + tok_seq[t] * max_keys;
      const bool* visible = mask ? mask + t * max_keys : nullptr;
      const float* qv = q + th * d;
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
      for (int64_t i = 0; i < dv; ++i) o[i] = 0.f;
      for (int64_t j = 0; j < n; ++j) {
        if (visible && !visible[j]) continue;
        const C* value = vc + (row[j] * kv_heads + kh) * dv;
        avx2 ? axpy_avx2(score[j], value, o, dv) : axpy_scalar(score[j], value, o, dv);
      }
      const float inv = 1.f / total;
      for (int64_t i = 0; i < dv; ++i) o[i] *= inv;
    }
  });
}

}  // namespace

// q [T, H, D] f32; k_cache [S, Hk, D], v_cache [S, Hk, Dv] (f32 or bf16); slots [B, L] i64 (each
// sequence's key slots in position order); tok_seq [T] i64; tok_keys [T] i64 (query t reads
// slots[tok_seq[t], :tok_keys[t]]); mask [T, L] bool or undefined (a tree: which of those it sees)
// -> [T, H * Dv] f32
at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots,
                              at::Tensor tok_seq, at::Tensor tok_keys, c10::optional<at::Tensor> mask,
                              double scale, bool avx2) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be [T, H, D] float32, contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k and v caches must share a dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && tok_seq.scalar_type() == at::kLong && tok_keys.scalar_type() == at::kLong,
              "slots, tok_seq and tok_keys must be int64");
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
    attend(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), sp, ts, tk, m, out.data_ptr<float>(),
           tokens, heads, kv_heads, d, dv, max_keys, sc, avx2);
  } else {
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16, "caches must be float32 or bfloat16");
    attend(q.data_ptr<float>(), reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()),
           reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()), sp, ts, tk, m, out.data_ptr<float>(), tokens,
           heads, kv_heads, d, dv, max_keys, sc, avx2);
  }
  return out;
}

}  // namespace speculant
