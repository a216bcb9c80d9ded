// Row-invariant CPU product of int8 weight rows: y[t, n] = sum_k x[t, k] * w[n, k], float32 out.
// (int4 groups: int4.cpp.)
//
// Activations are quantized per 32-value block to int16 (scale max|x| / 32767). Each (t, n) runs
// one fixed sequence whatever the number of rows T, the threads or the tiling: per block b, the
// exact integer dot S_b (|S_b| < 2^24, so its float is exact), then acc = fma(xs_b, S_b, acc),
// blocks in order, times the row's scale. A row of a T-row product is therefore bit for bit that
// row alone, and the scalar, AVX2 and AVX-512 (the AVX2 tile with 32 registers, 8 rows) paths agree
// exactly.
//
// Weights are repacked in groups of 8 output rows so that a vector's 8 lanes are 8 outputs
// (`layers/packing.py`): [N/8, nb, 16 steps, 16 bytes], byte 2r + e of step s = q[r][2s + e], so
// one madd against the broadcast activation pair (2s, 2s + 1) adds both products into lane r.
// Scales [N/8 * 8]; N is padded to 8 by the packer; only n_out outputs are written.
#include <cmath>
#include <vector>

#include "products.h"

namespace speculant {

namespace {

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

// The tile's body, inlined into each instruction set's instantiation below.
template <int C>
SPECULANT_AVX2 __attribute__((always_inline)) inline void q8_tile(const int8_t* w, const float* scale, const Rows& a, int64_t t,
                                                                float* y, int64_t n_out, int64_t valid) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    if constexpr (C > 1) prefetch_ahead(w + (b + 8) * 256, 4);  // one row streams fastest on the hardware prefetch alone
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

template <int C>
SPECULANT_AVX2 void q8_tile_avx2(const int8_t* w, const float* scale, const Rows& a, int64_t t, float* y, int64_t n_out,
                                 int64_t valid) {
  q8_tile<C>(w, scale, a, t, y, n_out, valid);
}

// As int4.cpp's: the same tile with AVX-512's 32 registers, 8 rows a tile.
template <int C>
SPECULANT_AVX512 void q8_tile_avx512(const int8_t* w, const float* scale, const Rows& a, int64_t t, float* y, int64_t n_out,
                                     int64_t valid) {
  q8_tile<C>(w, scale, a, t, y, n_out, valid);
}

}  // namespace

// x [T, K] f32; packed [N/8, K/32 * 256] i8; scale [N/8 * 8] f32 -> [T, n_out] f32.
// simd: 0 the scalar path, 1 AVX2 (tiles of 4 rows), 2 AVX-512 (tiles of 8): the same bits on each.
at::Tensor int8_linear(at::Tensor x, at::Tensor packed, at::Tensor scale, int64_t n_out, int64_t simd) {
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
    const float* sg = sp + g * G;
    float* yg = yp + t * n_out + g * G;
    if (simd <= 0) {
      for (int64_t i = 0; i < c; ++i)
        for (int r = 0; r < valid; ++r) yg[i * n_out + r] = sg[r] * q8_dot_scalar(wg, r, a, t + i);
      return;
    }
    run_tile(simd, c, [&](auto wide, auto rows) {
      if constexpr (wide) q8_tile_avx512<rows>(wg, sg, a, t, yg, n_out, valid);
      else q8_tile_avx2<rows>(wg, sg, a, t, yg, n_out, valid);
    });
  }, tile_rows(simd));
  return y;
}

}  // namespace speculant
