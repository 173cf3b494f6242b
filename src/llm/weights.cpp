#include "tileweave/llm/weights.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

namespace tw {

namespace {

// Standard normal samples from mt19937_64 by Marsaglia's polar method (two per accepted pair; no sin/cos, so about
// twice as fast as Box-Muller).
class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  float operator()() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = static_cast<double>(rng_() >> 11) * 0x1.0p-52 - 1.0;  // uniform in [-1, 1)
      v = static_cast<double>(rng_() >> 11) * 0x1.0p-52 - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = static_cast<float>(v * f);
    have_spare_ = true;
    return static_cast<float>(u * f);
  }

 private:
  std::mt19937_64 rng_;
  float spare_ = 0;
  bool have_spare_ = false;
};

// input_layernorm, post_attention_layernorm and the final model.norm.
bool is_norm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

}  // namespace

int64_t WeightSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<WeightSpec> expected_weights(const ModelConfig& c) {
  c.validate();
  const int64_t d = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, q = c.q_dim(), kv = c.kv_dim();
  std::vector<WeightSpec> w;
  w.push_back({"model.embed_tokens.weight", {V, d}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w.push_back({p + "input_layernorm.weight", {d}});
    w.push_back({p + "self_attn.q_proj.weight", {q, d}});
    if (c.qkv_bias) w.push_back({p + "self_attn.q_proj.bias", {q}});
    w.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    if (c.qkv_bias) w.push_back({p + "self_attn.k_proj.bias", {kv}});
    w.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    if (c.qkv_bias) w.push_back({p + "self_attn.v_proj.bias", {kv}});
    w.push_back({p + "self_attn.o_proj.weight", {d, q}});
    w.push_back({p + "post_attention_layernorm.weight", {d}});
    w.push_back({p + "mlp.gate_proj.weight", {F, d}});
    w.push_back({p + "mlp.up_proj.weight", {F, d}});
    w.push_back({p + "mlp.down_proj.weight", {d, F}});
  }
  w.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings) w.push_back({"lm_head.weight", {V, d}});
  return w;
}

const std::vector<uint16_t>& HostWeights::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end())
    throw InvalidArgument("weight tensor '" + name + "' is missing (" + std::to_string(tensors.size()) + " present)");
  return it->second;
}

const std::vector<uint16_t>& HostWeights::lm_head() const {
  auto it = tensors.find("lm_head.weight");
  return it != tensors.end() ? it->second : at("model.embed_tokens.weight");
}

void HostWeights::check(const ModelConfig& c) const {
  for (const WeightSpec& s : expected_weights(c)) {
    const std::vector<uint16_t>& t = at(s.name);
    if (static_cast<int64_t>(t.size()) != s.numel())
      throw InvalidArgument("weight tensor '" + s.name + "' has " + std::to_string(t.size()) + " elements, shape " +
                            shape_string(s.shape) + " needs " + std::to_string(s.numel()));
  }
}

HostWeights random_weights(const ModelConfig& c, uint64_t seed, float stddev) {
  if (!(stddev >= 0) || !std::isfinite(stddev))
    throw InvalidArgument("random_weights: stddev must be >= 0, got " + std::to_string(stddev));
  Normal normal(seed);
  HostWeights w;
  for (const WeightSpec& s : expected_weights(c)) {
    std::vector<uint16_t> t(static_cast<size_t>(s.numel()));
    // Norm weights near 1 but not all 1, so a kernel that skips the weight multiply fails a test.
    if (is_norm(s.name))
      for (auto& x : t) x = float_to_bf16(1.0f + 0.1f * normal());
    else
      for (auto& x : t) x = float_to_bf16(stddev * normal());
    w.tensors.emplace(s.name, std::move(t));
  }
  return w;
}

HostWeights tensor_parallel_weights(const HostWeights& w, const ModelConfig& c, int tp, int rank) {
  const ModelConfig s = tensor_parallel_shard(c, tp);
  if (rank < 0 || rank >= tp)
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(tp) + ")");
  w.check(c);
  std::map<std::string, std::vector<int64_t>> full;
  for (const WeightSpec& f : expected_weights(c)) full[f.name] = f.shape;
  HostWeights out;
  // Every split is into tp equal blocks of whole heads, columns or vocabulary rows: the rank's block of a
  // dimension the shard has smaller starts at rank x the shard's extent.
  for (const WeightSpec& p : expected_weights(s)) {
    const std::vector<uint16_t>& t = w.at(p.name);
    const std::vector<int64_t>& fs = full.at(p.name);
    std::vector<uint16_t> part(static_cast<size_t>(p.numel()));
    const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1, full_cols = fs.size() > 1 ? fs[1] : 1;
    const int64_t r0 = rows < fs[0] ? rank * rows : 0, c0 = cols < full_cols ? rank * cols : 0;
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(t.begin() + (r0 + r) * full_cols + c0, cols, part.begin() + r * cols);
    out.tensors.emplace(p.name, std::move(part));
  }
  return out;
}

HostWeights load_weights(const SafetensorsModel& m, const ModelConfig& c) {
  HostWeights w;
  for (const WeightSpec& s : expected_weights(c)) w.tensors.emplace(s.name, m.read_bf16(s.name, s.shape));
  return w;
}

void save_model(const std::string& folder, const ModelConfig& c, const HostWeights& w) {
  namespace fs = std::filesystem;
  w.check(c);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw InvalidArgument("cannot create model folder '" + folder + "' (" + ec.message() + ")");
  {
    const fs::path p = fs::path(folder) / "config.json";
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << hf_config_json(c);
    out.close();
    if (!out) throw InvalidArgument("cannot write '" + p.string() + "'");
  }
  std::vector<TensorToWrite> tensors;
  for (const WeightSpec& s : expected_weights(c))
    tensors.push_back({s.name, DType::BF16, s.shape, w.at(s.name).data()});
  // transformers refuses safetensors files whose metadata lacks format "pt" (or tf/flax/mlx).
  write_safetensors((fs::path(folder) / "model.safetensors").string(), tensors, {{"format", "pt"}});
}

}  // namespace tw
