// Shared by the quantized products (products.cpp: int8 rows; int4.cpp: int4 groups): the weight
// layout's constants, the driver that splits a weight's 8-row groups over threads, and checks.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "simd.h"

namespace speculant {

constexpr int64_t QK = 32;  // activations per quantization block (= the int4 group size)
constexpr int64_t G = 8;    // output rows per weight group (the vector's lanes)

// Threads split the weight's groups; rows go `width` (a path's `tile_rows`) at a time, then the rest.
template <typename Tile>
void for_each_group(int64_t rows, int64_t n_out, Tile tile, int64_t width) {
  at::parallel_for(0, (n_out + G - 1) / G, 2, [&](int64_t a, int64_t e) {
    for (int64_t g = a; g < e; ++g) {
      const int64_t valid = std::min(G, n_out - g * G);
      int64_t t = 0;
      for (; t + width <= rows; t += width) tile(g, t, width, valid);
      if (t < rows) tile(g, t, rows - t, valid);
    }
  });
}

// The rows a tile takes on a path (simd as the products take it: 1 AVX2, 2 AVX-512).
constexpr int64_t tile_rows(int64_t simd) { return simd >= 2 ? 8 : 4; }

// run(wide, C) for a tile of c rows (1 <= c <= tile_rows(simd)) on a vector path (simd >= 1), both
// compile-time: `wide` whether the AVX-512 build of the tile runs, C the tile's rows.
template <typename Run>
void run_tile(int64_t simd, int64_t c, Run run) {
  using std::integral_constant;
  const integral_constant<bool, false> avx2;
  const integral_constant<bool, true> avx512;
  switch (simd == 1 ? c : 4 + c) {
    case 1: return run(avx2, integral_constant<int, 1>{});
    case 2: return run(avx2, integral_constant<int, 2>{});
    case 3: return run(avx2, integral_constant<int, 3>{});
    case 4: return run(avx2, integral_constant<int, 4>{});
    case 5: return run(avx512, integral_constant<int, 1>{});
    case 6: return run(avx512, integral_constant<int, 2>{});
    case 7: return run(avx512, integral_constant<int, 3>{});
    case 8: return run(avx512, integral_constant<int, 4>{});
    case 9: return run(avx512, integral_constant<int, 5>{});
    case 10: return run(avx512, integral_constant<int, 6>{});
    case 11: return run(avx512, integral_constant<int, 7>{});
    default: return run(avx512, integral_constant<int, 8>{});
  }
}

// Software prefetch of `lines` cache lines from p on: the tiles ask for the weights a few blocks
// ahead, which keeps the memory busy while the vector units work (10-25% off a product whose
// weights stream from DRAM). A hint only: no effect on any result, and no fault past the end.
inline void prefetch_ahead(const void* p, int lines) {
  for (int l = 0; l < lines; ++l) _mm_prefetch(static_cast<const char*>(p) + 64 * l, _MM_HINT_T0);
}

inline void check_rows(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be [T, K] float32, contiguous");
  TORCH_CHECK(x.size(1) == k && k % QK == 0, "x has ", x.size(1), " columns, the weight ", k, " (a multiple of 32)");
}

SPECULANT_AVX2 inline void store_group(float* y, __m256 v, int64_t valid) {
  if (valid == G) return _mm256_storeu_ps(y, v);
  alignas(32) float tmp[G];
  _mm256_store_ps(tmp, v);
  std::memcpy(y, tmp, valid * sizeof(float));
}

}  // namespace speculant
