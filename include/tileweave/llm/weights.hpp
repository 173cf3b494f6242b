// A model's weights on the host as bf16 bits under transformers' tensor names: the list a config implies, random
// weights for tests and benchmarks, loading from a model folder, and saving one transformers loads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tileweave/llm/bf16.hpp"  // bf16_to_float, float_to_bf16 (round to nearest even)
#include "tileweave/llm/config.hpp"
#include "tileweave/llm/safetensors.hpp"

namespace tw {

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// transformers' names and shapes, in the model's order: model.embed_tokens.weight [V, d]; per layer i
// model.layers.{i}.input_layernorm.weight [d], .self_attn.{q,k,v}_proj.weight [q_dim|kv_dim, d] (+ .bias when
// qkv_bias), .self_attn.o_proj.weight [d, q_dim], .post_attention_layernorm.weight [d], .mlp.{gate,up}_proj.weight
// [F, d], .mlp.down_proj.weight [d, F]; model.norm.weight [d]; lm_head.weight [V, d] unless tied.
std::vector<WeightSpec> expected_weights(const ModelConfig& c);

struct HostWeights {
  std::map<std::string, std::vector<uint16_t>> tensors;  // bf16 bits by name
  const std::vector<uint16_t>& at(const std::string& name) const;  // InvalidArgument naming a missing tensor
  const std::vector<uint16_t>& lm_head() const;  // lm_head.weight, or the embedding when there is none (tied)
  // Every expected tensor present with its size: InvalidArgument naming the first that is not.
  void check(const ModelConfig& c) const;
};

// Random weights: matrices, embedding and biases N(0, std) rounded to bf16; norm weights 1 + N(0, 0.1).
// Deterministic for a seed on every platform (std::mt19937_64 and our own polar method, not std::normal_distribution,
// whose algorithm the standard leaves open).
HostWeights random_weights(const ModelConfig& c, uint64_t seed, float stddev = 0.02f);
// Rank `rank`'s weights under tensor parallelism over tp ranks, for tensor_parallel_shard(c, tp): the
// rank's block of rows of q/k/v (its heads), gate/up, the embedding and the LM head, its block of
// columns of o_proj and down; norms whole. Summing the ranks' o_proj (down) outputs over their
// blocks of the attention output (h) gives the whole model's.
HostWeights tensor_parallel_weights(const HostWeights& w, const ModelConfig& c, int tp, int rank);
HostWeights load_weights(const SafetensorsModel& m, const ModelConfig& c);  // every expected tensor, shapes checked
// Writes folder/config.json (hf_config_json) and folder/model.safetensors (bf16, metadata format "pt"): a model
// folder transformers loads. Creates the folder if needed.
void save_model(const std::string& folder, const ModelConfig& c, const HostWeights& w);

}  // namespace tw
