// Row-invariant product of int4 weight groups with 8-bit activation blocks:
// y[t, n] = sum_k x[t, k] * w[n, k], float32 out, w = d q + m per 32-value group (q in 0..15).
//
// Weights come in groups of 8 output rows (`layers/packing.py`): per 32-value block, 4 vectors of
// 32 bytes, vector j holding for each row r the bytes 4r + i = q[r][4j + i] | q[r][16 + 4j + i] << 4
// (i < 4), so a vector's low nibbles are 4 consecutive values of each of the 8 rows and its high
// nibbles the 4 values 16 further on. Scales d, m [N/8, nb, 8] f32.
//
// Each 32-value block of a row is quantized to int8 with d1 = max|x| / 127 (ggml's Q8 scheme). A
// block whose largest value stands far above the rest (max|x|^2 > 16 mean(x^2): an outlier
// channel, which would leave the others a few levels) also gets a second int8 level for what the
// first rounded off (d2 = d1 / 254), keeping about int16's precision where it matters. Per block,
// the exact integer dots S1 (and S2), then acc = fma(d d1, S1, acc) (, fma(d d2, S2, acc)),
// acc = fma(m, xsum, acc), blocks in order. Which blocks take the second level depends on the row
// alone, so a row of a T-row product is bit for bit that row alone, and the scalar, AVX2 and
// AVX-512 paths agree exactly (the AVX-512 build runs the AVX2 tile with twice the registers).
// AVX2: `vpmaddubsw` of the nibbles (0..15) against 4 broadcast activations adds two products per
// 16-bit lane; 8 of them stay below 2^15 (8 x 2 x 15 x 127 = 30480); one `vpmaddwd`
// against ones then gives each row's int32 sum.
#include <cmath>
#include <vector>

#include "products.h"

namespace speculant {

namespace {

constexpr float kWide = 4.f;  // a block takes the second level when max|x| > kWide * rms(x)
constexpr int64_t kAhead = 12;  // blocks the tiles prefetch ahead (into the next group past a group's end)

struct Acts {  // one product's quantized activations, in the calling thread's scratch buffers
  int8_t* q;       // [T, nb, 2, 32] the two levels (level 2 unset where the block is not wide)
  float* scale;    // [T, nb, 2] d1, d2
  float* xsum;     // [T, nb] d1 sum(q1) (+ d2 sum(q2))
  uint8_t* wide;   // [T, nb] whether the block has the second level
  int64_t nb;
};

void quantize_block(const float* x, int8_t* q, float* scale, float* xsum, uint8_t* wide) {
  float amax = 0.f, squares = 0.f;
  for (int i = 0; i < QK; ++i) {
    amax = std::fmax(amax, std::fabs(x[i]));
    squares = std::fma(x[i], x[i], squares);
  }
  const float d1 = amax / 127.f, id1 = d1 > 0.f ? 1.f / d1 : 0.f;
  int32_t s1 = 0;
  for (int i = 0; i < QK; ++i) {
    q[i] = static_cast<int8_t>(std::clamp(static_cast<int>(std::nearbyint(x[i] * id1)), -127, 127));
    s1 += q[i];
  }
  *wide = amax * amax > kWide * kWide * squares / QK;
  scale[0] = d1, scale[1] = 0.f;
  *xsum = d1 * static_cast<float>(s1);
  if (!*wide) return;
  const float d2 = d1 / 254.f, id2 = d2 > 0.f ? 1.f / d2 : 0.f;
  int32_t s2 = 0;
  for (int i = 0; i < QK; ++i) {
    const float rest = std::fma(-static_cast<float>(q[i]), d1, x[i]);
    q[QK + i] = static_cast<int8_t>(std::clamp(static_cast<int>(std::nearbyint(rest * id2)), -127, 127));
    s2 += q[QK + i];
  }
  scale[1] = d2;
  *xsum = std::fma(d2, static_cast<float>(s2), *xsum);
}

Acts quantize_acts(const at::Tensor& x) {
  thread_local std::vector<int8_t> q;  // reused call after call: no allocation per product
  thread_local std::vector<uint8_t> wide;
  thread_local std::vector<float> scale, sum;
  const int64_t blocks = x.numel() / QK;
  q.resize(blocks * 2 * QK), scale.resize(blocks * 2), sum.resize(blocks), wide.resize(blocks);
  const Acts a{q.data(), scale.data(), sum.data(), wide.data(), x.size(1) / QK};  // this thread's buffers
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, blocks, 64, [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) quantize_block(xp + i * QK, a.q + i * 2 * QK, a.scale + 2 * i, a.xsum + i, a.wide + i);
  });
  return a;
}

// ---- scalar path: one (t, n) pair ---------------------------------------------------------------

int32_t level_dot_scalar(const uint8_t* w, int r, const int8_t* q) {  // w: one block of the group
  int32_t s = 0;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 4; ++i) {
      const uint8_t v = w[32 * j + 4 * r + i];
      s += (v & 15) * q[4 * j + i] + (v >> 4) * q[16 + 4 * j + i];
    }
  return s;
}

float q4_dot_scalar(const uint8_t* w, const float* d, const float* m, int r, const Acts& a, int64_t t) {
  float acc = 0.f;
  for (int64_t b = 0; b < a.nb; ++b) {
    const int64_t i = t * a.nb + b;
    const int8_t* q = a.q + i * 2 * QK;
    acc = std::fma(d[b * G + r] * a.scale[2 * i], static_cast<float>(level_dot_scalar(w + b * 128, r, q)), acc);
    if (a.wide[i])
      acc = std::fma(d[b * G + r] * a.scale[2 * i + 1], static_cast<float>(level_dot_scalar(w + b * 128, r, q + QK)), acc);
    acc = std::fma(m[b * G + r], a.xsum[i], acc);
  }
  return acc;
}

