// Row-invariant CPU products: y[t, n] = sum_k x[t, k] * w[n, k], with float32 output.
//
// Every output element is computed by one fixed sequence of operations over k, whatever the
// number of rows T, the thread count or how rows and weights are tiled, so a row of a T-row
// product is bit for bit that row alone (what makes a (k+1)-row verification compute what k+1
// one-row steps compute). Quantized weights take activations quantized per 32-value block to
// int16 (scale max|x| / 32767): the block's integer dot product is exact, then scaled and summed
// in block order. (int8 activations, ggml's Q8_0 scheme, lost too much on small models whose
// hidden states carry outlier channels: smollm2-135m stopped answering simple questions.) Two paths: AVX2+FMA and portable scalar; each is row-invariant on its own.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <tuple>

#include "simd.h"

namespace speculant {

namespace {

constexpr int64_t QK = 32;  // activations per quantization block (= the int4 group size)

// ---- activation quantization (one implementation for both paths) ----------------------------

void quantize_row(const float* x, int64_t k, int16_t* q, float* scale, float* sum) {
  for (int64_t b = 0; b < k / QK; ++b) {
    const float* xb = x + b * QK;
    float amax = 0.f;
    for (int i = 0; i < QK; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 32767.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    int32_t s = 0;
    for (int i = 0; i < QK; ++i) {
      const int v = static_cast<int>(std::nearbyint(xb[i] * id));
      q[b * QK + i] = static_cast<int16_t>(v);
      s += v;
    }
    scale[b] = d;
    sum[b] = d * static_cast<float>(s);
  }
}

struct QuantRows {
  at::Tensor q, scale, sum;  // [T, K] int16, [T, K/32] f32, [T, K/32] f32 (scale * sum(q))
};

QuantRows quantize_rows(const at::Tensor& x) {
  const int64_t rows = x.size(0), k = x.size(1);
  QuantRows r{at::empty({rows, k}, x.options().dtype(at::kShort)),
              at::empty({rows, k / QK}, x.options()), at::empty({rows, k / QK}, x.options())};
  const float* xp = x.data_ptr<float>();
  int16_t* qp = r.q.data_ptr<int16_t>();
  float *sp = r.scale.data_ptr<float>(), *up = r.sum.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t a, int64_t e) {
    for (int64_t t = a; t < e; ++t) quantize_row(xp + t * k, k, qp + t * k, sp + t * (k / QK), up + t * (k / QK));
  });
  return r;
}

// ---- int4 groups: w = d * q + m per 32-weight block, q in 0..15 packed two per byte ------------
// byte j of a block holds q[j] (low nibble) and q[j + 16] (high nibble).

float q4_dot_scalar(const uint8_t* w, const float* d, const float* m, const int16_t* x, const float* xs,
                    const float* xsum, int64_t nb) {
  float acc = 0.f, accm = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      s += (w[b * 16 + j] & 15) * x[b * QK + j];
      s += (w[b * 16 + j] >> 4) * x[b * QK + 16 + j];
    }
    acc = std::fma(d[b] * xs[b], static_cast<float>(s), acc);
    accm = std::fma(m[b], xsum[b], accm);
  }
  return acc + accm;
}

// A tile of R weight rows x C activation rows; each (row, weight row) pair runs exactly the
// operations a lone pair would (blocks in order, one FMA into its own accumulator per block), so
// the tile shape changes speed, never a result.
template <int R, int C>
SPECULANT_AVX2 void q4_tile_avx2(const uint8_t* w, const float* d, const float* m, const int16_t* x, const float* xs,
                                 const float* xsum, int64_t nb, int64_t k, float* y, int64_t n_out) {
  const __m128i low = _mm_set1_epi8(15);
  __m256 acc[R][C];
  float accm[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps(), accm[r][c] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    __m256i qa[R], qb[R];  // values 0..15 as int16: the block's first and second 16
    for (int r = 0; r < R; ++r) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (r * nb + b) * 16));
      qa[r] = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low));
      qb[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low));
    }
    for (int c = 0; c < C; ++c) {
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c * k + b * QK));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c * k + b * QK + 16));
      for (int r = 0; r < R; ++r) {
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(qa[r], xa), _mm256_madd_epi16(qb[r], xb));  // 8 x int32
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d[r * nb + b] * xs[c * nb + b]), _mm256_cvtepi32_ps(s), acc[r][c]);
        accm[r][c] = std::fma(m[r * nb + b], xsum[c * nb + b], accm[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * n_out + r] = hsum_avx2(acc[r][c]) + accm[r][c];
}

// ---- int8 rows: w = scale[n] * q ------------------------------------------------------------------

float q8_dot_scalar(const int8_t* w, const int16_t* x, const float* xs, int64_t nb) {
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t s = 0;
    for (int j = 0; j < QK; ++j) s += w[b * QK + j] * x[b * QK + j];
    acc = std::fma(xs[b], static_cast<float>(s), acc);
  }
  return acc;
}

template <int R, int C>
SPECULANT_AVX2 void q8_tile_avx2(const int8_t* w, const float* scale, const int16_t* x, const float* xs, int64_t nb,
                                 int64_t k, float* y, int64_t n_out) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wa[R], wb[R];  // the block's weights as int16: first and second 16
    for (int r = 0; r < R; ++r) {
      wa[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * k + b * QK)));
      wb[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * k + b * QK + 16)));
    }
    for (int c = 0; c < C; ++c) {
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c * k + b * QK));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c * k + b * QK + 16));
      for (int r = 0; r < R; ++r) {
        const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(wa[r], xa), _mm256_madd_epi16(wb[r], xb));  // 8 x int32
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(xs[c * nb + b]), _mm256_cvtepi32_ps(s), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * n_out + r] = scale[r] * hsum_avx2(acc[r][c]);
}

