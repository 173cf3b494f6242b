#include "tileweave/llm/reference.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

namespace tw {

namespace {

// The precision of the decoder running on this thread (ReferenceDecoder::step and reference_forward set
// it): bf16 rounds where transformers' bf16 model does, fp32 rounds nowhere (weights stay bf16).
thread_local bool t_exact = false;
float rnd(float x) { return t_exact ? x : round_bf16(x); }
struct PrecisionScope {
  bool saved;
  explicit PrecisionScope(ReferencePrecision p) : saved(t_exact) { t_exact = p == ReferencePrecision::Fp32; }
  ~PrecisionScope() { t_exact = saved; }
};

double dot(const float* a, const float* b, int64_t n) {
  // Four partial sums: independent chains the CPU can overlap (the order does not matter at double precision).
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += double{a[k]} * b[k];
    s1 += double{a[k + 1]} * b[k + 1];
    s2 += double{a[k + 2]} * b[k + 2];
    s3 += double{a[k + 3]} * b[k + 3];
  }
  for (; k < n; ++k) s0 += double{a[k]} * b[k];
  return (s0 + s1) + (s2 + s3);
}

// y_i[r] = bf16(W[r, :] . x_i + bias[r]) for each of the n inputs x_i (rows of x, stride cols) and each row r of
// W [rows, cols]. Each weight row is converted once and used for every input.
void linear(const uint16_t* W, const uint16_t* bias, int64_t rows, int64_t cols, const float* x, int64_t n,
            float* y) {
  std::vector<float> w(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* wr = W + r * cols;
    for (int64_t k = 0; k < cols; ++k) w[k] = bf16_to_float(wr[k]);
    const double b = bias ? bf16_to_float(bias[r]) : 0.0;
    for (int64_t i = 0; i < n; ++i)
      y[i * rows + r] = rnd(static_cast<float>(dot(w.data(), x + i * cols, cols) + b));
  }
}

// Decode attention of one token over n cached positions: q [Hq * D], K and V [n][Hkv * D]; out [Hq * D].
void attend(const ModelConfig& c, const float* q, const float* K, const float* V, int64_t n, float* out) {
  const int D = c.head_dim, group = c.num_q_heads / c.num_kv_heads;
  const int64_t kv_dim = c.kv_dim();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  std::vector<float> p(static_cast<size_t>(n));
  std::vector<double> acc(D);
  for (int h = 0; h < c.num_q_heads; ++h) {
    const int64_t kv_off = int64_t{h / group} * D;  // GQA: query head h reads KV head h / group
    const float* qh = q + int64_t{h} * D;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      p[j] = static_cast<float>(dot(qh, K + j * kv_dim + kv_off, D)) * scale;
      mx = std::max(mx, p[j]);
    }
    // As flash attention (torch SDPA's default CUDA path, and our decode kernel) does: the weights exp(s - max) are
    // rounded to bf16 for the P.V product, while the normaliser sums them unrounded.
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float e = std::exp(p[j] - mx);
      sum += e;
      p[j] = rnd(e);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = V + j * kv_dim + kv_off;
      for (int e = 0; e < D; ++e) acc[e] += double{p[j]} * vj[e];
    }
    for (int e = 0; e < D; ++e) out[int64_t{h} * D + e] = rnd(static_cast<float>(acc[e] / sum));
  }
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

// The MLP of n rows: xn [n][d] -> out [n][d]; g and u are scratch [n][F].
void mlp(const ModelConfig& c, const HostWeights& w, const std::string& p, const float* xn, int64_t n, float* out,
         std::vector<float>& g, std::vector<float>& u) {
  const int64_t d = c.hidden_size, F = c.intermediate_size;
  g.resize(n * F);
  u.resize(n * F);
  linear(w.at(p + "mlp.gate_proj.weight").data(), nullptr, F, d, xn, n, g.data());
  linear(w.at(p + "mlp.up_proj.weight").data(), nullptr, F, d, xn, n, u.data());
  for (int64_t i = 0; i < n * F; ++i) g[i] = rnd(rnd(silu(g[i])) * u[i]);
  linear(w.at(p + "mlp.down_proj.weight").data(), nullptr, d, F, g.data(), n, out);
}

