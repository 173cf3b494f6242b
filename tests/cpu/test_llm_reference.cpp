// The CPU reference decode step: cached decoding against the whole-sequence forward, batching with `active`, and a
// one-layer model against the textbook formulas computed here in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

#include "llm_test_util.hpp"
#include "tileweave/llm/reference.hpp"

using namespace tw;
using tw::test::error_of;

namespace {

std::vector<int32_t> random_tokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

float max_abs(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

float max_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

struct Case {
  const char* config;
  float std;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.config << " std " << c.std; }

class ReferenceDecoderModels : public ::testing::TestWithParam<Case> {};

}  // namespace

// Decoding 12 tokens one step at a time gives, at every position, the logits of the causal forward over all 12.
TEST_P(ReferenceDecoderModels, StepByStepMatchesWholeSequence) {
  const ModelConfig c = named_config(GetParam().config);
  const HostWeights w = random_weights(c, 11, GetParam().std);
  const std::vector<int32_t> tokens = random_tokens(12, c.vocab_size, 5);
  const std::vector<float> full = reference_forward(c, w, tokens);
  ASSERT_EQ(full.size(), tokens.size() * c.vocab_size);

  ReferenceDecoder dec(c, w, 1, 16);
  const int64_t V = c.vocab_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<float> logits = dec.step({tokens[t]});
    ASSERT_EQ(logits.size(), size_t(V));
    EXPECT_EQ(dec.lengths()[0], int(t + 1));
    const float scale = max_abs(&full[t * V], V);
    ASSERT_GT(scale, 0.0f);
    EXPECT_LT(max_diff(logits.data(), &full[t * V], V), 1e-3f * scale) << "position " << t;
    for (float x : logits) ASSERT_EQ(x, round_bf16(x)) << "logits are bf16 values";
    if (t > 0) EXPECT_GT(max_diff(&full[t * V], &full[(t - 1) * V], V), 0.0f);
  }
  // The cache holds bf16 values.
  for (int64_t i = 0; i < 2 * c.kv_dim(); ++i) ASSERT_EQ(dec.k_cache(1, 0)[i], round_bf16(dec.k_cache(1, 0)[i]));
  EXPECT_THROW(dec.step({static_cast<int32_t>(c.vocab_size)}), InvalidArgument);  // out of the vocabulary
  EXPECT_EQ(dec.lengths()[0], 12);                          // a refused step changes nothing
}

// Three sequences that start at different steps and have different lengths (inactive slots get a bad token, which
// must be ignored) produce, each, the logits of decoding it alone.
TEST_P(ReferenceDecoderModels, BatchMatchesSequencesAlone) {
  const ModelConfig c = named_config(GetParam().config);
  const HostWeights w = random_weights(c, 12, GetParam().std);
  const int64_t V = c.vocab_size;
  const int start[3] = {0, 2, 5}, len[3] = {12, 6, 9};
  std::vector<std::vector<int32_t>> seq;
  std::vector<std::vector<float>> alone;  // [step][V] per sequence
  for (int b = 0; b < 3; ++b) {
    seq.push_back(random_tokens(len[b], V, 100 + b));
    ReferenceDecoder one(c, w, 1, 12);
    std::vector<float> all;
    for (int32_t t : seq[b]) {
      const std::vector<float> l = one.step({t});
      all.insert(all.end(), l.begin(), l.end());
    }
    alone.push_back(std::move(all));
  }
  ReferenceDecoder dec(c, w, 3, 12);
  for (int s = 0; s < 14; ++s) {
    std::vector<int32_t> tokens(3, -1);
    std::vector<uint8_t> active(3, 0);
    for (int b = 0; b < 3; ++b)
      if (s >= start[b] && s < start[b] + len[b]) {
        active[b] = 1;
        tokens[b] = seq[b][s - start[b]];
      }
    const std::vector<float> logits = dec.step(tokens, active);
    for (int b = 0; b < 3; ++b) {
      const float* row = &logits[b * V];
      if (active[b]) {
        const float* want = &alone[b][(s - start[b]) * V];
        EXPECT_EQ(max_diff(row, want, V), 0.0f) << "sequence " << b << " step " << s;
      } else {
        EXPECT_EQ(max_abs(row, V), 0.0f) << "inactive sequence " << b << " step " << s;
      }
    }
  }
  EXPECT_EQ(dec.lengths(), (std::vector<int>{12, 6, 9}));
  EXPECT_THROW(dec.step({1, 1, 1}, {1, 0, 0}), InvalidArgument);  // sequence 0 is full
}