// ---- AVX2 tiles: one group of 8 weight rows x C activation rows ----------------------------------

SPECULANT_AVX2 inline __m256i quad_at(const int8_t* q) {  // q[0..3] in every 32-bit lane
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

// The 8 rows' exact dots with one level's 32 values: 8 `vpmaddubsw` summed in 16-bit lanes (row r
// in lanes 2r, 2r + 1), then one `vpmaddwd` against ones.
SPECULANT_AVX2 inline __m256i level_dot_avx2(const __m256i* lo, const __m256i* hi, const int8_t* q) {
  __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo[0], quad_at(q)), _mm256_maddubs_epi16(hi[0], quad_at(q + 16)));
  for (int j = 1; j < 4; ++j)
    s = _mm256_add_epi16(s, _mm256_add_epi16(_mm256_maddubs_epi16(lo[j], quad_at(q + 4 * j)),
                                             _mm256_maddubs_epi16(hi[j], quad_at(q + 16 + 4 * j))));
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

// The tile's body, inlined into each instruction set's instantiation below.
template <int C>
SPECULANT_AVX2 __attribute__((always_inline)) inline void q4_tile(const uint8_t* w, const float* d, const float* m, const Acts& a, int64_t t, float* y,
                                 int64_t n_out, int64_t valid) {
  const __m256i low = _mm256_set1_epi8(15);
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    prefetch_ahead(w + (b + kAhead) * 128, 2);
    if ((b & 1) == 0) prefetch_ahead(d + (b + kAhead) * G, 1), prefetch_ahead(m + (b + kAhead) * G, 1);
    __m256i lo[4], hi[4];
    for (int j = 0; j < 4; ++j) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * 128 + 32 * j));
      lo[j] = _mm256_and_si256(packed, low);
      hi[j] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    }
    const __m256 dv = _mm256_loadu_ps(d + b * G), mv = _mm256_loadu_ps(m + b * G);
    for (int c = 0; c < C; ++c) {
      const int64_t i = (t + c) * a.nb + b;
      const int8_t* q = a.q + i * 2 * QK;
      const __m256 s1 = _mm256_cvtepi32_ps(level_dot_avx2(lo, hi, q));
      acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(a.scale[2 * i])), s1, acc[c]);
      if (a.wide[i]) {
        const __m256 s2 = _mm256_cvtepi32_ps(level_dot_avx2(lo, hi, q + QK));
        acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(a.scale[2 * i + 1])), s2, acc[c]);
      }
      acc[c] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a.xsum[i]), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) store_group(y + c * n_out, acc[c], valid);
}

template <int C>
SPECULANT_AVX2 void q4_tile_avx2(const uint8_t* w, const float* d, const float* m, const Acts& a, int64_t t, float* y,
                                 int64_t n_out, int64_t valid) {
  q4_tile<C>(w, d, m, a, t, y, n_out, valid);
}

// The same body compiled for AVX-512 (VL): the same 256-bit instructions, but 32 vector registers
// instead of 16, so tiles of up to 8 activation rows keep every accumulator and the 8 unpacked
// weight vectors in registers (8 rows here cost ~15-20% less than 4 + 4 on the AVX2 build).
template <int C>
SPECULANT_AVX512 void q4_tile_avx512(const uint8_t* w, const float* d, const float* m, const Acts& a, int64_t t, float* y,
                                     int64_t n_out, int64_t valid) {
  q4_tile<C>(w, d, m, a, t, y, n_out, valid);
}

}  // namespace

// x [T, K] f32; packed [N/8, K/32 * 128] u8; d, m [N/8, K/32 * 8] f32 -> [T, n_out] f32.
// simd: 0 the scalar path, 1 AVX2 (tiles of 4 rows), 2 AVX-512 (tiles of 8): the same bits on each.
at::Tensor int4_linear(at::Tensor x, at::Tensor packed, at::Tensor d, at::Tensor m, int64_t n_out, int64_t simd) {
  const int64_t k = packed.size(1) / 128 * QK, nb = k / QK;
  TORCH_CHECK(packed.size(0) * G >= n_out, "int4 weight has fewer than ", n_out, " rows");
  check_rows(x, k);
  const Acts a = quantize_acts(x);
  auto y = at::empty({x.size(0), n_out}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const float *dp = d.data_ptr<float>(), *mp = m.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for_each_group(x.size(0), n_out, [&](int64_t g, int64_t t, int64_t c, int64_t valid) {
    const uint8_t* wg = w + g * nb * 128;
    const float *dg = dp + g * nb * G, *mg = mp + g * nb * G;
    float* yg = yp + t * n_out + g * G;
    if (simd <= 0) {
      for (int64_t i = 0; i < c; ++i)
        for (int r = 0; r < valid; ++r) yg[i * n_out + r] = q4_dot_scalar(wg, dg, mg, r, a, t + i);
      return;
    }
    run_tile(simd, c, [&](auto wide, auto rows) {
      if constexpr (wide) q4_tile_avx512<rows>(wg, dg, mg, a, t, yg, n_out, valid);
      else q4_tile_avx2<rows>(wg, dg, mg, a, t, yg, n_out, valid);
    });
  }, tile_rows(simd));
  return y;
}

}  // namespace speculant