// The q, k, v projections of n rows.
void qkv(const ModelConfig& c, const HostWeights& w, const std::string& p, const float* xn, int64_t n, float* q,
         float* k, float* v) {
  const int64_t d = c.hidden_size;
  auto bias = [&](const char* which) {
    return c.qkv_bias ? w.at(p + "self_attn." + which + "_proj.bias").data() : nullptr;
  };
  linear(w.at(p + "self_attn.q_proj.weight").data(), bias("q"), c.q_dim(), d, xn, n, q);
  linear(w.at(p + "self_attn.k_proj.weight").data(), bias("k"), c.kv_dim(), d, xn, n, k);
  linear(w.at(p + "self_attn.v_proj.weight").data(), bias("v"), c.kv_dim(), d, xn, n, v);
}

void rope_heads(float* x, int heads, int D, int64_t pos, const std::vector<float>& inv_freq) {
  for (int h = 0; h < heads; ++h) reference_rope(x + int64_t{h} * D, D, pos, inv_freq);
}

void add_residual(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = rnd(x[i] + y[i]);
}

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

void embed(const ModelConfig& c, const HostWeights& w, int32_t token, float* x) {
  if (token < 0 || token >= c.vocab_size)
    throw InvalidArgument("token " + std::to_string(token) + " is outside the vocabulary [0, " +
                          std::to_string(c.vocab_size) + ")");
  const uint16_t* row = w.at("model.embed_tokens.weight").data() + int64_t{token} * c.hidden_size;
  for (int64_t i = 0; i < c.hidden_size; ++i) x[i] = bf16_to_float(row[i]);
}

}  // namespace

void reference_rms_norm(const float* x, const uint16_t* weight, int64_t n, double eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double{x[i]} * x[i];
  const float var = static_cast<float>(ss / static_cast<double>(n));
  const float r = 1.0f / std::sqrt(var + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) out[i] = rnd(bf16_to_float(weight[i]) * rnd(x[i] * r));
}

void reference_rope(float* x, int head_dim, int64_t pos, const std::vector<float>& inv_freq) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];  // float32, as transformers' freqs
    const float cs = rnd(static_cast<float>(std::cos(static_cast<double>(angle))));
    const float sn = rnd(static_cast<float>(std::sin(static_cast<double>(angle))));
    const float a = x[i], b = x[i + half];
    // q * cos + rotate_half(q) * sin, rotate_half(q) = [-q2, q1]
    x[i] = rnd(rnd(a * cs) + rnd(-b * sn));
    x[i + half] = rnd(rnd(b * cs) + rnd(a * sn));
  }
}

// ---- the cached decoder ----

ReferenceDecoder::ReferenceDecoder(const ModelConfig& c, const HostWeights& w, int batch, int max_seq_len,
                                   ReferencePrecision precision)
    : c_(c), w_(&w), batch_(batch), max_seq_len_(max_seq_len), precision_(precision) {
  w.check(c);  // validates c too
  if (batch <= 0) throw InvalidArgument("ReferenceDecoder: batch must be positive, got " + std::to_string(batch));
  if (max_seq_len <= 0)
    throw InvalidArgument("ReferenceDecoder: max_seq_len must be positive, got " + std::to_string(max_seq_len));
  lengths_.assign(batch, 0);
  inv_freq_ = c.rope_inv_freq();
  const size_t cache = size_t(c.num_layers) * batch * max_seq_len * size_t(c.kv_dim());
  k_cache_.assign(cache, 0.0f);
  v_cache_.assign(cache, 0.0f);
}

size_t ReferenceDecoder::cache_offset(int layer, int b) const {
  return (size_t(layer) * batch_ + b) * size_t(max_seq_len_) * size_t(c_.kv_dim());
}

