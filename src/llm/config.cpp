#include "tileweave/llm/config.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tw {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Reads typed fields of one JSON object; every error names the origin and the field (with its path, e.g.
// rope_scaling.factor).
struct Fields {
  const json& j;
  const std::string& origin;
  std::string prefix;  // "" or "rope_scaling."

  [[noreturn]] void fail(const std::string& msg) const { throw InvalidArgument("config '" + origin + "': " + msg); }
  // A present, non-null value (transformers treats null as absent).
  const json* get(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  std::string path(const char* key) const { return prefix + key; }
  const json& required(const char* key) const {
    const json* v = get(key);
    if (!v) fail("field '" + path(key) + "' is missing");
    return *v;
  }
  // Integers may be written as integral floats (8192.0), as some exporters do.
  int64_t integer(const json& v, const char* key) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    fail("field '" + path(key) + "' must be an integer, got " + v.dump());
  }
  int64_t integer(const char* key) const { return integer(required(key), key); }
  int64_t integer(const char* key, int64_t dflt) const {
    const json* v = get(key);
    return v ? integer(*v, key) : dflt;
  }
  int small_int(const char* key, int64_t value) const {
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
      fail("field '" + path(key) + "' = " + std::to_string(value) + " is out of range");
    return static_cast<int>(value);
  }
  double number(const json& v, const char* key) const {
    if (!v.is_number()) fail("field '" + path(key) + "' must be a number, got " + v.dump());
    return v.get<double>();
  }
  double number(const char* key) const { return number(required(key), key); }
  double number(const char* key, double dflt) const {
    const json* v = get(key);
    return v ? number(*v, key) : dflt;
  }
  bool boolean(const char* key, bool dflt) const {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail("field '" + path(key) + "' must be true or false, got " + v->dump());
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_string()) fail("field '" + path(key) + "' must be a string, got " + v->dump());
    return v->get<std::string>();
  }
};

// Mistral is the Llama family's computation (no biases, silu, default RoPE) with an optional sliding window.
struct Family {
  ModelFamily family;
  bool mistral;
};
Family parse_family(const Fields& f) {
  if (f.get("model_type")) {
    const std::string t = f.string("model_type", "");
    if (t == "llama") return {ModelFamily::Llama, false};
    if (t == "mistral") return {ModelFamily::Llama, true};
    if (t == "qwen2") return {ModelFamily::Qwen2, false};
    f.fail("unsupported model_type '" + t + "' (supported: llama, mistral, qwen2)");
  }
  const json* a = f.get("architectures");
  if (!a) f.fail("field 'model_type' is missing (and there is no 'architectures' list)");
  if (!a->is_array() || a->empty() || !(*a)[0].is_string())
    f.fail("field 'architectures' must be a non-empty list of strings, got " + a->dump());
  const std::string arch = (*a)[0].get<std::string>();
  if (arch == "LlamaForCausalLM") return {ModelFamily::Llama, false};
  if (arch == "MistralForCausalLM") return {ModelFamily::Llama, true};
  if (arch == "Qwen2ForCausalLM") return {ModelFamily::Qwen2, false};
  f.fail("unsupported architecture '" + arch + "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
}

// rope_theta and the llama3 scaling. transformers 4.x writes rope_theta + rope_scaling; 5.x writes rope_parameters
// (rope_type, rope_theta and the scaling fields in one object) and, reading, lets rope_scaling win when both are
// there: so do we.
void parse_rope(const Fields& f, ModelConfig& c) {
  c.rope_theta = f.number("rope_theta", 10000.0);
  const char* key = f.get("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const json* rs = f.get(key);
  if (!rs) return;
  if (!rs->is_object()) f.fail("field '" + std::string(key) + "' must be an object or null, got " + rs->dump());
  const Fields s{*rs, f.origin, std::string(key) + "."};
  if (s.get("rope_theta")) c.rope_theta = s.number("rope_theta");
  const std::string type = s.get("rope_type") ? s.string("rope_type", "") : s.string("type", "default");
  if (type == "default") return;
  if (type != "llama3") f.fail("unsupported " + std::string(key) + " type '" + type + "' (supported: default, llama3)");
  c.rope_factor = s.number("factor");
  c.rope_low_freq_factor = s.number("low_freq_factor");
  c.rope_high_freq_factor = s.number("high_freq_factor");
  c.rope_original_max_pos = s.integer("original_max_position_embeddings");
}

std::vector<int64_t> parse_eos(const Fields& f) {
  const json* v = f.get("eos_token_id");
  if (!v) return {};
  if (!v->is_array()) return {f.integer(*v, "eos_token_id")};
  std::vector<int64_t> ids;
  for (const json& x : *v) ids.push_back(f.integer(x, "eos_token_id"));
  return ids;
}

}  // namespace

const char* to_string(ModelFamily f) { return f == ModelFamily::Qwen2 ? "qwen2" : "llama"; }

int64_t ModelConfig::parameter_count() const {
  const int64_t d = hidden_size, F = intermediate_size, V = vocab_size;
  const int64_t per_layer = 2 * d                               // input and post-attention norms
                            + d * q_dim() + 2 * d * kv_dim()    // q, k, v
                            + q_dim() * d                       // o
                            + 3 * d * F                         // gate, up, down
                            + (qkv_bias ? q_dim() + 2 * kv_dim() : 0);
  return V * d + int64_t{num_layers} * per_layer + d + (tie_word_embeddings ? 0 : V * d);
}

int64_t ModelConfig::decode_weight_bytes() const {
  // Every parameter but the embedding table, plus the LM head: when tied the table is the LM head and counted once.
  return 2 * (parameter_count() - (tie_word_embeddings ? 0 : vocab_size * hidden_size));
}

int64_t ModelConfig::kv_bytes(const std::vector<int>& seq_lens) const {
  int64_t tokens = 0;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    if (seq_lens[b] < 0)
      throw InvalidArgument("kv_bytes: sequence " + std::to_string(b) + " has negative length " +
                            std::to_string(seq_lens[b]));
    tokens += seq_lens[b];
  }
  return tokens * 2 /* K and V */ * num_layers * kv_dim() * 2 /* bf16 */;
}

