// Row-invariant CPU products of quantized weights: y[t, n] = sum_k x[t, k] * w[n, k], float32 out.
//
// Activations are quantized per 32-value block to int16 (scale max|x| / 32767; int8 blocks, ggml's
// Q8_0 scheme, lost simple answers on small models whose hidden states carry outlier channels).
// Each (t, n) runs one fixed sequence whatever the number of rows T, the threads or the tiling:
// per block b, the exact integer dot S_b (|S_b| < 2^24, so its float is exact), then
// acc = fma(d_b * xs_b, S_b, acc) (and for int4, acc = fma(m_b, xsum_b, acc)), blocks in order. A
// row of a T-row product is therefore bit for bit that row alone, and the AVX2 and scalar paths
// agree exactly.
//
// Weights are repacked in groups of 8 output rows so that a vector's 8 lanes are 8 outputs: in
// block b, step s holds for each row r the value pair (k, k + 1) = (2s, 2s + 1) as int16 lanes
// (2r, 2r + 1), so one madd against the broadcast activation pair adds both products into lane r.
// int4: [N/8, nb, 8 steps, 16 bytes], byte 2r + e = q[r][2s + e] | q[r][16 + 2s + e] << 4.
// int8: [N/8, nb, 16 steps, 16 bytes], byte 2r + e = q[r][2s + e].
// Scales: int4 d, m [N/8, nb, 8]; int8 scale [N/8 * 8]. N is padded to 8 by the packer; only
// n_out outputs are written.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"

namespace speculant {

namespace {

constexpr int64_t QK = 32;  // activations per quantization block (= the int4 group size)
constexpr int64_t G = 8;    // output rows per weight group (the vector's lanes)

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

struct Rows {  // the quantized activations, in the calling thread's scratch buffers
  const int16_t* x;    // [T, K]
  const float* xs;     // [T, K/32] block scales
  const float* xsum;   // [T, K/32] scale * sum(q) of each block
  int64_t k, nb;
};

Rows quantize_rows(const at::Tensor& x) {
  thread_local std::vector<int16_t> q;  // reused call after call: no allocation per product
  thread_local std::vector<float> scale, sum;
  const int64_t rows = x.size(0), k = x.size(1), nb = k / QK;
  q.resize(rows * k), scale.resize(rows * nb), sum.resize(rows * nb);
  const float* xp = x.data_ptr<float>();
  int16_t* qp = q.data();
  float *sp = scale.data(), *up = sum.data();
  at::parallel_for(0, rows, 16, [&](int64_t a, int64_t e) {
    for (int64_t t = a; t < e; ++t) quantize_row(xp + t * k, k, qp + t * k, sp + t * nb, up + t * nb);
  });
  return Rows{qp, sp, up, k, nb};
}

// ---- scalar path: one (t, n) pair ---------------------------------------------------------------

float q4_dot_scalar(const uint8_t* w, const float* d, const float* m, int r, const Rows& a, int64_t t) {
  const int16_t* x = a.x + t * a.k;
  float acc = 0.f;
  for (int64_t b = 0; b < a.nb; ++b) {
    int32_t s = 0;
    for (int st = 0; st < 8; ++st)
      for (int e = 0; e < 2; ++e) {
        const uint8_t v = w[b * 128 + st * 16 + 2 * r + e];
        s += (v & 15) * x[b * QK + 2 * st + e] + (v >> 4) * x[b * QK + 16 + 2 * st + e];
      }
    acc = std::fma(d[b * G + r] * a.xs[t * a.nb + b], static_cast<float>(s), acc);
    acc = std::fma(m[b * G + r], a.xsum[t * a.nb + b], acc);
  }
  return acc;
}

float q8_dot_scalar(const int8_t* w, int r, const Rows& a, int64_t t) {
  const int16_t* x = a.x + t * a.k;
  float acc = 0.f;
  for (int64_t b = 0; b < a.nb; ++b) {
    int32_t s = 0;
    for (int st = 0; st < 16; ++st)
      for (int e = 0; e < 2; ++e) s += w[b * 256 + st * 16 + 2 * r + e] * x[b * QK + 2 * st + e];
    acc = std::fma(a.xs[t * a.nb + b], static_cast<float>(s), acc);
  }
  return acc;
}

// ---- AVX2 tiles: one group of 8 weight rows x C activation rows ----------------------------------

SPECULANT_AVX2 inline __m256i pair_at(const int16_t* x) {  // x[0], x[1] in every 32-bit lane
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

SPECULANT_AVX2 inline void store_group(float* y, __m256 v, int64_t valid) {
  if (valid == G) return _mm256_storeu_ps(y, v);
  alignas(32) float tmp[G];
  _mm256_store_ps(tmp, v);
  std::memcpy(y, tmp, valid * sizeof(float));
}

template <int C>
SPECULANT_AVX2 void q4_tile_avx2(const uint8_t* w, const float* d, const float* m, const Rows& a, int64_t t, float* y,
                                 int64_t n_out, int64_t valid) {
  const __m128i low = _mm_set1_epi8(15);
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    __m256i s[C];
    for (int c = 0; c < C; ++c) s[c] = _mm256_setzero_si256();
    for (int st = 0; st < 8; ++st) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + b * 128 + st * 16));
      const __m256i lo = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low));
      const __m256i hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low));
      for (int c = 0; c < C; ++c) {
        const int16_t* x = a.x + (t + c) * a.k + b * QK + 2 * st;
        s[c] = _mm256_add_epi32(s[c], _mm256_add_epi32(_mm256_madd_epi16(lo, pair_at(x)), _mm256_madd_epi16(hi, pair_at(x + 16))));
      }
    }
    const __m256 dv = _mm256_loadu_ps(d + b * G), mv = _mm256_loadu_ps(m + b * G);
    for (int c = 0; c < C; ++c) {
      const int64_t i = (t + c) * a.nb + b;
      acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(a.xs[i])), _mm256_cvtepi32_ps(s[c]), acc[c]);
      acc[c] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a.xsum[i]), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) store_group(y + c * n_out, acc[c], valid);
}

