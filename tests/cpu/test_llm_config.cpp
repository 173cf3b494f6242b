// Model configs: presets, transformers' config.json read and written, sizes, RoPE inverse frequencies.
#include <gtest/gtest.h>

#include <cmath>

#include "llm_test_util.hpp"
#include "tileweave/llm/config.hpp"

using namespace tw;
using tw::test::error_of;

namespace {

// Llama-3.2-1B's config.json as the hub publishes it.
const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Mistral-7B-v0.1's: the Llama family's computation, attention limited to the last 4096 positions.
const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Qwen2-0.5B's: no head_dim (hidden / heads), a sliding window that is switched off.
const char* kQwen2_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

void expect_same_model(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_q_heads, b.num_q_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_factor, b.rope_factor);
  if (a.rope_factor != 0) {
    EXPECT_EQ(a.rope_low_freq_factor, b.rope_low_freq_factor);
    EXPECT_EQ(a.rope_high_freq_factor, b.rope_high_freq_factor);
    EXPECT_EQ(a.rope_original_max_pos, b.rope_original_max_pos);
  }
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
}

// The llama3 rule written out from its definition, in double: wavelengths shorter than original / high_freq_factor
// keep their frequency, longer than original / low_freq_factor are divided by the factor, and in between the
// frequency moves linearly (in original / wavelen) from f / factor to f.
double llama3_inv_freq(int i, int D, double theta, double factor, double low, double high, double original) {
  const double f = std::pow(theta, -2.0 * i / D);
  const double wavelen = 2 * M_PI / f;
  if (wavelen < original / high) return f;
  if (wavelen > original / low) return f / factor;
  const double s = (original / wavelen - low) / (high - low);
  return (1 - s) * f / factor + s * f;
}

}  // namespace

TEST(LlmConfig, NamedConfigsValidate) {
  for (const std::string& name : named_config_names()) {
    const ModelConfig c = named_config(name);
    EXPECT_EQ(c.name, name);
    EXPECT_NO_THROW(c.validate()) << name;
    EXPECT_EQ(c.num_q_heads % c.num_kv_heads, 0) << name;
  }
  const std::string e = error_of([] { named_config("llama-4"); });
  EXPECT_NE(e.find("llama-4"), std::string::npos) << e;
  EXPECT_NE(e.find("tiny-qwen2"), std::string::npos) << e;  // the known names are listed
}

TEST(LlmConfig, NamedConfigValues) {
  const ModelConfig tq = named_config("tiny-qwen2");
  EXPECT_EQ(tq.family, ModelFamily::Qwen2);
  EXPECT_EQ(tq.hidden_size, 320);
  EXPECT_EQ(tq.q_dim(), 448);
  EXPECT_EQ(tq.kv_dim(), 64);
  EXPECT_TRUE(tq.qkv_bias && tq.tie_word_embeddings);
  const ModelConfig l31 = named_config("llama-3.1-8b");
  EXPECT_EQ(l31.rope_factor, 8);
  EXPECT_EQ(l31.max_position_embeddings, 131072);
  EXPECT_EQ(named_config("llama-3-8b").rope_factor, 0);
  EXPECT_EQ(named_config("qwen2-7b").vocab_size, 152064);
  EXPECT_EQ(named_config("tiny-llama").rope_original_max_pos, 64);
}

// One rank's shard under tensor parallelism: heads, FFN columns and vocabulary split, norms whole (so
// the ranks' weight bytes add up to the model's plus tp - 1 copies of the norms); counts that tp does
// not divide are named.
TEST(LlmConfig, TensorParallelShard) {
  const ModelConfig c = named_config("llama-3-70b");
  EXPECT_EQ(c.parameter_count(), 70553706496);  // published: 70,553,706,496
  const ModelConfig s = tensor_parallel_shard(c, 2);
  EXPECT_EQ(s.name, "llama-3-70b/tp2");
  EXPECT_EQ(s.num_q_heads, 32);
  EXPECT_EQ(s.num_kv_heads, 4);
  EXPECT_EQ(s.intermediate_size, 14336);
  EXPECT_EQ(s.vocab_size, 64128);
  EXPECT_EQ(s.hidden_size, c.hidden_size);
  const int64_t norms = (2 * int64_t(c.num_layers) + 1) * c.hidden_size * 2;
  EXPECT_EQ(2 * s.decode_weight_bytes() - c.decode_weight_bytes(), norms);
  EXPECT_EQ(2 * s.kv_bytes({100}), c.kv_bytes({100}));
  EXPECT_EQ(tensor_parallel_shard(c, 1).num_q_heads, 64);
  EXPECT_NE(error_of([&] { tensor_parallel_shard(c, 3); }).find("num_kv_heads 8 is not divisible by 3"), std::string::npos);
  EXPECT_NE(error_of([&] { tensor_parallel_shard(c, 0); }).find("ranks 0"), std::string::npos);
}

