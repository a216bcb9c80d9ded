// The pieces of the native attention (attention.cpp): the vector exp, a query's scores, its
// softmax numerators and the value sums, each with an AVX2 and a scalar form of the same
// arithmetic, so both paths give the same bits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "simd.h"

namespace speculant {

// exp(x) for x <= 0, 8 lanes (Cephes' expf: n = round(x log2 e), a degree-5 polynomial in the
// remainder, times 2^n); 0 below -87, where float32 leaves its normal range. `exp_scalar` is the
// same arithmetic on one lane, so both paths give the same bits.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f, kExpFloor = -87.f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp_scalar(float x) {
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

SPECULANT_AVX2 inline __m256 exp_avx2(__m256 x) {
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
inline float softmax_numerators_scalar(float* p, int64_t m) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < m; ++j) top = std::fmax(top, p[j]);
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < m; ++j) {
    p[j] = exp_scalar(p[j] - top);
    l[j % 8] += p[j];
  }
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

SPECULANT_AVX2 inline float softmax_numerators_avx2(float* p, int64_t m) {  // p has room for m rounded up to 8
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

// out[i] = sum over keys j, in order, of fma(p[j], v_j[i], .) from 0 (attention.cpp's AVX2 path
// sums the same way, several queries' columns at once).
template <typename C>
void weighted_sum_scalar(const float* p, const C* const* values, int64_t m, float* out, int64_t dv) {
  for (int64_t i = 0; i < dv; ++i) out[i] = 0.f;
  for (int64_t j = 0; j < m; ++j)
    for (int64_t i = 0; i < dv; ++i) out[i] = std::fma(p[j], widen(values[j][i]), out[i]);
}

}  // namespace speculant
