// Row-invariant dense products over float32 or bfloat16 weights, float32 accumulation and output.
// Each (t, n) is one dot product whose operation order depends only on K: four 8-lane
// accumulators over 32-value chunks, then the 8-value chunks left into the first, combined as
// (a0 + a1) + (a2 + a3), summed across lanes in a fixed order, then the scalar tail.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "simd.h"

namespace speculant {

namespace {

inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_float(v); }

SPECULANT_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SPECULANT_AVX2 inline __m256 load8(const uint16_t* p) { return load_bf16_avx2(p); }

template <typename W>
float dot_scalar(const float* x, const W* w, int64_t k) {
  float acc = 0.f;
  for (int64_t i = 0; i < k; ++i) acc = std::fma(x[i], widen(w[i]), acc);
  return acc;
}

template <typename W>
SPECULANT_AVX2 float dot_avx2(const float* x, const W* w, int64_t k) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8(w + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load8(w + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), load8(w + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), load8(w + i + 24), a3);
  }
  for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8(w + i), a0);
  float acc = hsum_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < k; ++i) acc = std::fma(x[i], widen(w[i]), acc);
  return acc;
}

template <typename W>
void dense_rows(const float* x, const W* w, const float* bias, float* y, int64_t rows, int64_t n_out, int64_t k, bool avx2) {
  at::parallel_for(0, n_out, 4, [&](int64_t a, int64_t e) {
    for (int64_t n = a; n < e; ++n)
      for (int64_t t = 0; t < rows; ++t) {
        const float v = avx2 ? dot_avx2(x + t * k, w + n * k, k) : dot_scalar(x + t * k, w + n * k, k);
        y[t * n_out + n] = bias ? v + bias[n] : v;
      }
  });
}

}  // namespace

// x [T, K] f32; w [N, K] f32 or bf16; bias [N] f32 or undefined -> [T, N] f32
at::Tensor dense_linear(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias, bool avx2) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be [T, K] float32, contiguous");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(1) == x.size(1), "w must be [N, K], contiguous, K = x's columns");
  const int64_t rows = x.size(0), n_out = w.size(0), k = w.size(1);
  auto y = at::empty({rows, n_out}, x.options());
  const float* b = nullptr;
  if (bias && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == n_out, "bias must be [N] float32");
    b = bias->data_ptr<float>();
  }
  if (w.scalar_type() == at::kFloat) {
    dense_rows(x.data_ptr<float>(), w.data_ptr<float>(), b, y.data_ptr<float>(), rows, n_out, k, avx2);
  } else {
    TORCH_CHECK(w.scalar_type() == at::kBFloat16, "w must be float32 or bfloat16");
    const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
    dense_rows(x.data_ptr<float>(), wp, b, y.data_ptr<float>(), rows, n_out, k, avx2);
  }
  return y;
}

}  // namespace speculant
