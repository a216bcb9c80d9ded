// Shared by the kernels: the AVX2 target attribute and fixed-order horizontal sums.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#define SPECULANT_AVX2 __attribute__((target("avx2,fma,f16c")))
// AVX2 code compiled with AVX-512's 32 vector registers (for the tiles that need more than 16).
#define SPECULANT_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw")))

namespace speculant {

// The 8 lanes summed in one fixed order: (l0+l4, l1+l5, l2+l6, l3+l7) pairwise.
SPECULANT_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 bfloat16 values widened to float32 (exact: a bf16 is the top half of an f32).
SPECULANT_AVX2 inline __m256 load_bf16_avx2(const uint16_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// float32 or bfloat16 storage read as float32: one value, or 8 lanes
inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_float(v); }
SPECULANT_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SPECULANT_AVX2 inline __m256 load8(const uint16_t* p) { return load_bf16_avx2(p); }

// The portable path's dot product: one FMA per element, in order.
template <typename W>
float dot_scalar(const float* x, const W* w, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(x[i], widen(w[i]), acc);
  return acc;
}

}  // namespace speculant
