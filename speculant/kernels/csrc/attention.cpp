// Row-invariant attention over a paged K/V cache: each (query token, head) reads its visible
// keys straight from their cache slots in slot-list order, scores them, takes one softmax
// (max, exp, sums in a fixed order over key ranks) and sums the values in key order. Nothing depends on how many
// other queries, sequences or padded keys share the call, so a verification row attends
// exactly as a one-token decode step over the same keys.
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_parts.h"

namespace speculant {

namespace {

// The portable path, each (query token, head) alone: its visible keys listed in slot-list order
// (a tree's mask drops the others before any arithmetic, so a key's rank is the same in a tree as
// on the accepted chain), scored, softmaxed and summed over values (attention_parts.h).
template <typename C>
void attend_scalar(const float* q, int64_t q_stride, const C* kc, const C* vc, const int64_t* slots, const int64_t* tok_seq,
                   const int64_t* tok_keys, const bool* mask, float* out, int64_t tokens, int64_t heads,
                   int64_t kv_heads, int64_t d, int64_t dv, int64_t max_keys, float scale) {
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, tokens * heads, 1, [&](int64_t a, int64_t e) {
    std::vector<float> p(max_keys + 8);
    std::vector<const C*> keys(max_keys), values(max_keys);
    for (int64_t th = a; th < e; ++th) {
      const int64_t t = th / heads, h = th % heads, kh = h / group;
      const int64_t* row = slots + tok_seq[t] * max_keys;
      const bool* visible = mask ? mask + t * max_keys : nullptr;
      int64_t m = 0;
      for (int64_t j = 0; j < tok_keys[t]; ++j) {
        if (visible && !visible[j]) continue;
        keys[m] = kc + (row[j] * kv_heads + kh) * d;
        values[m++] = vc + (row[j] * kv_heads + kh) * dv;
      }
      float* o = out + th * dv;
      scores_scalar(q + t * q_stride + h * d, keys.data(), m, d, scale, p.data());
      const float inv = 1.f / softmax_numerators_scalar(p.data(), m);
      weighted_sum_scalar(p.data(), values.data(), m, o, dv);
      for (int64_t i = 0; i < dv; ++i) o[i] *= inv;
    }
  });
}

// The AVX2 path: a run of up to kRunRows query tokens of one sequence and one KV head's group of
// query heads together, so that each key and value row is read from memory once for all of those
// (query, head) pairs, not once per pair. Per pair the arithmetic is the portable path's: each key
// scored alone (keys the pair does not see are scored too, then dropped), the softmax over its
// visible keys in rank order, and each value column summed key by key in slot order, where a key
// the pair does not see adds fma(0, v, acc) = acc.
constexpr int64_t kRunRows = 16;   // query tokens of a sequence per task
constexpr int64_t kKeyChunk = 32;  // keys scored by all of a task's pairs while they sit in L1
constexpr int kPairs = 12;         // pairs whose value sums run at once (one register each)

template <typename C, int NP>
SPECULANT_AVX2 void value_sums_avx2(const float* const* p, const C* const* values, int64_t n, float* const* out, int64_t dv) {
  int64_t c = 0;
  for (; c + 8 <= dv; c += 8) {
    __m256 acc[NP];
    for (int i = 0; i < NP; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const __m256 v = load8(values[j] + c);
      for (int i = 0; i < NP; ++i) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(p[i][j]), v, acc[i]);
    }
    for (int i = 0; i < NP; ++i) _mm256_storeu_ps(out[i] + c, acc[i]);
  }
  for (; c < dv; ++c)
    for (int i = 0; i < NP; ++i) {
      float acc = 0.f;
      for (int64_t j = 0; j < n; ++j) acc = std::fma(p[i][j], widen(values[j][c]), acc);
      out[i][c] = acc;
    }
}

template <typename C, int NP = kPairs>
void value_sums(int np, const float* const* p, const C* const* values, int64_t n, float* const* out, int64_t dv) {
  if constexpr (NP > 1) {
    if (np < NP) return value_sums<C, NP - 1>(np, p, values, n, out, dv);
  }
  value_sums_avx2<C, NP>(p, values, n, out, dv);
}