// ---- the drivers: threads split the weight's rows; every (t, n) runs the same dot ------------------

template <typename Dot>
void for_each_pair(int64_t rows, int64_t n_out, float* y, Dot dot) {
  at::parallel_for(0, n_out, 8, [&](int64_t a, int64_t e) {
    for (int64_t n = a; n < e; ++n)
      for (int64_t t = 0; t < rows; ++t) y[t * n_out + n] = dot(t, n);
  });
}

// Runs tile(n, t, R, C) over the [rows, n_out] output: groups of R weight rows split among the
// threads (R = 4 for one row, where four pairs in flight hide the FMA latency; 2 otherwise, as
// eight accumulators fill the registers), activation rows C = 4 at a time, the rest one by one.
template <typename Tile>
void for_each_tile(int64_t rows, int64_t n_out, Tile tile) {
  const int64_t group = rows == 1 ? 4 : 2;
  at::parallel_for(0, (n_out + group - 1) / group, 4, [&](int64_t a, int64_t e) {
    for (int64_t g = a; g < e; ++g) {
      const int64_t n = g * group, r = std::min(group, n_out - n);
      int64_t t = 0;
      for (; r == group && t + 4 <= rows && group == 2; t += 4) tile(n, t, 2, 4);
      for (; t < rows; ++t) {
        if (r == group) {
          tile(n, t, group, 1);
        } else {
          for (int64_t i = 0; i < r; ++i) tile(n + i, t, 1, 1);
        }
      }
    }
  });
}

void check_rows(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be [T, K] float32, contiguous");
  TORCH_CHECK(x.size(1) == k && k % QK == 0, "x has ", x.size(1), " columns, the weight ", k, " (a multiple of 32)");
}

}  // namespace

// x [T, K] f32; packed [N, K/2] u8; d, m [N, K/32] f32 -> [T, N] f32
at::Tensor int4_linear(at::Tensor x, at::Tensor packed, at::Tensor d, at::Tensor m, bool avx2) {
  const int64_t n_out = packed.size(0), k = packed.size(1) * 2, nb = k / QK;
  check_rows(x, k);
  const QuantRows xq = quantize_rows(x);
  auto y = at::empty({x.size(0), n_out}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const float *dp = d.data_ptr<float>(), *mp = m.data_ptr<float>();
  const int16_t* q = xq.q.data_ptr<int16_t>();
  const float *xs = xq.scale.data_ptr<float>(), *xsum = xq.sum.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (!avx2) {
    auto dot = [&](int64_t t, int64_t n) {
      return q4_dot_scalar(w + n * nb * 16, dp + n * nb, mp + n * nb, q + t * k, xs + t * nb, xsum + t * nb, nb);
    };
    for_each_pair(x.size(0), n_out, yp, dot);
    return y;
  }
  auto tile = [&](int64_t n, int64_t t, int64_t r, int64_t c) {
    const auto args = std::make_tuple(w + n * nb * 16, dp + n * nb, mp + n * nb, q + t * k, xs + t * nb, xsum + t * nb, nb, k, yp + t * n_out + n, n_out);
    if (r == 4) std::apply(q4_tile_avx2<4, 1>, args);
    else if (r == 2 && c == 4) std::apply(q4_tile_avx2<2, 4>, args);
    else if (r == 2) std::apply(q4_tile_avx2<2, 1>, args);
    else std::apply(q4_tile_avx2<1, 1>, args);
  };
  for_each_tile(x.size(0), n_out, tile);
  return y;
}

// x [T, K] f32; q [N, K] i8; scale [N] f32 -> [T, N] f32
at::Tensor int8_linear(at::Tensor x, at::Tensor wq, at::Tensor scale, bool avx2) {
  const int64_t n_out = wq.size(0), k = wq.size(1), nb = k / QK;
  check_rows(x, k);
  const QuantRows xq = quantize_rows(x);
  auto y = at::empty({x.size(0), n_out}, x.options());
  const int8_t* w = wq.data_ptr<int8_t>();
  const int16_t* q = xq.q.data_ptr<int16_t>();
  const float *sp = scale.data_ptr<float>(), *xs = xq.scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (!avx2) {
    auto dot = [&](int64_t t, int64_t n) { return sp[n] * q8_dot_scalar(w + n * k, q + t * k, xs + t * nb, nb); };
    for_each_pair(x.size(0), n_out, yp, dot);
    return y;
  }
  auto tile = [&](int64_t n, int64_t t, int64_t r, int64_t c) {
    const auto args = std::make_tuple(w + n * k, sp + n, q + t * k, xs + t * nb, nb, k, yp + t * n_out + n, n_out);
    if (r == 4) std::apply(q8_tile_avx2<4, 1>, args);
    else if (r == 2 && c == 4) std::apply(q8_tile_avx2<2, 4>, args);
    else if (r == 2) std::apply(q8_tile_avx2<2, 1>, args);
    else std::apply(q8_tile_avx2<1, 1>, args);
  };
  for_each_tile(x.size(0), n_out, tile);
  return y;
}

}  // namespace speculant
