// Decode-attention test data shared by the attention GPU tests: random caches (contiguous or paged
// with shuffled pages) uploaded with poison around them, the new token's q/k/v, and the
// double-precision reference output with the appended rows as the op defines them.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_util.cuh"
#include "tileweave/ops/attention.hpp"

namespace tw::test {

struct AttnCase {
  std::vector<int> lens;
  int hq = 32, hkv = 8, d = 128;
  KvLayout layout = KvLayout::Contiguous;
  int page_size = 16;
  bool append = true;
  float theta = 10000.f;
};

// Fast uniform bf16 noise (unit variance): the long sequences need ~10^8 values.
inline void fill_uniform(std::vector<__nv_bfloat16>& v, uint64_t seed) {
  uint64_t s = seed | 1;
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float u = float(s >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    x = __float2bfloat16((2.f * u - 1.f) * 1.7320508f);
  }
}

inline float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

// Rotate-half RoPE as the op defines it (fp32 angle, cos/sin in double), rounded to bf16.
inline void rope_ref(const __nv_bfloat16* x, int d, int pos, const std::vector<float>& inv, bool rope, float* y) {
  for (int i = 0; i < d / 2; ++i) {
    double x1 = bf(x[i]), x2 = bf(x[i + d / 2]), y1 = x1, y2 = x2;
    if (rope) {
      const float angle = float(pos) * inv[i];
      const double c = std::cos(double(angle)), s = std::sin(double(angle));
      y1 = x1 * c - x2 * s;
      y2 = x2 * c + x1 * s;
    }
    y[i] = bf(__float2bfloat16(float(y1)));
    y[i + d / 2] = bf(__float2bfloat16(float(y2)));
  }
}

class AttnData {
 public:
  AttnCase c;
  int B, G, D;
  DecodeAttentionShape shape;
  std::vector<int> table;
  // The logical cache, per pair (b, h): len x D values (the new token's row holds stale junk when appending).
  std::vector<std::vector<__nv_bfloat16>> kc, vc;
  HostBf16 q, k_new, v_new;
  std::vector<float> k_app;  // roped k_new rows [B, Hkv, D]: what the op appends
  std::vector<double> ref;   // the output [B, Hq, D]
  std::unique_ptr<DeviceBuffer<__nv_bfloat16>> d_k, d_v, d_q, d_kn, d_vn;

