// Weights: the tensors a config implies, random weights, a model folder saved and loaded back.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "llm_test_util.hpp"
#include "tileweave/llm/weights.hpp"

using namespace tw;
using tw::test::error_of;
using tw::test::TempDir;

namespace {

const WeightSpec* spec(const std::vector<WeightSpec>& v, const std::string& name) {
  for (const WeightSpec& s : v)
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<int64_t> shape_of(const std::vector<WeightSpec>& v, const std::string& name) {
  const WeightSpec* s = spec(v, name);
  EXPECT_NE(s, nullptr) << name;
  return s ? s->shape : std::vector<int64_t>{};
}

int64_t total(const std::vector<WeightSpec>& v) {
  int64_t n = 0;
  for (const WeightSpec& s : v) n += s.numel();
  return n;
}

}  // namespace

TEST(LlmWeights, ExpectedWeightsTinyLlama) {
  const ModelConfig c = named_config("tiny-llama");
  const std::vector<WeightSpec> w = expected_weights(c);
  ASSERT_EQ(w.size(), 1u + 2 * 9 + 1 + 1);  // embedding, 9 per layer, final norm, LM head
  EXPECT_EQ(w.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(w.back().name, "lm_head.weight");
  EXPECT_EQ(w[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(w[w.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(shape_of(w, "model.embed_tokens.weight"), (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(shape_of(w, "model.layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(shape_of(w, "model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(shape_of(w, "model.layers.1.self_attn.v_proj.weight"), (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(shape_of(w, "model.layers.1.self_attn.o_proj.weight"), (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(shape_of(w, "model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{640, 256}));
  EXPECT_EQ(shape_of(w, "model.layers.0.mlp.up_proj.weight"), (std::vector<int64_t>{640, 256}));
  EXPECT_EQ(shape_of(w, "model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{256, 640}));
  EXPECT_EQ(shape_of(w, "model.layers.0.post_attention_layernorm.weight"), (std::vector<int64_t>{256}));
  EXPECT_EQ(shape_of(w, "lm_head.weight"), (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(spec(w, "model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(total(w), c.parameter_count());
}

TEST(LlmWeights, ExpectedWeightsTinyQwen2) {
  const ModelConfig c = named_config("tiny-qwen2");
  const std::vector<WeightSpec> w = expected_weights(c);
  ASSERT_EQ(w.size(), 1u + 2 * 12 + 1);  // 3 biases more per layer, no LM head (tied)
  EXPECT_EQ(spec(w, "lm_head.weight"), nullptr);
  EXPECT_EQ(shape_of(w, "model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{448, 320}));
  EXPECT_EQ(shape_of(w, "model.layers.0.self_attn.q_proj.bias"), (std::vector<int64_t>{448}));
  EXPECT_EQ(shape_of(w, "model.layers.1.self_attn.k_proj.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape_of(w, "model.layers.1.self_attn.v_proj.bias"), (std::vector<int64_t>{64}));
  EXPECT_EQ(shape_of(w, "model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{320, 448}));
  EXPECT_EQ(spec(w, "model.layers.0.self_attn.o_proj.bias"), nullptr);
  EXPECT_EQ(shape_of(w, "model.layers.1.mlp.down_proj.weight"), (std::vector<int64_t>{320, 704}));
  EXPECT_EQ(total(w), c.parameter_count());
}

TEST(LlmWeights, RandomWeightsAreDeterministicWithTheRightStatistics) {
  const ModelConfig c = named_config("tiny-llama");
  const HostWeights a = random_weights(c, 7), b = random_weights(c, 7), d = random_weights(c, 8);
  EXPECT_EQ(a.tensors, b.tensors);
  EXPECT_NE(a.tensors.at("model.layers.0.mlp.up_proj.weight"), d.tensors.at("model.layers.0.mlp.up_proj.weight"));
  EXPECT_NO_THROW(a.check(c));
  auto stats = [&](const std::string& name) {
    double s = 0, ss = 0;
    const auto& t = a.at(name);
    for (uint16_t x : t) {
      const double v = bf16_to_float(x);
      s += v;
      ss += v * v;
    }
    const double mean = s / t.size();
    return std::pair<double, double>{mean, std::sqrt(ss / t.size() - mean * mean)};
  };
  auto [m_mean, m_std] = stats("model.layers.1.mlp.gate_proj.weight");  // 163840 samples
  EXPECT_NEAR(m_mean, 0.0, 0.001);
  EXPECT_NEAR(m_std, 0.02, 0.0005);
  auto [n_mean, n_std] = stats("model.layers.0.input_layernorm.weight");  // 256 samples
  EXPECT_NEAR(n_mean, 1.0, 0.03);
  EXPECT_NEAR(n_std, 0.1, 0.02);
  EXPECT_EQ(&a.lm_head(), &a.at("lm_head.weight"));
  const HostWeights q = random_weights(named_config("tiny-qwen2"), 1, 0.2f);
  EXPECT_EQ(&q.lm_head(), &q.at("model.embed_tokens.weight"));  // tied
  EXPECT_NE(error_of([&] { q.at("lm_head.weight"); }).find("lm_head.weight"), std::string::npos);
}

TEST(LlmWeights, SaveThenLoad) {
  TempDir dir;
  for (const char* name : {"tiny-llama", "tiny-qwen2"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = named_config(name);
    const HostWeights w = random_weights(c, 3);
    const std::string folder = dir / name;
    save_model(folder, c, w);
    EXPECT_TRUE(std::filesystem::exists(folder + "/config.json"));
    const ModelConfig c2 = load_hf_config(folder);
    EXPECT_EQ(c2.name, folder);
    EXPECT_EQ(c2.family, c.family);
    EXPECT_EQ(c2.parameter_count(), c.parameter_count());
    EXPECT_EQ(c2.rope_factor, c.rope_factor);
    const SafetensorsModel m(folder);
    EXPECT_EQ(m.names().size(), expected_weights(c).size());
    EXPECT_EQ(m.files().at(0).metadata().at("format"), "pt");
    const HostWeights back = load_weights(m, c2);
    EXPECT_EQ(back.tensors, w.tensors);
  }
}

TEST(LlmWeights, LoadChecksEveryTensor) {
  TempDir dir;
  const ModelConfig c = named_config("tiny-qwen2");
  const HostWeights w = random_weights(c, 5);
  const std::vector<WeightSpec> specs = expected_weights(c);
  auto write = [&](const std::string& file, const std::string& skip, const std::string& reshape) {
    std::vector<TensorToWrite> t;
    for (const WeightSpec& s : specs) {
      if (s.name == skip) continue;
      std::vector<int64_t> shape = s.shape;
      if (s.name == reshape) shape = {shape[1], shape[0]};
      t.push_back({s.name, DType::BF16, shape, w.at(s.name).data()});
    }
    write_safetensors(dir / file, t);
    return SafetensorsModel(dir / file);
  };
  const std::string missing = "model.layers.1.self_attn.v_proj.bias";
  std::string e = error_of([&] { load_weights(write("missing.safetensors", missing, ""), c); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("missing.safetensors"), std::string::npos) << e;
  const std::string turned = "model.layers.0.mlp.down_proj.weight";
  e = error_of([&] { load_weights(write("turned.safetensors", "", turned), c); });
  EXPECT_NE(e.find(turned), std::string::npos) << e;
  EXPECT_NE(e.find("[704, 320]"), std::string::npos) << e;
  EXPECT_NE(e.find("[320, 704]"), std::string::npos) << e;

  // F32 checkpoints load, rounded to bf16.
  std::vector<std::vector<float>> f32;
  f32.reserve(specs.size());  // the pointers handed to write_safetensors must stay valid
  std::vector<TensorToWrite> t;
  for (const WeightSpec& s : specs) {
    std::vector<float> v;
    for (uint16_t x : w.at(s.name)) v.push_back(bf16_to_float(x) * (1.0f + 1.0f / 1024));  // not bf16 values
    f32.push_back(std::move(v));
    t.push_back({s.name, DType::F32, s.shape, f32.back().data()});
  }
  write_safetensors(dir / "f32.safetensors", t);
  const HostWeights loaded = load_weights(SafetensorsModel(dir / "f32.safetensors"), c);
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& got = loaded.at(specs[i].name);
    for (size_t k = 0; k < got.size(); k += 97) ASSERT_EQ(got[k], float_to_bf16(f32[i][k])) << specs[i].name;
  }

  // The decoder-side check: a HostWeights with a tensor of the wrong size.
  HostWeights broken = w;
  broken.tensors[turned].pop_back();
  e = error_of([&] { broken.check(c); });
  EXPECT_NE(e.find(turned), std::string::npos) << e;
}

// Tensor-parallel weights: each rank's shard checks against its config, the ranks' q/k/v rows (and
// biases) stack back into the model's, norms are whole, and the row-parallel o_proj and down sum over
// the ranks to the model's products (each rank fed its block of the attention output / h). tiny-qwen2
// with 7 query heads on 1 KV head cannot be split in two; tiny-llama (8 / 2 heads) can.
TEST(LlmWeights, TensorParallelWeights) {
  const ModelConfig c = named_config("tiny-llama");
  const HostWeights w = random_weights(c, 11);
  const int tp = 2;
  std::vector<HostWeights> ranks;
  for (int r = 0; r < tp; ++r) {
    ranks.push_back(tensor_parallel_weights(w, c, tp, r));
    EXPECT_NO_THROW(ranks.back().check(tensor_parallel_shard(c, tp)));
  }
  const std::string p = "model.layers.1.";
  for (const char* name : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.gate_proj.weight"}) {
    std::vector<uint16_t> stacked;
    for (const HostWeights& h : ranks) stacked.insert(stacked.end(), h.at(p + name).begin(), h.at(p + name).end());
    EXPECT_EQ(stacked, w.at(p + name)) << name;
  }
  EXPECT_EQ(ranks[1].at(p + "post_attention_layernorm.weight"), w.at(p + "post_attention_layernorm.weight"));
  const int64_t d = c.hidden_size;
  for (const auto& [name, k] : {std::pair<const char*, int64_t>{"self_attn.o_proj.weight", c.q_dim()},
                                std::pair<const char*, int64_t>{"mlp.down_proj.weight", c.intermediate_size}}) {
    std::vector<double> a(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) a[i] = std::sin(0.37 * double(i) + 1.0);
    const std::vector<uint16_t>& full = w.at(p + name);
    const int64_t ks = k / tp;
    for (int64_t row = 0; row < d; row += 37) {
      double want = 0, got = 0;
      for (int64_t i = 0; i < k; ++i) want += double(bf16_to_float(full[row * k + i])) * a[i];
      for (int r = 0; r < tp; ++r) {
        const std::vector<uint16_t>& part = ranks[r].at(p + name);
        for (int64_t i = 0; i < ks; ++i) got += double(bf16_to_float(part[row * ks + i])) * a[r * ks + i];
      }
      EXPECT_NEAR(got, want, 1e-9 * (1 + std::abs(want))) << name << " row " << row;
    }
  }
  EXPECT_NE(error_of([&] { tensor_parallel_weights(w, c, tp, 2); }).find("rank 2"), std::string::npos);
  EXPECT_NE(error_of([&] { tensor_parallel_weights(random_weights(named_config("tiny-qwen2"), 1), named_config("tiny-qwen2"), 2, 0); })
                .find("num_kv_heads 1 is not divisible by 2"),
            std::string::npos);
}