// The published parameter counts: Llama-3.2-1B 1,235,814,400; Llama-3-8B 8,030,261,248; Qwen2-0.5B 494,032,768.
TEST(LlmConfig, ParameterCountsAndBytes) {
  const ModelConfig l1 = named_config("llama-3.2-1b"), l8 = named_config("llama-3-8b");
  EXPECT_EQ(l1.parameter_count(), 1235814400);
  EXPECT_EQ(l8.parameter_count(), 8030261248);
  EXPECT_EQ(named_config("qwen2-0.5b").parameter_count(), 494032768);
  // Tied: the table is read once as the LM head. Untied: the embedding table is not read, the LM head is.
  EXPECT_EQ(l1.decode_weight_bytes(), 2 * l1.parameter_count());
  EXPECT_EQ(l8.decode_weight_bytes(), 2 * (l8.parameter_count() - 128256LL * 4096));
  // K and V, 16 layers, 8 heads x 64, bf16: 32 KiB per token.
  EXPECT_EQ(l1.kv_bytes({1024}), 1024LL * 2 * 16 * 512 * 2);
  EXPECT_EQ(l1.kv_bytes({1, 2, 3}), 6LL * 2 * 16 * 512 * 2);
  EXPECT_EQ(l1.kv_bytes({}), 0);
  EXPECT_NE(error_of([&] { l1.kv_bytes({4, -1}); }).find("-1"), std::string::npos);
}

TEST(LlmConfig, ParsesLlama32Config) {
  const ModelConfig c = parse_hf_config(kLlama32_1B, "hub/Llama-3.2-1B");
  EXPECT_EQ(c.name, "hub/Llama-3.2-1B");
  EXPECT_EQ(c.family, ModelFamily::Llama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.num_q_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000);
  EXPECT_EQ(c.rope_factor, 32);
  EXPECT_EQ(c.rope_low_freq_factor, 1);
  EXPECT_EQ(c.rope_high_freq_factor, 4);
  EXPECT_EQ(c.rope_original_max_pos, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{128001});
  expect_same_model(c, named_config("llama-3.2-1b"));
}

TEST(LlmConfig, ParsesQwen2ConfigWithDefaults) {
  const ModelConfig c = parse_hf_config(kQwen2_05B, "qwen");
  EXPECT_EQ(c.family, ModelFamily::Qwen2);
  EXPECT_EQ(c.head_dim, 64);  // 896 / 14
  EXPECT_TRUE(c.qkv_bias);
  expect_same_model(c, named_config("qwen2-0.5b"));

  // Fields transformers defaults: num_key_value_heads = heads, head_dim = hidden / heads, eps 1e-6, theta 10000.
  const ModelConfig m = parse_hf_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "eos_token_id": [7, 8, 9]})",
                                        "minimal");
  EXPECT_EQ(m.family, ModelFamily::Llama);
  EXPECT_EQ(m.num_kv_heads, 4);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.rms_norm_eps, 1e-6);
  EXPECT_EQ(m.rope_theta, 10000);
  EXPECT_EQ(m.rope_factor, 0);
  EXPECT_EQ(m.max_position_embeddings, 2048);
  EXPECT_EQ(m.bos_token_id, -1);
  EXPECT_EQ(m.eos_token_ids, (std::vector<int64_t>{7, 8, 9}));
}

// transformers 5 saves rope_theta and the scaling inside rope_parameters.
TEST(LlmConfig, ParsesTransformers5RopeParameters) {
  std::string text = kLlama32_1B;
  const size_t a = text.find("\"rope_scaling\""), b = text.find("\"tie_word_embeddings\"");
  text.replace(a, b - a,
               R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                  )");
  expect_same_model(parse_hf_config(text, "v5"), named_config("llama-3.2-1b"));
  std::string plain = kQwen2_05B;
  plain.replace(plain.find("\"rope_theta\": 1000000.0"), 23,
                R"("rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0})");
  expect_same_model(parse_hf_config(plain, "v5"), named_config("qwen2-0.5b"));
}

