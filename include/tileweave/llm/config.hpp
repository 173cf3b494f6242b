// The shape of a Llama / Qwen2 decoder-only model: named presets, transformers' config.json read and written,
// and the sizes a decode step moves (weights, KV cache). Host only, no CUDA; C++17 so .cu files may include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

enum class ModelFamily { Llama, Qwen2 };
const char* to_string(ModelFamily f);  // "llama" | "qwen2" (transformers' model_type)

struct ModelConfig {
  std::string name;  // preset name, or the folder it was read from
  ModelFamily family = ModelFamily::Llama;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int num_layers = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000;
  // Llama-3 frequency scaling (HF rope_scaling with rope_type/type "llama3"); rope_factor 0: none.
  double rope_factor = 0, rope_low_freq_factor = 1, rope_high_freq_factor = 4;
  int64_t rope_original_max_pos = 8192;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // q/k/v projections carry biases. Qwen2 always; a Llama checkpoint with attention_bias also has an o_proj bias,
  // which this library does not model, so validate() refuses qkv_bias on the Llama family.
  bool qkv_bias = false;
  // Attention to the last sliding_window positions only (Mistral v0.1: 4096); 0: none. The decode step runs
  // caches that never outgrow it (max_seq_len <= sliding_window), where the window changes nothing.
  int64_t sliding_window = 0;
  // Special tokens, only carried through config.json (-1 / empty: none). Llama-3.1 instruct lists several eos ids.
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;

  int64_t q_dim() const { return int64_t{num_q_heads} * head_dim; }
  int64_t kv_dim() const { return int64_t{num_kv_heads} * head_dim; }
  int64_t parameter_count() const;  // all parameters (embedding and lm_head once if tied)
  // Bytes of weights one decode step reads: every layer's matrices, norms and biases, the final norm and the
  // LM head matrix (which is the embedding matrix when tied). The embedding rows gathered for the input tokens are
  // not counted (a few KB).
  int64_t decode_weight_bytes() const;  // bf16
  // KV-cache bytes one decode step reads for sequences of the given lengths (K and V, all layers, bf16).
  int64_t kv_bytes(const std::vector<int>& seq_lens) const;
  // head_dim/2 inverse frequencies as transformers computes them in float32 (default rope and the "llama3"
  // scaling: wavelen thresholds from low/high_freq_factor and original_max_position_embeddings, smooth
  // interpolation in between).
  std::vector<float> rope_inv_freq() const;
  void validate() const;  // InvalidArgument naming the field and value
};

// A transformers config.json's text. `origin` names the source in errors (and becomes the config's name).
// model_type "llama" | "mistral" | "qwen2" (or architectures LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM;
// Mistral is the Llama family with sliding_window, null or a position count); hidden_act must be "silu";
// rope_scaling (or transformers 5's rope_parameters) null, "default" or "llama3". Fields transformers defaults
// (num_key_value_heads, head_dim, rms_norm_eps, rope_theta, max_position_embeddings, tie_word_embeddings) take
// transformers' defaults when absent; the shape fields are required.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& origin);
ModelConfig load_hf_config(const std::string& path);  // a config.json file, or a folder holding one
ModelConfig named_config(const std::string& name);    // InvalidArgument listing the known names when unknown
std::vector<std::string> named_config_names();
// One rank's shard of the model under tensor parallelism over tp ranks, as a model of its own: the
// query and KV heads (column-parallel q|k|v, row-parallel o_proj), the FFN columns (column-parallel
// gate/up, row-parallel down) and the vocabulary (embedding and LM head) split tp ways; hidden size,
// layers and norms whole. Every layer's o_proj and down then end in an all-reduce of the B x hidden
// stream (step_collectives). InvalidArgument naming a count tp does not divide.
ModelConfig tensor_parallel_shard(const ModelConfig& c, int tp);
// A config.json that transformers (4.4x and 5.x) loads as the same model: architectures, model_type,
// torch_dtype/dtype "bfloat16", hidden_act "silu", rope_theta + rope_scaling (+ rope_parameters for 5.x),
// head_dim, bos/eos ids, ...
std::string hf_config_json(const ModelConfig& c);

}  // namespace tw
