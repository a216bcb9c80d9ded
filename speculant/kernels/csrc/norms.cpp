// The decoder's per-token elementwise work in one call each: RMSNorm (optionally of a residual
// sum it also returns) and rotary embedding in place. Each token row is computed alone in a fixed
// order (8 partial sums of squares, lane i taking elements i, i + 8, ...; the tail into lane 0;
// summed as hsum_avx2 does), so a row's result is the same in any batch, and the AVX2 and scalar
// paths agree exactly.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <tuple>

#include "simd.h"

namespace speculant {

namespace {

float sum_squares_scalar(const float* x, int64_t n) {
  float lane[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] = std::fma(x[i + l], x[i + l], lane[l]);
  float s[4];
  for (int l = 0; l < 4; ++l) s[l] = lane[l] + lane[l + 4];  // hsum_avx2's order
  float total = (s[0] + s[2]) + (s[1] + s[3]);
  for (; i < n; ++i) total = std::fma(x[i], x[i], total);
  return total;
}

SPECULANT_AVX2 float sum_squares_avx2(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float total = hsum_avx2(acc);
  for (; i < n; ++i) total = std::fma(x[i], x[i], total);
  return total;
}

// out[i] = (x[i] * inv) * w[i]
void scale_row(const float* x, const float* w, float inv, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * w[i];
}

// out = rms_norm(x) or, with a residual, sum = x + residual and out = rms_norm(sum)
void norm_rows(const float* x, const float* residual, float* sum, const float* w, float* out, int64_t rows, int64_t n,
               double eps, bool avx2) {
  at::parallel_for(0, rows, 8, [&](int64_t a, int64_t e) {
    for (int64_t t = a; t < e; ++t) {
      const float* xt = x + t * n;
      if (residual) {
        for (int64_t i = 0; i < n; ++i) sum[t * n + i] = xt[i] + residual[t * n + i];
        xt = sum + t * n;
      }
      const float ss = avx2 ? sum_squares_avx2(xt, n) : sum_squares_scalar(xt, n);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      scale_row(xt, w, inv, out + t * n, n);
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be [T, H] float32, contiguous");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() == x.size(1), "w must be [H] float32");
}

}  // namespace

// x [T, H] f32, w [H] -> [T, H]
at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps, bool avx2) {
  check(x, w);
  auto out = at::empty_like(x);
  norm_rows(x.data_ptr<float>(), nullptr, nullptr, w.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), eps,
            avx2);
  return out;
}

// x, residual [T, H] f32 -> (x + residual, rms_norm(x + residual))
std::tuple<at::Tensor, at::Tensor> add_rms_norm(at::Tensor x, at::Tensor residual, at::Tensor w, double eps, bool avx2) {
  check(x, w);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == at::kFloat && residual.is_contiguous(),
              "residual must be float32, contiguous, shaped like x");
  auto sum = at::empty_like(x), out = at::empty_like(x);
  norm_rows(x.data_ptr<float>(), residual.data_ptr<float>(), sum.data_ptr<float>(), w.data_ptr<float>(),
            out.data_ptr<float>(), x.size(0), x.size(1), eps, avx2);
  return {sum, out};
}

// In place on the first `heads` heads of each row of x [T, N] f32 (head h at columns h*D..h*D+D):
// x = x * cos + rotate_half(x) * sin, with cos, sin [T, D] f32 (the rotate-half convention).
void rotary_(at::Tensor x, at::Tensor cos, at::Tensor sin, int64_t heads, int64_t head_dim) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && heads * head_dim <= x.size(1),
              "x must be [T, N] float32, contiguous, N >= heads * head_dim");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.numel() == x.size(0) * head_dim && sin.numel() == cos.numel(),
              "cos, sin must be [T, head_dim] float32, contiguous");
  const int64_t n = x.size(1), half = head_dim / 2;
  float* xp = x.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  at::parallel_for(0, x.size(0), 8, [&](int64_t a, int64_t e) {
    for (int64_t t = a; t < e; ++t) {
      const float *c = cp + t * head_dim, *s = sp + t * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = xp + t * n + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float lo = v[i], hi = v[i + half];
          v[i] = lo * c[i] + (-hi) * s[i];
          v[i + half] = hi * c[i + half] + lo * s[i + half];
        }
      }
    }
  });
}

}  // namespace speculant