TEST(LlmConfig, ParsesMistralAsLlamaWithItsWindow) {
  auto edited = [](const std::string& from, const std::string& to) {
    std::string t = kMistral7B;
    return t.replace(t.find(from), from.size(), to);
  };
  const ModelConfig c = parse_hf_config(kMistral7B, "mistral-7b");
  EXPECT_EQ(c.family, ModelFamily::Llama);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_factor, 0.0);
  // v0.2 and later: no window (null), the same as a Llama config.
  EXPECT_EQ(parse_hf_config(edited("\"sliding_window\": 4096", "\"sliding_window\": null"), "v0.3").sliding_window, 0);
  // Written back as a Mistral config, and read the same.
  const std::string text = hf_config_json(c);
  EXPECT_NE(text.find("MistralForCausalLM"), std::string::npos) << text;
  expect_same_model(parse_hf_config(text, "round-trip"), c);
  // Only Mistral configs carry a window: a Llama one's sliding_window field is not read.
  EXPECT_EQ(parse_hf_config(edited("\"mistral\"", "\"llama\""), "llama-typed").sliding_window, 0);
  const std::string e = error_of([&] { parse_hf_config(edited("\"sliding_window\": 4096", "\"sliding_window\": -3"), "bad"); });
  EXPECT_NE(e.find("sliding_window"), std::string::npos) << e;
}

TEST(LlmConfig, BadConfigsNameTheField) {
  auto without = [](const std::string& key) {
    std::string t = kLlama32_1B;
    const size_t a = t.find("\"" + key + "\"");
    const size_t b = t.find('\n', a);
    t.erase(a, b - a + 1);
    return t;
  };
  auto with = [](const std::string& key, const std::string& value) {
    std::string t = kLlama32_1B;
    const size_t a = t.find("\"" + key + "\"");
    const size_t colon = t.find(':', a), end = t.find_first_of(",\n", colon);
    t.replace(colon + 1, end - colon - 1, " " + value);
    return t;
  };
  auto expect_error = [](const std::string& text, std::initializer_list<const char*> words) {
    const std::string e = error_of([&] { parse_hf_config(text, "bad/config.json"); });
    EXPECT_NE(e.find("bad/config.json"), std::string::npos) << e;
    for (const char* w : words) EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' not in: " << e;
  };
  expect_error(without("hidden_size"), {"hidden_size", "missing"});
  expect_error(without("num_hidden_layers"), {"num_hidden_layers"});
  expect_error(with("hidden_act", "\"gelu\""), {"hidden_act", "gelu"});
  expect_error(with("num_key_value_heads", "5"), {"num_key_value_heads", "num_attention_heads", "5"});
  expect_error(with("hidden_size", "\"2048\""), {"hidden_size", "integer"});
  expect_error(with("mlp_bias", "true"), {"mlp_bias"});
  expect_error(with("attention_bias", "true"), {"attention_bias"});
  expect_error(with("model_type", "\"gemma\""), {"model_type", "gemma"});
  expect_error(with("head_dim", "63"), {"head_dim", "63"});
  expect_error(with("rms_norm_eps", "0"), {"rms_norm_eps"});
  expect_error("{\"model_type\": ", {"JSON"});
  expect_error("[1, 2]", {"object"});

  std::string yarn = kLlama32_1B;
  yarn.replace(yarn.find("\"llama3\""), 8, "\"yarn\"");
  expect_error(yarn, {"unsupported rope_scaling type 'yarn'"});
  std::string no_factor = kLlama32_1B;
  no_factor.erase(no_factor.find("\"factor\": 32.0,"), 15);
  expect_error(no_factor, {"rope_scaling.factor", "missing"});

  std::string sliding = kQwen2_05B;
  sliding.replace(sliding.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  expect_error(sliding, {"use_sliding_window"});
}

TEST(LlmConfig, ValidateNamesTheField) {
  ModelConfig c = named_config("tiny-llama");
  c.num_kv_heads = 3;
  std::string e = error_of([&] { c.validate(); });
  EXPECT_NE(e.find("num_kv_heads"), std::string::npos) << e;
  EXPECT_NE(e.find("tiny-llama"), std::string::npos) << e;
  c = named_config("tiny-llama");
  c.qkv_bias = true;
  EXPECT_NE(error_of([&] { c.validate(); }).find("qkv_bias"), std::string::npos);
  c = named_config("tiny-llama");
  c.rope_high_freq_factor = 0.5;
  EXPECT_NE(error_of([&] { c.validate(); }).find("high_freq_factor"), std::string::npos);
  c = named_config("tiny-qwen2");
  c.intermediate_size = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("intermediate_size"), std::string::npos);
}