std::vector<float> ReferenceDecoder::step(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& active) {
  if (static_cast<int>(tokens.size()) != batch_)
    throw InvalidArgument("ReferenceDecoder::step: " + std::to_string(tokens.size()) + " tokens for batch " +
                          std::to_string(batch_));
  if (!active.empty() && static_cast<int>(active.size()) != batch_)
    throw InvalidArgument("ReferenceDecoder::step: active has " + std::to_string(active.size()) +
                          " entries for batch " + std::to_string(batch_));
  std::vector<int> rows;  // the active sequences, one activation row each
  for (int b = 0; b < batch_; ++b)
    if (active.empty() || active[b]) {
      if (lengths_[b] >= max_seq_len_)
        throw InvalidArgument("ReferenceDecoder::step: sequence " + std::to_string(b) + " is full (max_seq_len " +
                              std::to_string(max_seq_len_) + ")");
      rows.push_back(b);
    }
  const PrecisionScope scope(precision_);
  const ModelConfig& c = c_;
  const HostWeights& w = *w_;
  const int64_t n = static_cast<int64_t>(rows.size()), d = c.hidden_size, V = c.vocab_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<float> logits(size_t(batch_) * V, 0.0f);
  if (n == 0) return logits;

  std::vector<float> x(n * d), xn(n * d), q(n * qd), k(n * kvd), v(n * kvd), att(n * qd), o(n * d), g, u;
  for (int64_t i = 0; i < n; ++i) embed(c, w, tokens[rows[i]], &x[i * d]);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    const uint16_t* ln1 = w.at(p + "input_layernorm.weight").data();
    for (int64_t i = 0; i < n; ++i) reference_rms_norm(&x[i * d], ln1, d, c.rms_norm_eps, &xn[i * d]);
    qkv(c, w, p, xn.data(), n, q.data(), k.data(), v.data());
    for (int64_t i = 0; i < n; ++i) {
      const int b = rows[i], pos = lengths_[b];
      rope_heads(&q[i * qd], c.num_q_heads, c.head_dim, pos, inv_freq_);
      rope_heads(&k[i * kvd], c.num_kv_heads, c.head_dim, pos, inv_freq_);
      float* K = &k_cache_[cache_offset(l, b)];
      float* Vc = &v_cache_[cache_offset(l, b)];
      std::copy_n(&k[i * kvd], kvd, K + int64_t{pos} * kvd);
      std::copy_n(&v[i * kvd], kvd, Vc + int64_t{pos} * kvd);
      attend(c, &q[i * qd], K, Vc, pos + 1, &att[i * qd]);
    }
    linear(w.at(p + "self_attn.o_proj.weight").data(), nullptr, d, qd, att.data(), n, o.data());
    add_residual(x.data(), o.data(), n * d);
    const uint16_t* ln2 = w.at(p + "post_attention_layernorm.weight").data();
    for (int64_t i = 0; i < n; ++i) reference_rms_norm(&x[i * d], ln2, d, c.rms_norm_eps, &xn[i * d]);
    mlp(c, w, p, xn.data(), n, o.data(), g, u);
    add_residual(x.data(), o.data(), n * d);
  }
  const uint16_t* norm = w.at("model.norm.weight").data();
  for (int64_t i = 0; i < n; ++i) reference_rms_norm(&x[i * d], norm, d, c.rms_norm_eps, &xn[i * d]);
  std::vector<float> out(n * V);
  linear(w.lm_head().data(), nullptr, V, d, xn.data(), n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(&out[i * V], V, &logits[size_t(rows[i]) * V]);
    ++lengths_[rows[i]];
  }
  return logits;
}

// ---- the whole-sequence forward ----

std::vector<float> reference_forward(const ModelConfig& c, const HostWeights& w, const std::vector<int32_t>& tokens,
                                     ReferencePrecision precision) {
  const PrecisionScope scope(precision);
  w.check(c);
  if (tokens.empty()) throw InvalidArgument("reference_forward: no tokens");
  const int64_t T = static_cast<int64_t>(tokens.size()), d = c.hidden_size, V = c.vocab_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  const std::vector<float> inv_freq = c.rope_inv_freq();
  // Every position's activations at once; K and V of the whole sequence per layer, position t attending to [0, t].
  std::vector<float> x(T * d), xn(T * d), q(T * qd), K(T * kvd), Vv(T * kvd), att(T * qd), o(T * d), g, u;
  for (int64_t t = 0; t < T; ++t) embed(c, w, tokens[t], &x[t * d]);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    const uint16_t* ln1 = w.at(p + "input_layernorm.weight").data();
    for (int64_t t = 0; t < T; ++t) reference_rms_norm(&x[t * d], ln1, d, c.rms_norm_eps, &xn[t * d]);
    qkv(c, w, p, xn.data(), T, q.data(), K.data(), Vv.data());
    for (int64_t t = 0; t < T; ++t) {
      rope_heads(&q[t * qd], c.num_q_heads, c.head_dim, t, inv_freq);
      rope_heads(&K[t * kvd], c.num_kv_heads, c.head_dim, t, inv_freq);
    }
    for (int64_t t = 0; t < T; ++t) attend(c, &q[t * qd], K.data(), Vv.data(), t + 1, &att[t * qd]);  // causal
    linear(w.at(p + "self_attn.o_proj.weight").data(), nullptr, d, qd, att.data(), T, o.data());
    add_residual(x.data(), o.data(), T * d);
    const uint16_t* ln2 = w.at(p + "post_attention_layernorm.weight").data();
    for (int64_t t = 0; t < T; ++t) reference_rms_norm(&x[t * d], ln2, d, c.rms_norm_eps, &xn[t * d]);
    mlp(c, w, p, xn.data(), T, o.data(), g, u);
    add_residual(x.data(), o.data(), T * d);
  }
  const uint16_t* norm = w.at("model.norm.weight").data();
  for (int64_t t = 0; t < T; ++t) reference_rms_norm(&x[t * d], norm, d, c.rms_norm_eps, &xn[t * d]);
  std::vector<float> logits(T * V);
  linear(w.lm_head().data(), nullptr, V, d, xn.data(), T, logits.data());
  return logits;
}