template <int C>
SPECULANT_AVX2 void q8_tile_avx2(const int8_t* w, const float* scale, const Rows& a, int64_t t, float* y, int64_t n_out,
                                 int64_t valid) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    __m256i s[C];
    for (int c = 0; c < C; ++c) s[c] = _mm256_setzero_si256();
    for (int st = 0; st < 16; ++st) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + b * 256 + st * 16)));
      for (int c = 0; c < C; ++c)
        s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(wv, pair_at(a.x + (t + c) * a.k + b * QK + 2 * st)));
    }
    for (int c = 0; c < C; ++c)
      acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(a.xs[(t + c) * a.nb + b]), _mm256_cvtepi32_ps(s[c]), acc[c]);
  }
  const __m256 sv = _mm256_loadu_ps(scale);
  for (int c = 0; c < C; ++c) store_group(y + c * n_out, _mm256_mul_ps(sv, acc[c]), valid);
}

// ---- the driver: threads split the weight's groups; rows go 4 at a time, then the rest --------------

template <typename Tile>
void for_each_group(int64_t rows, int64_t n_out, Tile tile) {
  at::parallel_for(0, (n_out + G - 1) / G, 2, [&](int64_t a, int64_t e) {
    for (int64_t g = a; g < e; ++g) {
      const int64_t valid = std::min(G, n_out - g * G);
      int64_t t = 0;
      for (; t + 4 <= rows; t += 4) tile(g, t, 4, valid);
      if (t < rows) tile(g, t, rows - t, valid);
    }
  });
}

void check_rows(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be [T, K] float32, contiguous");
  TORCH_CHECK(x.size(1) == k && k % QK == 0, "x has ", x.size(1), " columns, the weight ", k, " (a multiple of 32)");
}

}  // namespace

// x [T, K] f32; packed [N/8, K/32 * 128] u8; d, m [N/8, K/32 * 8] f32 -> [T, n_out] f32
at::Tensor int4_linear(at::Tensor x, at::Tensor packed, at::Tensor d, at::Tensor m, int64_t n_out, bool avx2) {
  const int64_t k = packed.size(1) / 128 * QK, nb = k / QK;
  TORCH_CHECK(packed.size(0) * G >= n_out, "int4 weight has fewer than ", n_out, " rows");
  check_rows(x, k);
  const Rows a = quantize_rows(x);
  auto y = at::empty({x.size(0), n_out}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const float *dp = d.data_ptr<float>(), *mp = m.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for_each_group(x.size(0), n_out, [&](int64_t g, int64_t t, int64_t c, int64_t valid) {
    const uint8_t* wg = w + g * nb * 128;
    const float *dg = dp + g * nb * G, *mg = mp + g * nb * G;
    float* yg = yp + t * n_out + g * G;
    if (!avx2) {
      for (int64_t i = 0; i < c; ++i)
        for (int r = 0; r < valid; ++r) yg[i * n_out + r] = q4_dot_scalar(wg, dg, mg, r, a, t + i);
    } else if (c == 4) q4_tile_avx2<4>(wg, dg, mg, a, t, yg, n_out, valid);
    else if (c == 3) q4_tile_avx2<3>(wg, dg, mg, a, t, yg, n_out, valid);
    else if (c == 2) q4_tile_avx2<2>(wg, dg, mg, a, t, yg, n_out, valid);
    else q4_tile_avx2<1>(wg, dg, mg, a, t, yg, n_out, valid);
  });
  return y;
}

// x [T, K] f32; packed [N/8, K/32 * 256] i8; scale [N/8 * 8] f32 -> [T, n_out] f32
at::Tensor int8_linear(at::Tensor x, at::Tensor packed, at::Tensor scale, int64_t n_out, bool avx2) {
  const int64_t k = packed.size(1) / 256 * QK, nb = k / QK;
  TORCH_CHECK(packed.size(0) * G >= n_out && scale.numel() == packed.size(0) * G, "int8 weight and scales disagree");
  check_rows(x, k);
  const Rows a = quantize_rows(x);
  auto y = at::empty({x.size(0), n_out}, x.options());
  const int8_t* w = packed.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for_each_group(x.size(0), n_out, [&](int64_t g, int64_t t, int64_t c, int64_t valid) {
    const int8_t* wg = w + g * nb * 256;
    float* yg = yp + t * n_out + g * G;
    if (!avx2) {
      for (int64_t i = 0; i < c; ++i)
        for (int r = 0; r < valid; ++r) yg[i * n_out + r] = sp[g * G + r] * q8_dot_scalar(wg, r, a, t + i);
    } else if (c == 4) q8_tile_avx2<4>(wg, sp + g * G, a, t, yg, n_out, valid);
    else if (c == 3) q8_tile_avx2<3>(wg, sp + g * G, a, t, yg, n_out, valid);
    else if (c == 2) q8_tile_avx2<2>(wg, sp + g * G, a, t, yg, n_out, valid);
    else q8_tile_avx2<1>(wg, sp + g * G, a, t, yg, n_out, valid);
  });
  return y;
}

}  // namespace speculant