TEST(LlmConfig, HfConfigJsonRoundTrips) {
  for (const std::string& name : named_config_names()) {
    const ModelConfig c = named_config(name);
    const std::string text = hf_config_json(c);
    const ModelConfig back = parse_hf_config(text, "round-trip");
    SCOPED_TRACE(name);
    expect_same_model(back, c);
    EXPECT_NE(text.find("\"bfloat16\""), std::string::npos);
    EXPECT_NE(text.find(c.family == ModelFamily::Qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"), std::string::npos);
  }
  ModelConfig multi = named_config("llama-3.1-8b");
  multi.eos_token_ids = {128001, 128008, 128009};
  expect_same_model(parse_hf_config(hf_config_json(multi), "multi-eos"), multi);
}

TEST(LlmConfig, LoadsFromFolderOrFile) {
  tw::test::TempDir dir;
  tw::test::write_text(dir / "config.json", kQwen2_05B);
  const ModelConfig a = load_hf_config(dir.path.string());
  EXPECT_EQ(a.name, dir.path.string());
  expect_same_model(a, named_config("qwen2-0.5b"));
  expect_same_model(load_hf_config(dir / "config.json"), a);
  EXPECT_EQ(load_hf_config(dir / "config.json").name, dir.path.string());
  // A lone config file is named by its path without ".json".
  tw::test::write_text(dir / "qwen2-0.5b-copy.json", kQwen2_05B);
  EXPECT_EQ(load_hf_config(dir / "qwen2-0.5b-copy.json").name, (dir.path / "qwen2-0.5b-copy").string());
  const std::string e = error_of([&] { load_hf_config(dir / "nothing"); });
  EXPECT_NE(e.find("nothing"), std::string::npos) << e;
}

// Default RoPE: theta^(-2i/D) in float32.
TEST(LlmConfig, RopeInvFreqDefault) {
  const ModelConfig c = named_config("qwen2-7b");
  const std::vector<float> f = c.rope_inv_freq();
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f[0], 1.0f);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(f[i], std::pow(1e6, -2.0 * i / 128), 2e-7 * std::pow(1e6, -2.0 * i / 128));
}

// llama3 scaling against the rule written out in double. For Llama-3.2-1B (D 64, theta 5e5, original 8192,
// factor 32) wavelength 2 pi 500000^(i/32) crosses 2048 between i = 14 and 15 and 8192 between 17 and 18: indices
// up to 14 keep their frequency, 15..17 are interpolated, 18 on are divided by 32.
TEST(LlmConfig, RopeInvFreqLlama3) {
  const ModelConfig c = named_config("llama-3.2-1b");
  const std::vector<float> f = c.rope_inv_freq();
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double want = llama3_inv_freq(i, 64, 500000, 32, 1, 4, 8192);
    EXPECT_NEAR(f[i], want, 2e-6 * want) << "index " << i;
  }
  const double plain14 = std::pow(500000.0, -28.0 / 64), plain18 = std::pow(500000.0, -36.0 / 64);
  EXPECT_NEAR(f[14], plain14, 1e-6 * plain14);
  EXPECT_NEAR(f[18], plain18 / 32, 1e-6 * plain18 / 32);
  for (int i : {15, 16, 17}) {  // strictly between the two rules
    const double plain = std::pow(500000.0, -2.0 * i / 64);
    EXPECT_LT(f[i], 0.999 * plain) << i;
    EXPECT_GT(f[i], 1.001 * plain / 32) << i;
  }
  // A hand-computed point: i = 16, f = 500000^-0.5 = 1.4142136e-3, wavelen = 2 pi / f = 4442.883,
  // s = (8192 / 4442.883 - 1) / 3 = 0.2812834, f' = (1 - s) f / 32 + s f = 0.3037433 f = 4.29558e-4.
  EXPECT_NEAR(f[16], 4.29558e-4, 5e-9);

  const ModelConfig t = named_config("tiny-llama");  // original 64: the bands sit at small indices
  const std::vector<float> g = t.rope_inv_freq();
  for (int i = 0; i < 32; ++i) {
    const double want = llama3_inv_freq(i, 64, 500000, 8, 1, 4, 64);
    EXPECT_NEAR(g[i], want, 2e-6 * want) << "index " << i;
  }
}
