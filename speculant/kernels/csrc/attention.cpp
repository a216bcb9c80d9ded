// Row-invariant attention over a paged K/V cache: each (query token, head) reads its visible
// keys straight from their cache slots in slot-list order, scores them, takes one softmax
// (max, exp, sums in a fixed order over key ranks) and sums the values in key order. Nothing depends on how many
// other queries, sequences or padded keys share the call, so a verification row attends
// exactly as a one-token decode step over the same keys.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "simd.h"

namespace speculant {

namespace {

// exp(x) for x <= 0, 8 lanes (Cephes' expf: n = round(x log2 e), a degree-5 polynomial in the
// remainder, times 2^n); 0 below -87, where float32 leaves its normal range. `exp_scalar` is the
// same arithmetic on one lane, so both paths give the same bits.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f, kExpFloor = -87.f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

float exp_scalar(float x) {
  if (x < kExpFloor) return 0.f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kExpPoly[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kExpPoly[i]);
  const float e = std::fma(p, r * r, r) + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return e * scale;
}

SPECULANT_AVX2 __m256 exp_avx2(__m256 x) {
  const __m256 floor = _mm256_set1_ps(kExpFloor);
  const __m256 under = _mm256_cmp_ps(x, floor, _CMP_LT_OQ);
  x = _mm256_max_ps(x, floor);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(e, _mm256_castsi256_ps(bits)));
}

// A query's scores against its keys key_row(0..m) (cache rows of its KV head): per key, 8 lanes of
// FMA chains over the head dimension summed ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then any
// dimensions past a multiple of 8 in order, times the scale. The AVX2 path does 8 keys at once
// with the same per-key arithmetic, so a key's score never depends on its neighbours.
template <typename C>
void scores_scalar(const float* q, const C* const* keys, int64_t m, int64_t d, float scale, float* out) {
  const int64_t d8 = d / 8 * 8;
  for (int64_t j = 0; j < m; ++j) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < d8; i += 8)
      for (int k = 0; k < 8; ++k) l[k] = std::fma(q[i + k], widen(keys[j][i + k]), l[k]);
    float acc = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (int64_t i = d8; i < d; ++i) acc = std::fma(q[i], widen(keys[j][i]), acc);
    out[j] = acc * scale;
  }
}

template <typename C>
SPECULANT_AVX2 void scores_avx2(const float* q, const C* const* keys, int64_t m, int64_t d, float scale, float* out) {
  const int64_t d8 = d / 8 * 8;
  for (int64_t j0 = 0; j0 < m; j0 += 8) {
    const C* k[8];
    for (int b = 0; b < 8; ++b) k[b] = keys[std::min(j0 + b, m - 1)];  // past m: a repeat, dropped
    __m256 a[8];
    for (int b = 0; b < 8; ++b) a[b] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      for (int b = 0; b < 8; ++b) a[b] = _mm256_fmadd_ps(qv, load8(k[b] + i), a[b]);
    }
    const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
    alignas(32) float lane[8];
    _mm256_store_ps(lane, s);
    for (int b = 0; b < 8 && j0 + b < m; ++b) {
      float acc = lane[b];
      for (int64_t i = d8; i < d; ++i) acc = std::fma(q[i], widen(k[b][i]), acc);
      out[j0 + b] = acc * scale;
    }
  }
}

// p[j] = exp(score[j] - max) in place; returns their sum: lane j % 8 sums in key order, then the
// lanes as hsum_avx2 adds them.
float softmax_numerators_scalar(float* p, int64_t m) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < m; ++j) top = std::fmax(top, p[j]);
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < m; ++j) {
    p[j] = exp_scalar(p[j] - top);
    l[j % 8] += p[j];
  }
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

SPECULANT_AVX2 float softmax_numerators_avx2(float* p, int64_t m) {  // p has room for m rounded up to 8
  const int64_t padded = (m + 7) / 8 * 8;
  for (int64_t j = m; j < padded; ++j) p[j] = -std::numeric_limits<float>::infinity();
  __m256 top = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < padded; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(p + j));
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  t = _mm_max_ss(t, _mm_movehdup_ps(t));
  const __m256 mx = _mm256_set1_ps(_mm_cvtss_f32(t));
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < padded; j += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p + j), mx));  // -inf padding gives 0
    _mm256_storeu_ps(p + j, e);
    total = _mm256_add_ps(total, e);
  }
  return hsum_avx2(total);
}

// out[i] = sum over keys j, in order, of fma(p[j], v_j[i], .) from 0. Columns go 64 at a time with
// the running sums in registers (each column still takes one FMA per key, in key order).
template <typename C>
SPECULANT_AVX2 void weighted_sum_avx2(const float* p, const C* const* values, int64_t m, float* out, int64_t dv) {
  int64_t c = 0;
  for (; c + 64 <= dv; c += 64) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < m; ++j) {
      const __m256 pv = _mm256_set1_ps(p[j]);
      const C* v = values[j] + c;
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(pv, load8(v + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + c + 8 * i, acc[i]);
  }
  for (; c + 8 <= dv; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < m; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), load8(values[j] + c), acc);
    _mm256_storeu_ps(out + c, acc);
  }
  for (; c < dv; ++c) {
    float acc = 0.f;
    for (int64_t j = 0; j < m; ++j) acc = std::fma(p[j], widen(values[j][c]), acc);
    out[c] = acc;
  }
}

template <typename C>
void weighted_sum_scalar(const float* p, const C* const* values, int64_t m, float* out, int64_t dv) {
  for (int64_t i = 0; i < dv; ++i) out[i] = 0.f;
  for (int64_t j = 0; j < m; ++j)
    for (int64_t i = 0; i < dv; ++i) out[i] = std::fma(p[j], widen(values[j][i]), out[i]);
}

// Each (query token, head): its visible keys listed in slot-list order (a tree's mask drops the
// others before any arithmetic, so a key's rank is the same in a tree as on the accepted chain),
// scored, softmaxed and summed over values as above.
template <typename C>
void attend(const float* q, int64_t q_stride, const C* kc, const C* vc, const int64_t* slots, const int64_t* tok_seq,
            const int64_t* tok_keys, const bool* mask, float* out, int64_t tokens, int64_t heads,
            int64_t kv_heads, int64_t d, int64_t dv, int64_t max_keys, float scale, bool avx2) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, tokens * heads, 1, [&](int64_t a, int64_t e) {
    std::vector<float> p(max_keys + 8);
    std::vector<const C*> keys(max_keys), values(max_keys);
    for (int64_t th = a; th < e; ++th) {
      const int64_t t = th / heads, h = th % heads, kh = h / group;
      const int64_t* row = slots + tok_seq[t] * max_keys;
      const bool* visible = mask ? mask + t * max_keys : nullptr;
      int64_t m = 0;
      for (int64_t j = 0; j < tok_keys[t]; ++j) {
        if (visible && !visible[j]) continue;
        keys[m] = kc + (row[j] * kv_heads + kh) * d;
        values[m++] = vc + (row[j] * kv_heads + kh) * dv;
      }
      const float* qv = q + t * q_stride + h * d;
      float* o = out + th * dv;
      float total;
      if (avx2) {
        scores_avx2(qv, keys.data(), m, d, scale, p.data());
        total = softmax_numerators_avx2(p.data(), m);
        weighted_sum_avx2(p.data(), values.data(), m, o, dv);
      } else {
        scores_scalar(qv, keys.data(), m, d, scale, p.data());
        total = softmax_numerators_scalar(p.data(), m);
        weighted_sum_scalar(p.data(), values.data(), m, o, dv);
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
