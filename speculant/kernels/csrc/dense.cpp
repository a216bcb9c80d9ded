// Row-invariant dense products over float32 or bfloat16 weights, float32 accumulation and output.
// Each (t, n) is one dot product whose operation order depends only on K: four 8-lane
// accumulators over 32-value chunks, then the 8-value chunks left into the first, combined as
// (a0 + a1) + (a2 + a3), summed across lanes in a fixed order, then the scalar tail.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace speculant {

namespace {

// R weight rows x C activation rows; every pair keeps its own four accumulators and runs the
// operations a lone pair would, so the tile shape changes speed, never a result.
template <int R, int C, typename W>
SPECULANT_AVX2 void tile_avx2(const float* x, const W* w, const float* bias, float* y, int64_t k, int64_t n_out) {
  __m256 a[R][C][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      for (int j = 0; j < 4; ++j) a[r][c][j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32)
    for (int j = 0; j < 4; ++j) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load8(w + r * k + i + 8 * j);
      for (int c = 0; c < C; ++c) {
        const __m256 xv = _mm256_loadu_ps(x + c * k + i + 8 * j);
        for (int r = 0; r < R; ++r) a[r][c][j] = _mm256_fmadd_ps(xv, wv[r], a[r][c][j]);
      }
    }
  for (; i + 8 <= k; i += 8)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) a[r][c][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + c * k + i), load8(w + r * k + i), a[r][c][0]);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc = hsum_avx2(_mm256_add_ps(_mm256_add_ps(a[r][c][0], a[r][c][1]), _mm256_add_ps(a[r][c][2], a[r][c][3])));
      for (int64_t t = i; t < k; ++t) acc = std::fma(x[c * k + t], widen(w[r * k + t]), acc);
      y[c * n_out + r] = bias ? acc + bias[r] : acc;
    }
}

template <typename W>
void dense_rows(const float* x, const W* w, const float* bias, float* y, int64_t rows, int64_t n_out, int64_t k, bool avx2) {
  if (!avx2) {
    at::parallel_for(0, n_out, 4, [&](int64_t a, int64_t e) {
      for (int64_t n = a; n < e; ++n)
        for (int64_t t = 0; t < rows; ++t) {
          const float v = dot_scalar(x + t * k, w + n * k, k);
          y[t * n_out + n] = bias ? v + bias[n] : v;
        }
    });
    return;
  }
  // one row: two weight rows in flight; more rows: each weight row against two rows at a time
  const int64_t group = rows == 1 ? 2 : 1;
  at::parallel_for(0, (n_out + group - 1) / group, 4, [&](int64_t a, int64_t e) {
    for (int64_t g = a; g < e; ++g) {
      const int64_t n = g * group;
      const float* b = bias ? bias + n : nullptr;
      if (group == 2 && n + 2 <= n_out) {
        tile_avx2<2, 1>(x, w + n * k, b, y + n, k, n_out);
        continue;
      }
      for (int64_t m = n; m < std::min(n + group, n_out); ++m) {
        const float* bm = bias ? bias + m : nullptr;
        int64_t t = 0;
        for (; t + 2 <= rows; t += 2) tile_avx2<1, 2>(x + t * k, w + m * k, bm, y + t * n_out + m, k, n_out);
        for (; t < rows; ++t) tile_avx2<1, 1>(x + t * k, w + m * k, bm, y + t * n_out + m, k, n_out);
      }
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
