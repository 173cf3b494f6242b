// tileweave-generate: greedy generation with the one-launch decode step (ops/decode_step.hpp), on a
// model folder (config.json + safetensors) or on random weights of a named config.
//
//   tileweave-generate --config llama-3.2-1b --batch 4 --prompt-len 16 --steps 128
//   tileweave-generate --model DIR --prompts prompts.json --steps 64 --dump out.json --dump-logits out.f32
//
// A prompt is consumed one token per step by the same kernel (a prefill that is correct, not fast);
// sequences whose prompts are shorter start generating earlier and the others wait (inactive), so
// lengths are ragged. Generated token n of a sequence is the argmax of the logits after its token
// n - 1 (its own, or teacher[b][n - 1] when a teacher is given). Once every prompt is consumed the
// steps run back to back with no host round trip; their time gives the per-step time and tokens/s.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tileweave/ops/decode_step.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace {

using tw::InvalidArgument;

std::vector<std::vector<int32_t>> read_lists(const nlohmann::json& j, const char* key, const std::string& file) {
  std::vector<std::vector<int32_t>> out;
  if (!j.contains(key)) return out;
  if (!j.at(key).is_array()) throw InvalidArgument(file + ": '" + key + "' is not a list of token lists");
  for (const auto& row : j.at(key)) {
    if (!row.is_array()) throw InvalidArgument(file + ": '" + key + "' is not a list of token lists");
    out.emplace_back();
    for (const auto& t : row) {
      if (!t.is_number_integer()) throw InvalidArgument(file + ": '" + key + "' holds " + t.dump() + ", not a token id");
      out.back().push_back(t.get<int32_t>());
    }
  }
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"tileweave-generate: greedy decoding with the one-launch decode step"};
  std::string model_dir, config_name, prompts_file, dump, dump_logits, layout = "contiguous";
  int batch = 1, prompt_len = 8, steps = 32, page_size = 16;
  int64_t max_seq_len = 0;
  uint64_t seed = 1;
  float init_std = 0.02f;
  auto* model_opt = app.add_option("--model", model_dir, "model folder: config.json + *.safetensors (transformers' names)");
  app.add_option("--config", config_name, "a named config with random weights (" +
                                              [] { std::string s; for (auto& n : tw::named_config_names()) s += (s.empty() ? "" : ", ") + n; return s; }() + ")")
      ->excludes(model_opt);
  app.add_option("--seed", seed, "random weights and prompts");
  app.add_option("--init-std", init_std, "standard deviation of random weights");
  auto* prompts_opt = app.add_option("--prompts", prompts_file, "JSON {\"prompts\": [[ids]...], \"teacher\": [[ids]...]}");
  app.add_option("--batch", batch, "sequences (with random prompts)")->excludes(prompts_opt);
  app.add_option("--prompt-len", prompt_len, "tokens per random prompt")->excludes(prompts_opt);
  app.add_option("--steps", steps, "tokens to generate per sequence")->required();
  app.add_option("--layout", layout, "KV cache: contiguous or paged")->check(CLI::IsMember({"contiguous", "paged"}));
  app.add_option("--page-size", page_size, "paged: tokens per page");
  app.add_option("--max-seq-len", max_seq_len, "cache capacity per sequence (default: longest prompt + steps)");
  app.add_option("--dump", dump, "write the generated tokens and timings as JSON");
  app.add_option("--dump-logits", dump_logits, "write float32 [steps][batch][vocab]: the logits each token was taken from");
  CLI11_PARSE(app, argc, argv);
  if (model_dir.empty() && config_name.empty()) throw InvalidArgument("give --model DIR or --config NAME");
  if (steps < 1) throw InvalidArgument("--steps " + std::to_string(steps) + " must be >= 1");

  const tw::ModelConfig cfg = model_dir.empty() ? tw::named_config(config_name) : tw::load_hf_config(model_dir);
  std::vector<std::vector<int32_t>> prompts, teacher;
  std::mt19937_64 rng(seed);
  if (!prompts_file.empty()) {
    std::ifstream in(prompts_file);
    if (!in) throw InvalidArgument("cannot read --prompts " + prompts_file);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw InvalidArgument(prompts_file + ": not JSON (" + e.what() + ")");
    }
    prompts = read_lists(j, "prompts", prompts_file);
    teacher = read_lists(j, "teacher", prompts_file);
    if (prompts.empty()) throw InvalidArgument(prompts_file + ": no prompts");
    if (!teacher.empty() && teacher.size() != prompts.size())
      throw InvalidArgument(prompts_file + ": " + std::to_string(teacher.size()) + " teacher lists for " +
                            std::to_string(prompts.size()) + " prompts");
  } else {
    if (prompt_len < 1) throw InvalidArgument("--prompt-len " + std::to_string(prompt_len) + " must be >= 1");
    prompts.assign(batch, {});
    for (auto& p : prompts)
      for (int i = 0; i < prompt_len; ++i) p.push_back(int32_t(rng() % cfg.vocab_size));
  }
  const int B = int(prompts.size());
  for (int b = 0; b < B; ++b) {
    if (prompts[b].empty()) throw InvalidArgument("prompt " + std::to_string(b) + " is empty");
    for (int32_t t : prompts[b])
      if (t < 0 || t >= cfg.vocab_size)
        throw InvalidArgument("prompt " + std::to_string(b) + " holds token " + std::to_string(t) + ", outside [0, " +
                              std::to_string(cfg.vocab_size) + ")");
    if (!teacher.empty() && int(teacher[b].size()) < steps - 1)
      throw InvalidArgument("teacher list " + std::to_string(b) + " has " + std::to_string(teacher[b].size()) +
                            " tokens; --steps " + std::to_string(steps) + " needs " + std::to_string(steps - 1));
  }
  std::vector<int> plen(B);
  for (int b = 0; b < B; ++b) plen[b] = int(prompts[b].size());
  const int longest = *std::max_element(plen.begin(), plen.end());
  const int total = longest + steps - 1;  // launches: the last sequence's prompt, then its steps - 1 more inputs

  tw::DecodeStepOptions opt;
  opt.batch = B;
  opt.max_seq_len = max_seq_len > 0 ? max_seq_len : total + 1;
  opt.layout = layout == "paged" ? tw::KvLayout::Paged : tw::KvLayout::Contiguous;
  opt.page_size = page_size;
  opt.keep_logits = !dump_logits.empty();
  opt.history = total;
  const auto t0 = std::chrono::steady_clock::now();
  tw::DecodeStep st(cfg, opt);
  if (model_dir.empty()) {
    st.random_weights(seed, init_std);
  } else {
    st.load_weights(tw::load_weights(tw::SafetensorsModel(model_dir), cfg));
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%s: %d layers, batch %d, %d launches (%d to consume the longest prompt), ready in %.1f s\n",
               cfg.name.c_str(), cfg.num_layers, B, total, longest, load_s);

  // Step s: sequence b is active while it has inputs left (its prompt, then steps - 1 tokens).
  // While any prompt or teacher token must go in, the host sets the inputs before each step.
  const int64_t V = cfg.vocab_size;
  std::vector<float> logits_out;
  if (opt.keep_logits) logits_out.assign(size_t(steps) * B * V, 0.f);
  cudaStream_t stream;
  TW_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  TW_CUDA_CHECK(cudaEventCreate(&e0));
  TW_CUDA_CHECK(cudaEventCreate(&e1));
  const bool host_driven_all = !teacher.empty() || opt.keep_logits;
  int timed_from = -1;
  std::vector<uint8_t> last_active;
  for (int s = 0; s < total; ++s) {
    std::vector<uint8_t> active(B);
    for (int b = 0; b < B; ++b) active[b] = s < plen[b] + steps - 1;
    if (active != last_active) st.set_active(active, stream), last_active = active;
    if (s < longest || host_driven_all) {
      std::vector<int32_t> in = st.tokens(stream);  // the tokens the last step sampled
      for (int b = 0; b < B; ++b)
        if (s < plen[b]) in[b] = prompts[b][s];
        else if (!teacher.empty() && active[b]) in[b] = teacher[b][s - plen[b]];
      st.set_tokens(in, stream);
    } else if (timed_from < 0) {
      timed_from = s;
      TW_CUDA_CHECK(cudaEventRecord(e0, stream));
    }
    st.step(stream);
    if (opt.keep_logits) {
      const std::vector<float> l = st.logits(stream);
      for (int b = 0; b < B; ++b) {
        const int n = s - (plen[b] - 1);  // the generated token these logits give
        if (n >= 0 && n < steps) std::copy_n(&l[size_t(b) * V], V, &logits_out[(size_t(n) * B + b) * V]);
      }
    }
  }
  TW_CUDA_CHECK(cudaEventRecord(e1, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (st.plan().error()) throw std::runtime_error("a bounded wait expired in the decode step");
  float ms = 0;
  if (timed_from >= 0) TW_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const int timed = timed_from >= 0 ? total - timed_from : 0;

  std::vector<std::vector<int32_t>> generated(B);
  for (int s = 0; s < total; ++s) {
    const std::vector<int32_t> h = st.history(s, stream);
    for (int b = 0; b < B; ++b) {
      const int n = s - (plen[b] - 1);
      if (n >= 0 && n < steps) generated[b].push_back(h[b]);
    }
  }
  nlohmann::json out;
  out["model"] = cfg.name;
  out["batch"] = B;
  out["prompt_lens"] = plen;
  out["steps"] = steps;
  out["layout"] = layout;
  out["generated"] = generated;
  out["launches"] = total;
  if (timed > 0) {
    out["timed_steps"] = timed;
    out["step_us"] = 1e3 * ms / timed;
    out["tokens_per_s"] = B * timed / (ms * 1e-3);
  }
  if (!dump.empty()) std::ofstream(dump) << out.dump(1) << "\n";
  if (!dump_logits.empty()) {
    std::ofstream f(dump_logits, std::ios::binary);
    f.write(reinterpret_cast<const char*>(logits_out.data()), std::streamsize(logits_out.size() * sizeof(float)));
  }
  for (int b = 0; b < std::min(B, 4); ++b) {
    std::printf("sequence %d:", b);
    for (size_t i = 0; i < std::min<size_t>(generated[b].size(), 16); ++i) std::printf(" %d", generated[b][i]);
    std::printf("%s\n", generated[b].size() > 16 ? " ..." : "");
  }
  if (timed > 0)
    std::printf("%d steps back to back: %.1f us per step, %.0f tokens/s (batch %d)\n", timed, 1e3 * ms / timed,
                B * timed / (ms * 1e-3), B);
  else
    std::printf("every step was host-driven (prompts, teacher or logits): no back-to-back timing\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "tileweave-generate: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tileweave-generate: %s\n", e.what());
    return 1;
  }
}
