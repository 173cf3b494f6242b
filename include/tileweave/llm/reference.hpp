// A straightforward CPU implementation of the Llama/Qwen2 decode step with a KV cache: the reference the GPU decode
// step is tested against. It rounds to bf16 where transformers' bf16 model does, and only there:
//   - the embedding rows and the residual stream after each add (x + attn, x + mlp);
//   - RMSNorm: x * rsqrt(mean(x^2) + eps) in float, rounded, times the weight, rounded;
//   - q, k, v after the projection (bias added before the one rounding);
//   - RoPE: cos/sin of the float32 angle rounded (transformers casts them to the model dtype), then q*cos and
//     rotate_half(q)*sin each rounded, and their sum rounded;
//   - attention as flash attention computes it (torch SDPA, transformers' default, on a GPU; also our decode
//     kernel): scores q.k * 1/sqrt(D) and the softmax in float, the unnormalised weights exp(s - max) rounded to
//     bf16 for the product with V, the float sum of those weights (unrounded) dividing the result, which is
//     rounded. (transformers' "eager" path rounds the scores and the normalised probabilities instead.)
//   - o_proj, gate, up and down outputs; silu(gate) rounded, then times up, rounded (LlamaMLP:
//     down_proj(act_fn(gate_proj(x)) * up_proj(x)), each op a bf16 tensor);
//   - the logits.
// Dot products accumulate in double (as exact as it gets; a GPU's float accumulation differs far below bf16's step).
// Single-threaded: the tests use small configs.
#pragma once

#include <cstdint>
#include <vector>

#include "tileweave/llm/config.hpp"
#include "tileweave/llm/weights.hpp"

namespace tw {

// Bf16: rounded as above (transformers' bf16 model). Fp32: rounded nowhere (the weights stay bf16): the
// higher-precision reference whose distance to Bf16 says how much rounding alone moves the logits.
enum class ReferencePrecision { Bf16, Fp32 };

class ReferenceDecoder {
 public:
  // Keeps a pointer to `w`, which must outlive the decoder. InvalidArgument when a weight is missing or mis-sized, or
  // batch / max_seq_len are not positive.
  ReferenceDecoder(const ModelConfig& c, const HostWeights& w, int batch, int max_seq_len,
                   ReferencePrecision precision = ReferencePrecision::Bf16);
  // One step: sequence b's token tokens[b] sits at position lengths()[b]; its k/v are appended to its cache and
  // lengths()[b] grows by one. Sequences with active[b] == 0 are skipped (their logits rows are left 0, their cache
  // and length unchanged); empty `active` means all. Returns logits [batch][vocab] (float, the bf16-rounded values).
  std::vector<float> step(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& active = {});
  const std::vector<int>& lengths() const { return lengths_; }
  const ModelConfig& config() const { return c_; }
  int batch() const { return batch_; }
  int max_seq_len() const { return max_seq_len_; }
  // Sequence b's cache in layer `layer`: [max_seq_len][kv_dim] (KV head-major inside a row), the first lengths()[b]
  // rows filled with bf16 values (K after RoPE).
  const float* k_cache(int layer, int b) const { return &k_cache_[cache_offset(layer, b)]; }
  const float* v_cache(int layer, int b) const { return &v_cache_[cache_offset(layer, b)]; }

 private:
  size_t cache_offset(int layer, int b) const;
  ModelConfig c_;
  const HostWeights* w_;
  int batch_, max_seq_len_;
  ReferencePrecision precision_;
  std::vector<int> lengths_;
  std::vector<float> inv_freq_;
  std::vector<float> k_cache_, v_cache_;  // [layer][batch][max_seq_len][kv_dim]
};

// The same model without a cache: logits [tokens.size()][vocab] of every position of one sequence (a causal forward
// over the whole token list, layer by layer), an independent path the cached decoder is tested against.
std::vector<float> reference_forward(const ModelConfig& c, const HostWeights& w, const std::vector<int32_t>& tokens,
                                     ReferencePrecision precision = ReferencePrecision::Bf16);

// The same forward under tensor parallelism over tp ranks, one process standing in for all of them:
// each rank runs its shard (tensor_parallel_shard, tensor_parallel_weights) and the all-reduces are sums
// -- the embedding's (vocabulary-parallel: the rank holding a token's row gives it), o_proj's and
// down's partial outputs before the residual adds -- and the LM head's vocabulary blocks are gathered.
// At Fp32 it matches reference_forward to float rounding (the sums only change the order of additions);
// at Bf16 each rank's partial output is rounded before the sum.
std::vector<float> reference_forward_tp(const ModelConfig& c, const HostWeights& w, const std::vector<int32_t>& tokens,
                                        int tp, ReferencePrecision precision = ReferencePrecision::Fp32);

// The building blocks, exposed so tests can check them against textbook formulas.
// RMSNorm of x[0, n) into out (may alias x), rounded as described above.
void reference_rms_norm(const float* x, const uint16_t* weight, int64_t n, double eps, float* out);
// Rotate-half RoPE of one head vector x[0, head_dim) at position pos, in place: (x[i], x[i + D/2]) rotated by
// pos * inv_freq[i], rounded as described above.
void reference_rope(float* x, int head_dim, int64_t pos, const std::vector<float>& inv_freq);

}  // namespace tw