// transformers builds inv_freq with float32 tensor ops; each step below is one such op, rounded to float as it is.
// (pow is computed in double and rounded once: torch's vectorised powf is within 1 ulp of that. x86-64 compiles
// these without FMA contraction, which would skip roundings torch does.)
std::vector<float> ModelConfig::rope_inv_freq() const {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  const float base = static_cast<float>(rope_theta);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);  // arange(0, D, 2).float() / D
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv[i] = 1.0f / p;
  }
  if (rope_factor == 0) return inv;
  // Python scalars meet float32 tensors: each is cast to float32 at the op that uses it.
  const float factor = static_cast<float>(rope_factor);
  const float low = static_cast<float>(rope_low_freq_factor);
  const float old_len = static_cast<float>(rope_original_max_pos);
  const float low_wavelen = static_cast<float>(static_cast<double>(rope_original_max_pos) / rope_low_freq_factor);
  const float high_wavelen = static_cast<float>(static_cast<double>(rope_original_max_pos) / rope_high_freq_factor);
  const float span = static_cast<float>(rope_high_freq_factor - rope_low_freq_factor);
  const float two_pi = static_cast<float>(2 * 3.14159265358979323846);
  for (int i = 0; i < half; ++i) {
    const float f = inv[i];
    const float wavelen = (1.0f / f) * two_pi;  // `2 * math.pi / t` is t.reciprocal() * (2 pi) in torch
    // Long wavelengths (low frequencies) are divided by the factor, short ones kept, the band between interpolated.
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const float smooth = ((1.0f / wavelen) * old_len - low) / span;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    inv[i] = medium ? smoothed : scaled;
  }
  return inv;
}

void ModelConfig::validate() const {
  auto fail = [&](const std::string& msg) { throw InvalidArgument("model config '" + name + "': " + msg); };
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(std::string(field) + " must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_layers (num_hidden_layers)", num_layers);
  positive("num_q_heads (num_attention_heads)", num_q_heads);
  positive("num_kv_heads (num_key_value_heads)", num_kv_heads);
  positive("head_dim", head_dim);
  positive("max_position_embeddings", max_position_embeddings);
  if (head_dim % 2)
    fail("head_dim must be even (RoPE rotates pairs), got " + std::to_string(head_dim));
  if (num_q_heads % num_kv_heads)
    fail("num_q_heads (num_attention_heads) " + std::to_string(num_q_heads) +
         " is not a multiple of num_kv_heads (num_key_value_heads) " + std::to_string(num_kv_heads));
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    fail("rms_norm_eps must be positive, got " + to_text(rms_norm_eps));
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) fail("rope_theta must be positive, got " + to_text(rope_theta));
  if (rope_factor != 0) {
    if (!(rope_factor > 0) || !std::isfinite(rope_factor))
      fail("rope_scaling.factor must be positive (or 0 for none), got " + to_text(rope_factor));
    if (!(rope_low_freq_factor > 0) || !(rope_high_freq_factor > rope_low_freq_factor))
      fail("rope_scaling needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor " +
           to_text(rope_low_freq_factor) + " and high_freq_factor " + to_text(rope_high_freq_factor));
    positive("rope_scaling.original_max_position_embeddings", rope_original_max_pos);
  }
  if (family == ModelFamily::Llama && qkv_bias)
    fail("qkv_bias on a llama model is not supported (transformers' attention_bias also adds an o_proj bias)");
  if (sliding_window < 0) fail("sliding_window must be positive (or 0 for none), got " + std::to_string(sliding_window));
  if (sliding_window > 0 && family != ModelFamily::Llama) fail("a sliding window is read for mistral configs only");
}