std::vector<float> reference_forward_tp(const ModelConfig& c, const HostWeights& w, const std::vector<int32_t>& tokens,
                                        int tp, ReferencePrecision precision) {
  const ModelConfig s = tensor_parallel_shard(c, tp);
  std::vector<HostWeights> ranks;
  for (int r = 0; r < tp; ++r) ranks.push_back(tensor_parallel_weights(w, c, tp, r));
  const PrecisionScope scope(precision);
  if (tokens.empty()) throw InvalidArgument("reference_forward_tp: no tokens");
  const int64_t T = static_cast<int64_t>(tokens.size()), d = c.hidden_size, V = c.vocab_size, Vs = s.vocab_size;
  const int64_t qd = s.q_dim(), kvd = s.kv_dim();
  const std::vector<float> inv_freq = c.rope_inv_freq();
  std::vector<float> x(T * d), xn(T * d), q(T * qd), K(T * kvd), Vv(T * kvd), att(T * qd), o(T * d), sum(T * d), g, u;
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V)
      throw InvalidArgument("token " + std::to_string(tokens[t]) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
    embed(s, ranks[tokens[t] / Vs], tokens[t] % Vs, &x[t * d]);
  }
  // Every rank's partial output of one row-parallel op, summed (the all-reduce).
  auto all_reduce = [&](const std::function<void(int)>& partial) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int r = 0; r < tp; ++r) {
      partial(r);
      for (int64_t i = 0; i < T * d; ++i) sum[i] += o[i];
    }
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    const uint16_t* ln1 = w.at(p + "input_layernorm.weight").data();
    for (int64_t t = 0; t < T; ++t) reference_rms_norm(&x[t * d], ln1, d, c.rms_norm_eps, &xn[t * d]);
    all_reduce([&](int r) {
      qkv(s, ranks[r], p, xn.data(), T, q.data(), K.data(), Vv.data());
      for (int64_t t = 0; t < T; ++t) {
        rope_heads(&q[t * qd], s.num_q_heads, s.head_dim, t, inv_freq);
        rope_heads(&K[t * kvd], s.num_kv_heads, s.head_dim, t, inv_freq);
      }
      for (int64_t t = 0; t < T; ++t) attend(s, &q[t * qd], K.data(), Vv.data(), t + 1, &att[t * qd]);
      linear(ranks[r].at(p + "self_attn.o_proj.weight").data(), nullptr, d, qd, att.data(), T, o.data());
    });
    add_residual(x.data(), sum.data(), T * d);
    const uint16_t* ln2 = w.at(p + "post_attention_layernorm.weight").data();
    for (int64_t t = 0; t < T; ++t) reference_rms_norm(&x[t * d], ln2, d, c.rms_norm_eps, &xn[t * d]);
    all_reduce([&](int r) { mlp(s, ranks[r], p, xn.data(), T, o.data(), g, u); });
    add_residual(x.data(), sum.data(), T * d);
  }
  const uint16_t* norm = w.at("model.norm.weight").data();
  for (int64_t t = 0; t < T; ++t) reference_rms_norm(&x[t * d], norm, d, c.rms_norm_eps, &xn[t * d]);
  std::vector<float> logits(T * V), part(T * Vs);
  for (int r = 0; r < tp; ++r) {  // the all-gather of the vocabulary blocks
    linear(ranks[r].lm_head().data(), nullptr, Vs, d, xn.data(), T, part.data());
    for (int64_t t = 0; t < T; ++t) std::copy_n(&part[t * Vs], Vs, &logits[t * V + r * Vs]);
  }
  return logits;
}

}  // namespace tw
