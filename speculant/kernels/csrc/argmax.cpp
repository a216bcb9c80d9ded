// Greedy tokens: the first index of each row's maximum, a NaN counting as larger than any number
// (torch.argmax's answer on the CPU, so a step's tokens are the same on either path). ATen's
// reduction takes ~50 us for one 49,152-wide row of logits here; this takes a few.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "simd.h"

namespace speculant {

namespace {

int64_t argmax_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// Pass 1: the row's maximum in 8 lanes, and whether a NaN was seen (then the scalar path finds
// the first). Pass 2: the first index holding that maximum.
SPECULANT_AVX2 int64_t argmax_avx2(const float* x, int64_t n) {
  if (n < 32) return argmax_scalar(x, n);
  __m256 best[4], nan[4];  // four independent chains: the loop is not held up by max's latency
  for (int c = 0; c < 4; ++c) best[c] = _mm256_loadu_ps(x + 8 * c), nan[c] = _mm256_cmp_ps(best[c], best[c], _CMP_UNORD_Q);
  int64_t i = 32;
  for (; i + 32 <= n; i += 32)
    for (int c = 0; c < 4; ++c) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * c);
      nan[c] = _mm256_or_ps(nan[c], _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      best[c] = _mm256_max_ps(best[c], v);
    }
  const __m256 any_nan = _mm256_or_ps(_mm256_or_ps(nan[0], nan[1]), _mm256_or_ps(nan[2], nan[3]));
  if (_mm256_movemask_ps(any_nan)) return argmax_scalar(x, n);
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(best[0], best[1]), _mm256_max_ps(best[2], best[3])));
  float m = lanes[0];
  for (int l = 1; l < 8; ++l) m = std::fmax(m, lanes[l]);
  for (int64_t j = i; j < n; ++j) {
    if (std::isnan(x[j])) return argmax_scalar(x, n);
    m = std::fmax(m, x[j]);
  }
  const __m256 target = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), target, _CMP_EQ_OQ));
    if (hit) return j + __builtin_ctz(hit);
  }
  for (; j < n; ++j)
    if (x[j] == m) return j;
  return 0;  // not reached: the maximum is in the row
}

}  // namespace

// x [T, V] f32 -> [T] int64
at::Tensor argmax_rows(at::Tensor x, bool avx2) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) > 0,
              "x must be [T, V] float32, contiguous, V > 0");
  const int64_t rows = x.size(0), n = x.size(1);
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  // Rows in parallel only when there are many (a prefill's logits): one row is a few microseconds.
  at::parallel_for(0, rows, 64, [&](int64_t a, int64_t e) {
    for (int64_t t = a; t < e; ++t) op[t] = avx2 ? argmax_avx2(xp + t * n, n) : argmax_scalar(xp + t * n, n);
  });
  return out;
}

}  // namespace speculant