INSTANTIATE_TEST_SUITE_P(ReferenceDecoder, ReferenceDecoderModels,
                         ::testing::Values(Case{"tiny-llama", 0.02f}, Case{"tiny-llama", 0.2f},
                                           Case{"tiny-qwen2", 0.02f}, Case{"tiny-qwen2", 0.2f}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = std::string(i.param.config) + (i.param.std > 0.1f ? "_std02" : "_std002");
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(ReferenceDecoder, RefusesBadArguments) {
  const ModelConfig c = named_config("tiny-llama");
  HostWeights w = random_weights(c, 1);
  ReferenceDecoder dec(c, w, 2, 4);
  EXPECT_THROW(dec.step({1}), InvalidArgument);          // one token for batch 2
  EXPECT_THROW(dec.step({1, 2}, {1}), InvalidArgument);  // active of the wrong size
  const std::vector<float> none = dec.step({1, 2}, {0, 0});
  EXPECT_EQ(max_abs(none.data(), int64_t(none.size())), 0.0f);
  EXPECT_EQ(dec.lengths(), (std::vector<int>{0, 0}));
  EXPECT_THROW(ReferenceDecoder(c, w, 0, 4), InvalidArgument);
  w.tensors.erase("model.layers.1.mlp.up_proj.weight");
  const std::string e = error_of([&] { ReferenceDecoder d(c, w, 1, 4); });
  EXPECT_NE(e.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e;
}

// ---- a one-layer model by the textbook ----

namespace {

// Four query heads on two KV heads (so a wrong GQA mapping shows), q_dim 16 != hidden 8.
ModelConfig hand_config(ModelFamily family = ModelFamily::Llama) {
  ModelConfig c;
  c.name = "hand";
  c.family = family;
  c.vocab_size = 16, c.hidden_size = 8, c.intermediate_size = 12, c.num_layers = 1;
  c.num_q_heads = 4, c.num_kv_heads = 2, c.head_dim = 4;
  c.rms_norm_eps = 1e-5, c.rope_theta = 10000, c.max_position_embeddings = 64;
  c.qkv_bias = c.tie_word_embeddings = family == ModelFamily::Qwen2;  // Qwen2: biases, and a tied LM head
  return c;
}

using Vec = std::vector<double>;

Vec to_double(const std::vector<uint16_t>& t) {
  Vec v;
  for (uint16_t x : t) v.push_back(bf16_to_float(x));
  return v;
}
Vec weights_of(const HostWeights& w, const std::string& name) { return to_double(w.at(name)); }

Vec matvec(const Vec& W, const Vec& x) {  // W [rows, x.size()]
  Vec y(W.size() / x.size(), 0.0);
  for (size_t r = 0; r < y.size(); ++r)
    for (size_t k = 0; k < x.size(); ++k) y[r] += W[r * x.size() + k] * x[k];
  return y;
}

Vec rms_norm(const Vec& x, const Vec& g, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v / x.size();
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = g[i] * x[i] / std::sqrt(ms + eps);
  return y;
}

// Rotate pairs (x[i], x[i + D/2]) of each head by pos * theta^(-2i/D).
void rope(Vec& x, int D, int pos, double theta) {
  for (size_t h = 0; h < x.size() / D; ++h)
    for (int i = 0; i < D / 2; ++i) {
      const double a = pos * std::pow(theta, -2.0 * i / D);
      double& x1 = x[h * D + i];
      double& x2 = x[h * D + i + D / 2];
      const double r1 = x1 * std::cos(a) - x2 * std::sin(a), r2 = x2 * std::cos(a) + x1 * std::sin(a);
      x1 = r1, x2 = r2;
    }
}

// Logits of every position of `tokens`, all in double, nothing rounded.
std::vector<Vec> textbook_forward(const ModelConfig& c, const HostWeights& w, const std::vector<int32_t>& tokens) {
  const int D = c.head_dim, d = static_cast<int>(c.hidden_size);
  const std::string p = "model.layers.0.";
  const Vec E = weights_of(w, "model.embed_tokens.weight");
  std::vector<Vec> K, Vs, out;
  for (size_t t = 0; t < tokens.size(); ++t) {
    Vec x(E.begin() + tokens[t] * d, E.begin() + (tokens[t] + 1) * d);
    Vec xn = rms_norm(x, weights_of(w, p + "input_layernorm.weight"), c.rms_norm_eps);
    Vec q = matvec(weights_of(w, p + "self_attn.q_proj.weight"), xn);
    Vec k = matvec(weights_of(w, p + "self_attn.k_proj.weight"), xn);
    Vec v = matvec(weights_of(w, p + "self_attn.v_proj.weight"), xn);
    if (c.qkv_bias) {
      const Vec bq = weights_of(w, p + "self_attn.q_proj.bias"), bk = weights_of(w, p + "self_attn.k_proj.bias"),
                bv = weights_of(w, p + "self_attn.v_proj.bias");
      for (size_t i = 0; i < q.size(); ++i) q[i] += bq[i];
      for (size_t i = 0; i < k.size(); ++i) k[i] += bk[i], v[i] += bv[i];
    }
    rope(q, D, static_cast<int>(t), c.rope_theta);
    rope(k, D, static_cast<int>(t), c.rope_theta);
    K.push_back(k);
    Vs.push_back(v);
    Vec att(q.size(), 0.0);
    for (int h = 0; h < c.num_q_heads; ++h) {
      const int kv = h / (c.num_q_heads / c.num_kv_heads) * D;  // query heads 0, 1 read KV head 0; 2, 3 head 1
      Vec s(K.size());
      for (size_t j = 0; j < K.size(); ++j) {
        for (int e = 0; e < D; ++e) s[j] += q[h * D + e] * K[j][kv + e];
        s[j] /= std::sqrt(double(D));
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& z : s) sum += z = std::exp(z - mx);
      for (size_t j = 0; j < K.size(); ++j)
        for (int e = 0; e < D; ++e) att[h * D + e] += s[j] / sum * Vs[j][kv + e];
    }
    const Vec o = matvec(weights_of(w, p + "self_attn.o_proj.weight"), att);
    for (int i = 0; i < d; ++i) x[i] += o[i];
    xn = rms_norm(x, weights_of(w, p + "post_attention_layernorm.weight"), c.rms_norm_eps);
    const Vec g = matvec(weights_of(w, p + "mlp.gate_proj.weight"), xn);
    const Vec u = matvec(weights_of(w, p + "mlp.up_proj.weight"), xn);
    Vec hsil(g.size());
    for (size_t i = 0; i < g.size(); ++i) hsil[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    const Vec dn = matvec(weights_of(w, p + "mlp.down_proj.weight"), hsil);
    for (int i = 0; i < d; ++i) x[i] += dn[i];
    xn = rms_norm(x, weights_of(w, "model.norm.weight"), c.rms_norm_eps);
    out.push_back(matvec(to_double(w.lm_head()), xn));
  }
  return out;
}

}  // namespace

TEST(ReferenceDecoder, RmsNormByTheTextbook) {
  const ModelConfig c = hand_config();
  const std::vector<float> x = {0.5f, -1.25f, 2.0f, 0.0f, 3.5f, -0.75f, 1.0f, -2.5f};
  const std::vector<uint16_t> g = {float_to_bf16(1.0f),  float_to_bf16(0.5f), float_to_bf16(2.0f),
                                   float_to_bf16(1.5f),  float_to_bf16(-1.0f), float_to_bf16(0.25f),
                                   float_to_bf16(1.125f), float_to_bf16(3.0f)};
  std::vector<float> y(8);
  reference_rms_norm(x.data(), g.data(), 8, c.rms_norm_eps, y.data());
  double ms = 0;
  for (float v : x) ms += double(v) * v / 8;  // 27.25 / 8
  for (int i = 0; i < 8; ++i) {
    const double want = bf16_to_float(g[i]) * x[i] / std::sqrt(ms + 1e-5);
    EXPECT_NEAR(y[i], want, std::fabs(want) / 128 + 1e-6) << i;  // two bf16 roundings at most
    EXPECT_EQ(y[i], round_bf16(y[i]));
  }
  // mean(x^2) = 1: x * rsqrt(1 + 1e-5) rounds back to +-1, so the output is the weight times the sign, exactly.
  const std::vector<float> ones = {1, -1, 1, -1, 1, -1, 1, -1};
  reference_rms_norm(ones.data(), g.data(), 8, c.rms_norm_eps, y.data());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], ones[i] * bf16_to_float(g[i])) << i;
}

TEST(ReferenceDecoder, RopeByTheTextbook) {
  ModelConfig c = hand_config();
  c.head_dim = 8;
  const std::vector<float> inv = c.rope_inv_freq();  // 10000^(-2i/8) = 1, 0.1, 0.01, 0.001
  ASSERT_EQ(inv.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(inv[i], std::pow(10.0, -i), 1e-7 * std::pow(10.0, -i));
  const std::array<float, 8> x0 = {1, 2, 3, 4, 5, 6, 7, 8};
  std::array<float, 8> x = x0;
  reference_rope(x.data(), 8, 0, inv);
  EXPECT_EQ(x, x0);  // position 0: no rotation, exactly
  for (int pos : {1, 5, 100}) {
    x = x0;
    reference_rope(x.data(), 8, pos, inv);
    for (int i = 0; i < 4; ++i) {
      const double a = pos * std::pow(10000.0, -2.0 * i / 8), p = x0[i], q = x0[i + 4];
      // cos/sin, each product and the sum are rounded to bf16: a few bf16 steps of the inputs' size.
      const double tol = (std::fabs(p) + std::fabs(q)) * 3.0 / 256;
      EXPECT_NEAR(x[i], p * std::cos(a) - q * std::sin(a), tol) << "pos " << pos << " i " << i;
      EXPECT_NEAR(x[i + 4], q * std::cos(a) + p * std::sin(a), tol) << "pos " << pos << " i " << i;
    }
  }
}

// The whole one-layer model, four tokens, against the formulas above with no rounding: the reference's bf16
// roundings keep it within a couple of percent of the logits' range.
TEST(ReferenceDecoder, OneLayerModelByTheTextbook) {
  for (ModelFamily family : {ModelFamily::Llama, ModelFamily::Qwen2}) {
    SCOPED_TRACE(to_string(family));
    const ModelConfig c = hand_config(family);
    const HostWeights w = random_weights(c, 21, 0.3f);
    const std::vector<int32_t> tokens = {3, 11, 3, 7};
    const std::vector<Vec> want = textbook_forward(c, w, tokens);
    ReferenceDecoder dec(c, w, 1, 8);
    for (size_t t = 0; t < tokens.size(); ++t) {
      const std::vector<float> got = dec.step({tokens[t]});
      double scale = 0, diff = 0;
      for (int64_t i = 0; i < c.vocab_size; ++i) {
        scale = std::max(scale, std::fabs(want[t][i]));
        diff = std::max(diff, std::fabs(got[i] - want[t][i]));
      }
      ASSERT_GT(scale, 0.1);
      EXPECT_LT(diff, 0.02 * scale) << "position " << t << ": max diff " << diff << " of " << scale;
    }
  }
}

// Tensor parallelism on one process: the ranks' shards with their all-reduces as sums and the LM head's
// vocabulary blocks gathered give the whole model's logits (fp32: only the order of additions differs);
// at bf16 within the model's own rounding. tiny-llama (8 query / 2 KV heads, FFN 640, vocabulary 512)
// splits over at most 2 ranks.
TEST(ReferenceDecoder, TensorParallelForwardMatchesTheWholeModel) {
  const ModelConfig c = named_config("tiny-llama");
  const HostWeights w = random_weights(c, 21);
  const std::vector<int32_t> tokens{5, 300, 17, 511, 42, 0};
  const std::vector<float> whole = reference_forward(c, w, tokens, ReferencePrecision::Fp32);
  const std::vector<float> tp2 = reference_forward_tp(c, w, tokens, 2, ReferencePrecision::Fp32);
  ASSERT_EQ(tp2.size(), whole.size());
  double peak = 0, diff = 0;
  for (size_t i = 0; i < whole.size(); ++i) peak = std::max(peak, double(std::abs(whole[i]))), diff = std::max(diff, double(std::abs(tp2[i] - whole[i])));
  EXPECT_LT(diff, 1e-5 * peak) << "peak " << peak;
  const std::vector<float> bf16 = reference_forward(c, w, tokens), tp2_bf16 = reference_forward_tp(c, w, tokens, 2, ReferencePrecision::Bf16);
  double dev = 0;
  for (size_t i = 0; i < whole.size(); ++i) dev = std::max(dev, double(std::abs(tp2_bf16[i] - bf16[i])));
  EXPECT_LT(dev, 5e-2 * peak);
  EXPECT_NE(error_of([&] { reference_forward_tp(c, w, tokens, 4); }).find("num_kv_heads 2 is not divisible by 4"), std::string::npos);
}