template <typename C>
void attend_avx2(const float* q, int64_t q_stride, const C* kc, const C* vc, const int64_t* slots, const int64_t* tok_seq,
                 const int64_t* tok_keys, const bool* mask, float* out, int64_t tokens, int64_t heads, int64_t kv_heads,
                 int64_t d, int64_t dv, int64_t max_keys, float scale) {
  const int64_t group = heads / kv_heads;
  std::vector<int64_t> starts;  // runs of consecutive tokens of one sequence, at most kRunRows each
  for (int64_t t = 0; t < tokens; ++t)
    if (t == 0 || tok_seq[t] != tok_seq[t - 1] || t - starts.back() == kRunRows) starts.push_back(t);
  starts.push_back(tokens);
  const int64_t runs = static_cast<int64_t>(starts.size()) - 1;
  at::parallel_for(0, runs * kv_heads, 1, [&](int64_t a, int64_t e) {
    std::vector<float> score, prob, total;
    std::vector<const C*> keys, values;
    for (int64_t task = a; task < e; ++task) {
      const int64_t t0 = starts[task / kv_heads], t1 = starts[task / kv_heads + 1], kh = task % kv_heads;
      const int64_t* row = slots + tok_seq[t0] * max_keys;
      const int64_t n = *std::max_element(tok_keys + t0, tok_keys + t1), pairs = (t1 - t0) * group, stride = n + 8;
      keys.resize(n), values.resize(n), total.resize(pairs);
      for (int64_t j = 0; j < n; ++j) {
        keys[j] = kc + (row[j] * kv_heads + kh) * d;
        values[j] = vc + (row[j] * kv_heads + kh) * dv;
      }
      score.assign(pairs * stride, 0.f), prob.assign(pairs * stride, 0.f);
      const auto query = [&](int64_t pair) { return t0 + pair / group; };  // pair = (token, head in the group)
      const auto head = [&](int64_t pair) { return kh * group + pair % group; };
      for (int64_t j0 = 0; j0 < n; j0 += kKeyChunk)
        for (int64_t pair = 0; pair < pairs; ++pair) {
          const int64_t t = query(pair), count = std::min(kKeyChunk, tok_keys[t] - j0);
          if (count > 0) scores_avx2(q + t * q_stride + head(pair) * d, keys.data() + j0, count, d, scale, score.data() + pair * stride + j0);
        }
      for (int64_t pair = 0; pair < pairs; ++pair) {  // softmax over the visible keys, put back at their slots
        const int64_t t = query(pair);
        const bool* visible = mask ? mask + t * max_keys : nullptr;
        float *s = score.data() + pair * stride, *p = prob.data() + pair * stride;
        int64_t m = 0;
        for (int64_t j = 0; j < tok_keys[t]; ++j)
          if (!visible || visible[j]) s[m++] = s[j];
        total[pair] = softmax_numerators_avx2(s, m);
        for (int64_t j = 0, r = 0; j < tok_keys[t]; ++j)
          if (!visible || visible[j]) p[j] = s[r++];
      }
      for (int64_t p0 = 0; p0 < pairs; p0 += kPairs) {
        const int np = static_cast<int>(std::min<int64_t>(kPairs, pairs - p0));
        const float* p[kPairs];
        float* o[kPairs];
        for (int i = 0; i < np; ++i) {
          p[i] = prob.data() + (p0 + i) * stride;
          o[i] = out + (query(p0 + i) * heads + head(p0 + i)) * dv;
        }
        value_sums<C>(np, p, values.data(), n, o, dv);
        for (int i = 0; i < np; ++i) {
          const float inv = 1.f / total[p0 + i];
          for (int64_t c = 0; c < dv; ++c) o[i][c] *= inv;
        }
      }
    }
  });
}

template <typename C>
void attend(const float* q, int64_t q_stride, const C* kc, const C* vc, const int64_t* slots, const int64_t* tok_seq,
            const int64_t* tok_keys, const bool* mask, float* out, int64_t tokens, int64_t heads,
            int64_t kv_heads, int64_t d, int64_t dv, int64_t max_keys, float scale, bool avx2) {
  (avx2 ? attend_avx2<C> : attend_scalar<C>)(q, q_stride, kc, vc, slots, tok_seq, tok_keys, mask, out, tokens, heads, kv_heads, d,
                                           dv, max_keys, scale);
}