ModelConfig parse_hf_config(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw InvalidArgument("config '" + origin + "': not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw InvalidArgument("config '" + origin + "': the top level is not a JSON object");
  const Fields f{j, origin, ""};

  ModelConfig c;
  c.name = origin;
  const Family fam = parse_family(f);
  c.family = fam.family;
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act '" + act + "' is not supported (only silu)");
  if (f.boolean("mlp_bias", false)) f.fail("mlp_bias true is not supported");
  if (c.family == ModelFamily::Llama && f.boolean("attention_bias", false))
    f.fail("attention_bias true is not supported (it adds an o_proj bias this library does not model)");
  if (c.family == ModelFamily::Qwen2 && f.boolean("use_sliding_window", false))
    f.fail("use_sliding_window true is not supported");

  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_layers = f.small_int("num_hidden_layers", f.integer("num_hidden_layers"));
  c.num_q_heads = f.small_int("num_attention_heads", f.integer("num_attention_heads"));
  c.num_kv_heads = f.small_int("num_key_value_heads", f.integer("num_key_value_heads", c.num_q_heads));
  if (c.num_q_heads <= 0) f.fail("num_attention_heads must be positive, got " + std::to_string(c.num_q_heads));
  c.head_dim = f.small_int("head_dim", f.integer("head_dim", c.hidden_size / c.num_q_heads));
  // transformers' defaults where the file says nothing (both families default eps to 1e-6).
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.integer("max_position_embeddings", c.family == ModelFamily::Qwen2 ? 32768 : 2048);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.qkv_bias = c.family == ModelFamily::Qwen2;
  // Mistral v0.1 attends to the last 4096 positions only; later versions write null.
  const json* window = fam.mistral ? f.get("sliding_window") : nullptr;
  c.sliding_window = window && !window->is_null() ? f.integer(*window, "sliding_window") : 0;
  parse_rope(f, c);
  c.bos_token_id = f.integer("bos_token_id", -1);
  c.eos_token_ids = parse_eos(f);
  c.validate();
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path file = is_dir ? fs::path(path) / "config.json" : fs::path(path);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InvalidArgument("cannot read model config '" + file.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  ModelConfig c = parse_hf_config(text.str(), file.string());
  // A model folder's name, or a lone config file's path without ".json" (bench/configs/qwen2.5-3b).
  c.name = is_dir ? path
           : file.filename() == "config.json" ? file.parent_path().string()
                                              : (file.parent_path() / file.stem()).string();
  if (c.name.empty()) c.name = ".";
  return c;
}

ModelConfig named_config(const std::string& name) {
  ModelConfig c;
  c.name = name;
  auto llama3 = [&](double factor, int64_t original) {
    c.rope_factor = factor;
    c.rope_low_freq_factor = 1;
    c.rope_high_freq_factor = 4;
    c.rope_original_max_pos = original;
  };
  if (name == "llama-3.2-1b" || name == "llama-3-8b" || name == "llama-3.1-8b" || name == "llama-3-70b") {
    c.family = ModelFamily::Llama;
    c.vocab_size = 128256;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001};
    c.num_q_heads = 32;
    c.num_kv_heads = 8;
    if (name == "llama-3.2-1b") {
      c.hidden_size = 2048, c.intermediate_size = 8192, c.num_layers = 16, c.head_dim = 64;
      llama3(32, 8192);
      c.max_position_embeddings = 131072;
      c.tie_word_embeddings = true;
    } else if (name == "llama-3-70b") {
      c.hidden_size = 8192, c.intermediate_size = 28672, c.num_layers = 80, c.head_dim = 128;
      c.num_q_heads = 64;
      c.max_position_embeddings = 8192;
    } else {
      c.hidden_size = 4096, c.intermediate_size = 14336, c.num_layers = 32, c.head_dim = 128;
      c.max_position_embeddings = 8192;
      if (name == "llama-3.1-8b") {
        llama3(8, 8192);
        c.max_position_embeddings = 131072;
      }
    }
  } else if (name == "qwen2-0.5b" || name == "qwen2-7b") {
    c.family = ModelFamily::Qwen2;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000;
    c.max_position_embeddings = 32768;
    c.qkv_bias = true;
    c.bos_token_id = 151643;
    c.eos_token_ids = {151643};
    if (name == "qwen2-0.5b") {
      c.vocab_size = 151936, c.hidden_size = 896, c.intermediate_size = 4864, c.num_layers = 24;
      c.num_q_heads = 14, c.num_kv_heads = 2, c.head_dim = 64;
      c.tie_word_embeddings = true;
    } else {
      c.vocab_size = 152064, c.hidden_size = 3584, c.intermediate_size = 18944, c.num_layers = 28;
      c.num_q_heads = 28, c.num_kv_heads = 4, c.head_dim = 128;
    }
  } else if (name == "tiny-llama") {
    // Small enough for the CPU reference in unit tests, with GQA and llama3 scaling whose bands all occur at
    // head_dim 64 (original_max_pos 64 puts wavelengths on both sides of 16..64).
    c.family = ModelFamily::Llama;
    c.vocab_size = 512, c.hidden_size = 256, c.intermediate_size = 640, c.num_layers = 2;
    c.num_q_heads = 8, c.num_kv_heads = 2, c.head_dim = 64;
    c.rms_norm_eps = 1e-5, c.rope_theta = 500000;
    llama3(8, 64);
    c.max_position_embeddings = 4096;
    c.bos_token_id = 1, c.eos_token_ids = {2};
  } else if (name == "tiny-qwen2") {
    // Odd on purpose: hidden 320 is not a multiple of 128, q_dim 448 != hidden, 7 query heads on one KV head.
    c.family = ModelFamily::Qwen2;
    c.vocab_size = 600, c.hidden_size = 320, c.intermediate_size = 704, c.num_layers = 2;
    c.num_q_heads = 7, c.num_kv_heads = 1, c.head_dim = 64;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1000000;
    c.max_position_embeddings = 4096;
    c.tie_word_embeddings = true;
    c.qkv_bias = true;
    c.bos_token_id = 1, c.eos_token_ids = {2};
  } else {
    throw InvalidArgument("unknown model config '" + name + "' (known: " + join(named_config_names()) + ")");
  }
  c.validate();
  return c;
}

std::vector<std::string> named_config_names() {
  return {"llama-3.2-1b", "llama-3-8b", "llama-3.1-8b", "llama-3-70b", "qwen2-0.5b", "qwen2-7b", "tiny-llama", "tiny-qwen2"};
}

ModelConfig tensor_parallel_shard(const ModelConfig& c, int tp) {
  c.validate();
  if (tp < 1) throw InvalidArgument("tensor-parallel ranks " + std::to_string(tp) + " must be >= 1");
  auto need = [&](int64_t v, const char* what) {
    if (v % tp)
      throw InvalidArgument(std::string(what) + " " + std::to_string(v) + " is not divisible by " + std::to_string(tp) +
                            " tensor-parallel ranks");
  };
  need(c.num_kv_heads, "num_kv_heads");
  need(c.num_q_heads, "num_q_heads");
  need(c.intermediate_size, "intermediate_size");
  need(c.vocab_size, "vocab_size");
  ModelConfig s = c;
  if (tp == 1) return s;
  s.name = c.name + "/tp" + std::to_string(tp);
  s.num_q_heads /= tp, s.num_kv_heads /= tp;
  s.intermediate_size /= tp;
  s.vocab_size /= tp;
  s.validate();
  return s;
}

std::string hf_config_json(const ModelConfig& c) {
  c.validate();
  const bool qwen = c.family == ModelFamily::Qwen2;
  ordered_json j;
  const bool mistral = c.sliding_window > 0;  // (the one Llama-family field llama configs lack)
  j["architectures"] = ordered_json::array({qwen ? "Qwen2ForCausalLM" : mistral ? "MistralForCausalLM" : "LlamaForCausalLM"});
  j["model_type"] = mistral ? "mistral" : to_string(c.family);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_q_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  // 4.x reads rope_theta + rope_scaling; 5.x reads either those or rope_parameters. All three say the same thing.
  j["rope_theta"] = c.rope_theta;
  ordered_json params;
  params["rope_type"] = c.rope_factor != 0 ? "llama3" : "default";
  params["rope_theta"] = c.rope_theta;
  if (c.rope_factor != 0) {
    ordered_json s;
    s["rope_type"] = "llama3";
    s["factor"] = c.rope_factor;
    s["low_freq_factor"] = c.rope_low_freq_factor;
    s["high_freq_factor"] = c.rope_high_freq_factor;
    s["original_max_position_embeddings"] = c.rope_original_max_pos;
    j["rope_scaling"] = s;
    for (auto it = s.begin(); it != s.end(); ++it) params[it.key()] = it.value();
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_parameters"] = params;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (qwen) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  } else if (mistral) {
    j["sliding_window"] = c.sliding_window;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["bos_token_id"] = c.bos_token_id >= 0 ? ordered_json(c.bos_token_id) : ordered_json(nullptr);
  if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids[0];
  else
    j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = "bfloat16";  // transformers 4.x's key; 5.x renamed it dtype and still reads this one
  j["dtype"] = "bfloat16";
  return j.dump(2) + "\n";
}

}  // namespace tw