  AttnData(const AttnCase& cs, std::mt19937_64& rng) : c(cs), B(int(cs.lens.size())), G(cs.hq / cs.hkv), D(cs.d) {
    const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
    kc.resize(B * c.hkv);
    vc.resize(B * c.hkv);
    for (int i = 0; i < B * c.hkv; ++i) {
      kc[i].resize(size_t(c.lens[i / c.hkv]) * D);
      vc[i].resize(kc[i].size());
      fill_uniform(kc[i], rng());
      fill_uniform(vc[i], rng());
    }
    shape.batch = B;
    shape.num_q_heads = c.hq;
    shape.num_kv_heads = c.hkv;
    shape.head_dim = D;
    shape.layout = c.layout;
    shape.append = c.append;
    shape.rope_theta = c.theta;
    int64_t cache_elems = 0;
    if (c.layout == KvLayout::Contiguous) {
      shape.max_seq_len = max_len + 3;  // slack the kernel must not read
      cache_elems = int64_t(B) * c.hkv * shape.max_seq_len * D;
    } else {
      int pages = 0;
      for (int len : c.lens) pages += (len + c.page_size - 1) / c.page_size;
      shape.page_size = c.page_size;
      shape.num_pages = pages + 5;
      shape.pages_per_seq = (max_len + c.page_size - 1) / c.page_size + 1;
      std::vector<int> perm(shape.num_pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      table.assign(size_t(B) * shape.pages_per_seq, 0);
      int next = 0;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < (c.lens[b] + c.page_size - 1) / c.page_size; ++i)
          table[size_t(b) * shape.pages_per_seq + i] = perm[next++];
      cache_elems = int64_t(shape.num_pages) * c.hkv * c.page_size * D;
    }
    d_k = std::make_unique<DeviceBuffer<__nv_bfloat16>>(cache_elems);
    d_v = std::make_unique<DeviceBuffer<__nv_bfloat16>>(cache_elems);
    d_q = std::make_unique<DeviceBuffer<__nv_bfloat16>>(size_t(B) * c.hq * D);
    d_kn = std::make_unique<DeviceBuffer<__nv_bfloat16>>(size_t(B) * c.hkv * D);
    d_vn = std::make_unique<DeviceBuffer<__nv_bfloat16>>(size_t(B) * c.hkv * D);
    d_k->poison();  // every row the kernel may read without writing is uploaded below
    d_v->poison();
    // Upload runs of rows that are contiguous on the device (a page, or a whole contiguous sequence).
    const int run_len = c.layout == KvLayout::Contiguous ? max_len : c.page_size;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < c.hkv; ++h)
        for (int t = 0; t < c.lens[b]; t += run_len) {
          const int n = std::min(run_len - t % run_len, c.lens[b] - t);
          const size_t src = size_t(t) * D, bytes = size_t(n) * D * sizeof(__nv_bfloat16);
          TW_CUDA_CHECK(cudaMemcpy(d_k->ptr + row(b, h, t), kc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
          TW_CUDA_CHECK(cudaMemcpy(d_v->ptr + row(b, h, t), vc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
        }
    new_token(rng);
  }
  AttnData(const AttnData&) = delete;

  // Device element offset of token t of (b, h).
  int64_t row(int b, int h, int t) const {
    if (c.layout == KvLayout::Contiguous) return ((int64_t(b) * c.hkv + h) * shape.max_seq_len + t) * D;
    const int page = table[size_t(b) * shape.pages_per_seq + t / c.page_size];
    return ((int64_t(page) * c.hkv + h) * c.page_size + t % c.page_size) * D;
  }

  DecodeAttentionTensors tensors(__nv_bfloat16* out) const {
    return {d_q->ptr, d_kn->ptr, d_vn->ptr, d_k->ptr, d_v->ptr, out};
  }

  // Fresh q, k_new and v_new (uploaded) and the reference for them.
  void new_token(std::mt19937_64& rng) {
    q = random_bf16(size_t(B) * c.hq * D, rng);
    k_new = random_bf16(size_t(B) * c.hkv * D, rng);
    v_new = random_bf16(size_t(B) * c.hkv * D, rng);
    d_q->upload(q.bits);
    d_kn->upload(k_new.bits);
    d_vn->upload(v_new.bits);
    compute_reference();
  }

  // The new token's cache rows get their stale contents back, so the op must overwrite them (and
  // use the new row, not the stale one).
  void restore_stale_rows() {
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < c.hkv; ++h) {
        const size_t src = size_t(c.lens[b] - 1) * D, bytes = D * sizeof(__nv_bfloat16);
        const int64_t r = row(b, h, c.lens[b] - 1);
        TW_CUDA_CHECK(cudaMemcpy(d_k->ptr + r, kc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
        TW_CUDA_CHECK(cudaMemcpy(d_v->ptr + r, vc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
      }
  }

 private:
  void compute_reference() {
    const auto inv = rope_inv_freq(D, c.theta > 0 ? c.theta : 1.f);
    const bool rope = c.theta > 0;
    ref.assign(size_t(B) * c.hq * D, 0.0);
    k_app.assign(size_t(B) * c.hkv * D, 0.f);
    const double scale = 1.0 / std::sqrt(double(D));
    for (int b = 0; b < B; ++b) {
      const int len = c.lens[b], pos = len - 1;
      for (int h = 0; h < c.hkv; ++h) {
        const size_t nh = size_t(b) * c.hkv + h;
        rope_ref(&k_new.bits[nh * D], D, pos, inv, rope, &k_app[nh * D]);
        auto key = [&](int tok, int i) {
          return (c.append && tok == pos) ? double(k_app[nh * D + i]) : double(bf(kc[nh][size_t(tok) * D + i]));
        };
        auto val = [&](int tok, int i) {
          return (c.append && tok == pos) ? double(bf(v_new.bits[nh * D + i])) : double(bf(vc[nh][size_t(tok) * D + i]));
        };
        std::vector<float> qr(D);
        std::vector<double> s(len), acc(D);
        for (int g = 0; g < G; ++g) {
          const size_t hq = size_t(b) * c.hq + h * G + g;
          rope_ref(&q.bits[hq * D], D, pos, inv, rope, qr.data());
          double mx = -INFINITY;
          for (int tok = 0; tok < len; ++tok) {
            double dot = 0;
            for (int i = 0; i < D; ++i) dot += qr[i] * key(tok, i);
            s[tok] = dot * scale;
            mx = std::max(mx, s[tok]);
          }
          double sum = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int tok = 0; tok < len; ++tok) {
            const double pr = std::exp(s[tok] - mx);
            sum += pr;
            for (int i = 0; i < D; ++i) acc[i] += pr * val(tok, i);
          }
          for (int i = 0; i < D; ++i) ref[hq * D + i] = acc[i] / sum;
        }
      }
    }
  }
};

}  // namespace tw::test