// Writes each new token's key and value rows into its cache slot: src [T, Hk, D] with rows at any
// stride (a view of the fused QKV product), each row's heads contiguous.
void write_rows(const at::Tensor& src, at::Tensor& cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(src.dim() == 3 && src.scalar_type() == cache.scalar_type() && src.size(1) == cache.size(1) &&
                  src.size(2) == cache.size(2) && src.stride(2) == 1 && src.stride(1) == src.size(2),
              "new keys/values must be [T, Hk, D] in the cache's dtype, each row's heads contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == src.size(0), "slot_mapping must be [T] int64");
  const int64_t row = src.size(1) * src.size(2), bytes = row * src.element_size(), slots = cache.size(0);
  const int64_t* map = slot_mapping.data_ptr<int64_t>();
  const auto* from = static_cast<const char*>(src.data_ptr());
  auto* to = static_cast<char*>(cache.data_ptr());
  for (int64_t t = 0; t < src.size(0); ++t) {
    TORCH_CHECK(map[t] >= 0 && map[t] < slots, "slot ", map[t], " is outside the cache");
    std::memcpy(to + map[t] * bytes, from + t * src.stride(0) * src.element_size(), bytes);
  }
}

}  // namespace

// q [T, H, D] f32 (rows at any stride, each row's heads contiguous); k_cache [S, Hk, D], v_cache
// [S, Hk, Dv] (f32 or bf16); slots [B, L] i64 (each sequence's key slots in position order);
// tok_seq [T] i64; tok_keys [T] i64 (query t reads slots[tok_seq[t], :tok_keys[t]]); mask [T, L]
// bool or undefined (a tree: which of those it sees); new_kv: (k [T, Hk, D], v [T, Hk, Dv],
// slot_mapping [T] i64) written into the caches first, or undefined -> [T, H * Dv] f32
at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots,
                              at::Tensor tok_seq, at::Tensor tok_keys, c10::optional<at::Tensor> mask,
                              c10::optional<at::Tensor> k_new, c10::optional<at::Tensor> v_new,
                              c10::optional<at::Tensor> slot_mapping, double scale, bool avx2) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q must be [T, H, D] float32, each row's heads contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k and v caches must share a dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && tok_seq.scalar_type() == at::kLong && tok_keys.scalar_type() == at::kLong,
              "slots, tok_seq and tok_keys must be int64");
  if (k_new && k_new->defined()) {
    TORCH_CHECK(v_new && v_new->defined() && slot_mapping && slot_mapping->defined(), "new keys need values and slots");
    write_rows(*k_new, k_cache, *slot_mapping);
    write_rows(*v_new, v_cache, *slot_mapping);
  }
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(1), dv = v_cache.size(2), max_keys = slots.size(1);
  TORCH_CHECK(heads % kv_heads == 0 && k_cache.size(2) == d, "head shapes do not match");
  const bool* m = nullptr;
  if (mask && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->size(0) == tokens && mask->size(1) == max_keys, "mask must be [T, L] bool");
    m = mask->data_ptr<bool>();
  }
  auto out = at::empty({tokens, heads * dv}, q.options());
  const int64_t *sp = slots.data_ptr<int64_t>(), *ts = tok_seq.data_ptr<int64_t>(), *tk = tok_keys.data_ptr<int64_t>();
  const float sc = static_cast<float>(scale);
  if (k_cache.scalar_type() == at::kFloat) {
    attend(q.data_ptr<float>(), q.stride(0), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), sp, ts, tk, m, out.data_ptr<float>(),
           tokens, heads, kv_heads, d, dv, max_keys, sc, avx2);
  } else {
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16, "caches must be float32 or bfloat16");
    attend(q.data_ptr<float>(), q.stride(0), reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()),
           reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()), sp, ts, tk, m, out.data_ptr<float>(), tokens,
           heads, kv_heads, d, dv, max_keys, sc, avx2);
  }
  return out;
}

}  // namespace speculant
