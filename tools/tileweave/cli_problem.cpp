#include "cli_problem.hpp"

#include <CLI/CLI.hpp>
#include <cctype>
#include <fmt/format.h>

#include "tileweave/graph/attention_graph.hpp"
#include "tileweave/graph/dit_graph.hpp"
#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/model/presets.hpp"

namespace tw::cli {

void add_problem_options(CLI::App& cmd, ProblemOptions& o) {
  cmd.add_option("--model", o.model, "FFN preset: llama3-8b | llama3-70b | chain")->capture_default_str();
  cmd.add_option("--m", o.m, "rows (tokens) M")->capture_default_str();
  cmd.add_option("--d", o.d, "hidden size, overriding the model preset's");
  cmd.add_option("--ffn", o.ffn, "intermediate size, overriding the model preset's");
  cmd.add_option("--gemm", o.gemm, "one GEMM MxNxK instead of a model FFN");
  cmd.add_option("--attention", o.attention,
                 "decode attention -> o_proj BxL (Llama-3-8B: 32/8 heads, d 128, hidden 4096; B sequences of L "
                 "tokens) instead of a model FFN, tiled as the GPU executor runs it");
  cmd.add_option("--dit", o.dit,
                 "the attention half of a DiT block HxL (H heads of 128, L tokens: QKV projection with per-head "
                 "RMSNorm and RoPE in its epilogue, attention, output projection) instead of a model FFN");
  cmd.add_option("--tile", o.tile, "tile BMxBNxBK (default 128x128x64, clipped to the problem)");
  cmd.add_option("--split-k", o.split_k, "K slices of the last GEMM")->capture_default_str();
  cmd.add_option("--gpu", o.gpu, "GPU preset: h100 | h200 | a100, or a preset JSON file (bench/l2_probe writes one)")
      ->capture_default_str();
  cmd.add_option("--cache", o.cache, "cache capacity S, overriding the GPU's L2 (e.g. 60MiB, 512KiB, 4096)");
  cmd.add_option("--line", o.line, "line (sector) bytes")->capture_default_str();
  cmd.add_option("--p", o.in_flight, "tiles in flight P (default: the GPU's SM count)");
  cmd.add_option("--sets", o.sets, "cache sets (1 = fully associative LRU; simple L2 model)")->capture_default_str();
  cmd.add_option("--l2-model", o.l2_model, "simple (one LRU cache, lockstep tiles) | partitioned (Hopper's two halves, "
                 "128 B lines, hashed sets, drifting tiles)")->capture_default_str();
  cmd.add_option("--l2-partitions", o.l2_partitions, "partitioned model: 1 or 2 (default: the GPU preset's)");
  cmd.add_option("--l2-far-copies", o.l2_far_copies, "partitioned model: 1 = far reads keep a copy near, 0 = not");
  cmd.add_option("--l2-ways", o.l2_ways, "partitioned model: ways per set, 0 = fully associative");
  cmd.add_option("--l2-jitter", o.l2_jitter, "partitioned model: a K-step lasts 1 +- this of its nominal time");
  cmd.add_option("--l2-skew", o.l2_skew, "partitioned model: SM speeds spread 1 +- this");
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  const std::string digits = text.substr(0, i), unit = text.substr(i);
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "K" || unit == "KB" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "MB" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB") shift = 30;
  if (digits.empty() || digits.size() > 12 || shift < 0)
    throw InvalidArgument(what + " '" + text + "' is not a size (e.g. 60MiB, 512KiB, 4096)");
  const int64_t v = std::stoll(digits);
  if (v > (int64_t{1} << 40) >> shift) throw InvalidArgument(what + " '" + text + "' is absurd (over 1 TiB)");
  return v << shift;
}

namespace {

constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxTiles = int64_t{1} << 22;

void check_dim(int64_t v, const std::string& what) {
  if (v <= 0) throw InvalidArgument(what + " must be positive, got " + std::to_string(v));
  if (v > kMaxDim) throw InvalidArgument(what + " " + std::to_string(v) + " is absurd (max " + std::to_string(kMaxDim) + ")");
}

// "AxBxC" (n = 3) or "AxB" (n = 2) -> n numbers.
void parse_dims(const std::string& text, const std::string& what, int64_t* out, int n = 3) {
  const std::string form = n == 3 ? "AxBxC" : "AxB";
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    const size_t x = text.find('x', at);
    const std::string part = text.substr(at, i < n - 1 ? x - at : std::string::npos);
    if ((i < n - 1 && x == std::string::npos) || part.empty() || part.size() > 12 ||
        !std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '-'; }))
      throw InvalidArgument(what + " '" + text + "' is not of the form " + form);
    try {
      out[i] = std::stoll(part);
    } catch (const std::exception&) {
      throw InvalidArgument(what + " '" + text + "' is not of the form " + form);
    }
    at = x + 1;
  }
}

Tiling make_tiling(const ProblemOptions& o, int64_t m, int64_t n, int64_t k) {
  Tiling t{128, 128, 64, 1};
  if (o.tile.empty()) {
    t.bm = std::min(t.bm, m), t.bn = std::min(t.bn, n), t.bk = std::min(t.bk, k);
  } else {
    int64_t v[3];
    parse_dims(o.tile, "tile", v);
    t = {v[0], v[1], v[2], 1};
    check_dim(t.bm, "tile BM"), check_dim(t.bn, "tile BN"), check_dim(t.bk, "tile BK");
    if (t.bm > m) throw InvalidArgument(fmt::format("tile BM {} is larger than M {}", t.bm, m));
    if (t.bn > n) throw InvalidArgument(fmt::format("tile BN {} is larger than N {}", t.bn, n));
    if (t.bk > k) throw InvalidArgument(fmt::format("tile BK {} is larger than K {}", t.bk, k));
  }
  return t;
}

// Refuses problems the simulator would take minutes on (it does ~40 M block reads a second).
void check_work(int64_t m, int64_t n, int64_t k, const Tiling& t, int64_t split_k) {
  const int64_t tiles = ((m + t.bm - 1) / t.bm) * ((n + t.bn - 1) / t.bn) * split_k;
  if (tiles > kMaxTiles)
    throw InvalidArgument(fmt::format("{} tiles is absurd (max {}): use larger tiles", tiles, kMaxTiles));
  const double steps = double(tiles / split_k) * double((k + t.bk - 1) / t.bk);
  if (steps > 5e8)
    throw InvalidArgument(fmt::format("{:.3g} tile K-steps is absurd (max 5e8): use larger tiles", steps));
}

}  // namespace

Problem make_problem(const ProblemOptions& o) {
  const GpuPreset gpu = find_gpu_preset(o.gpu);
  Problem p;
  p.gpu = gpu;
  p.cache.capacity_bytes = o.cache.empty() ? gpu.l2_bytes : parse_bytes(o.cache, "cache size");
  if (o.line <= 0 || o.line > (1 << 20)) throw InvalidArgument("line size " + std::to_string(o.line) + " must be in [1, 1048576]");
  p.cache.line_bytes = o.line;
  if (o.in_flight < 0 || o.in_flight > 1000000)
    throw InvalidArgument("tiles in flight --p " + std::to_string(o.in_flight) + " must be in [1, 1000000]");
  p.cache.in_flight = o.in_flight ? static_cast<int>(o.in_flight) : gpu.sms;
  if (o.sets < 1 || o.sets > (1 << 24)) throw InvalidArgument("cache sets " + std::to_string(o.sets) + " must be in [1, 16777216]");
  p.cache.sets = static_cast<int>(o.sets);
  p.cache.l2 = parse_l2_kind(o.l2_model);
  p.cache.part = gpu.l2;
  if (p.cache.l2 == L2Kind::Simple &&
      (o.l2_partitions >= 0 || o.l2_ways >= 0 || o.l2_far_copies >= 0 || o.l2_jitter >= 0 || o.l2_skew >= 0))
    throw InvalidArgument("--l2-partitions/-far-copies/-ways/-jitter/-skew need --l2-model partitioned");
  if (p.cache.l2 == L2Kind::Partitioned && o.sets != 1)
    throw InvalidArgument("--sets " + std::to_string(o.sets) + " is the simple model's; the partitioned one takes --l2-ways");
  if (o.l2_far_copies > 1) throw InvalidArgument("--l2-far-copies " + std::to_string(o.l2_far_copies) + " must be 0 or 1");
  if (o.l2_partitions >= 0) p.cache.part.partitions = static_cast<int>(std::min<int64_t>(o.l2_partitions, 1 << 20));
  if (o.l2_ways >= 0) p.cache.part.ways = static_cast<int>(std::min<int64_t>(o.l2_ways, 1 << 20));
  if (o.l2_far_copies >= 0) p.cache.part.far_copies = o.l2_far_copies == 1;
  if (o.l2_jitter >= 0) p.cache.part.step_jitter = o.l2_jitter;
  if (o.l2_skew >= 0) p.cache.part.sm_skew = o.l2_skew;
  p.cache.validate();
  p.time = time_params(gpu, p.cache.in_flight);
  p.time.validate();
  if (o.split_k < 1 || o.split_k > 4096) throw InvalidArgument("split-k " + std::to_string(o.split_k) + " must be in [1, 4096]");

  const int64_t cap = p.cache.capacity_bytes;
  const std::string cap_text = cap % (1 << 20) == 0 ? fmt::format("{} MiB", cap >> 20)
                               : cap % 1024 == 0    ? fmt::format("{} KiB", cap >> 10)
                                                    : fmt::format("{} B", cap);
  const L2Params& l2 = p.cache.part;
  const std::string l2_text =
      p.cache.l2 == L2Kind::Simple
          ? ""
          : fmt::format(", partitioned L2 ({} x {} B lines, {}, {}, jitter {}, skew {}{}{}{})", l2.partitions, l2.line_bytes,
                        l2.ways ? fmt::format("{} ways", l2.ways) : "fully associative",
                        l2.far_copies ? "far copies" : "no far copies", l2.step_jitter, l2.sm_skew,
                        l2.evict_first_weights
                            ? (l2.evict_first == L2EvictFirst::Push ? fmt::format(", weights evict-first, push {}", l2.weight_push)
                                                                    : std::string(", weights evict-first in the room left"))
                            : "",
                        l2.hit_time < 1 ? fmt::format(", hit time {}", l2.hit_time) : "",
                        l2.set_fringe > 0 ? fmt::format(", set fringe {}", l2.set_fringe) : "");
  const std::string cache_text = fmt::format("cache {}, {} B lines{}, P = {}{}", cap_text,
                                             p.cache.line_bytes, p.cache.sets > 1 ? fmt::format(", {} sets", p.cache.sets) : "",
                                             p.cache.in_flight, l2_text);
  if (!o.dit.empty()) {
    if (!o.gemm.empty() || !o.attention.empty()) throw InvalidArgument("--dit and --gemm / --attention name two problems: give one");
    if (!o.tile.empty() || o.split_k != 1) throw InvalidArgument("--tile and --split-k do not apply to --dit (its tiles are planned)");
    int64_t v[2];
    parse_dims(o.dit, "dit shape", v, 2);
    DitAttentionShape s;
    s.heads = static_cast<int>(std::min<int64_t>(v[0], 1 << 20));
    s.tokens = v[1];
    const DitAttentionGraph g = build_dit_attention_graph(s, gpu.sms);
    p.graph = g.graph;
    p.description = fmt::format("DiT attention block, {} heads x 128 (width {}), L = {}: qkv {}x{}x{} (per-head RMSNorm + "
                                "RoPE in its epilogue), attention {} items, o_proj {}x{}x{}; {} ({})",
                                s.heads, int64_t(s.heads) * 128, s.tokens, s.tokens, 3 * int64_t(s.heads) * 128,
                                int64_t(s.heads) * 128, g.graph.op(g.op_attention).num_tiles, s.tokens,
                                int64_t(s.heads) * 128, int64_t(s.heads) * 128, cache_text, gpu.name);
    return p;
  }
  if (!o.attention.empty()) {
    if (!o.gemm.empty()) throw InvalidArgument("--attention and --gemm name two problems: give one");
    if (!o.tile.empty()) throw InvalidArgument("--tile does not apply to --attention (its tiles are the executor's)");
    int64_t v[2];
    parse_dims(o.attention, "attention shape", v, 2);
    check_dim(v[0], "batch B"), check_dim(v[1], "length L");
    if (v[0] * v[1] > (int64_t{1} << 21))
      throw InvalidArgument(fmt::format("attention {}x{}: {} cached tokens is absurd for the model (max 2^21)", v[0], v[1],
                                        v[0] * v[1]));
    // Llama-3-8B attention, planned for this GPU as the fused executor plans it (two tiles per SM).
    DecodeAttentionShape s;
    s.batch = static_cast<int>(v[0]);
    s.max_seq_len = v[1];
    s.tiles_per_sm = 2;
    const std::vector<int> lens(s.batch, static_cast<int>(v[1]));
    validate_decode_attention(s, lens, {});
    const DecodePlan plan = plan_decode_for(s, lens, gpu.sms);
    const int64_t hidden = 4096;
    const Tiling t = attention_oproj_tiling(s, hidden, o.split_k > 1 ? static_cast<int>(o.split_k) : 0);
    p.graph = build_attention_oproj_graph(s, lens, {}, plan, hidden, t, false).graph;
    p.description = fmt::format("Llama-3-8B decode attention (32/8 heads, d 128) B = {}, L = {}: {} attention tiles; "
                                "o_proj {}x{}x{}, tiles {}x{}x{}, split-K {}; {} ({})",
                                v[0], v[1], plan.num_tiles, v[0], hidden, 32 * 128, t.bm, t.bn, t.bk, t.split_k,
                                cache_text, gpu.name);
    return p;
  }
  if (!o.gemm.empty()) {
    int64_t v[3];
    parse_dims(o.gemm, "GEMM shape", v);
    check_dim(v[0], "M"), check_dim(v[1], "N"), check_dim(v[2], "K");
    Tiling t = make_tiling(o, v[0], v[1], v[2]);
    t.split_k = o.split_k;
    check_work(v[0], v[1], v[2], t, t.split_k);
    p.graph = build_gemm_graph(v[0], v[1], v[2], t).graph;
    p.description = fmt::format("GEMM {}x{}x{}, tiles {}x{}x{}{}; {} ({})", v[0], v[1], v[2], t.bm, t.bn, t.bk,
                                t.split_k > 1 ? fmt::format(", split-K {}", t.split_k) : "", cache_text, gpu.name);
    return p;
  }
  FfnShape s = model_preset(o.model, o.m);
  if (o.d) check_dim(o.d, "hidden size --d"), s.d = o.d;
  if (o.ffn) check_dim(o.ffn, "intermediate size --ffn"), s.f = o.ffn;
  Tiling t0 = make_tiling(o, s.m, s.f, s.d), t1 = make_tiling(o, s.m, s.d, s.f);
  t1.split_k = o.split_k;
  check_work(s.m, s.f, s.d, t0, 1);
  check_work(s.m, s.d, s.f, t1, t1.split_k);
  p.graph = build_ffn_graph(s, {t0, t1}).graph;
  p.description = fmt::format("{} FFN (d {}, ffn {}{}), M = {}, tiles {}x{}x{}{}; {} ({})", o.model, s.d, s.f,
                              s.gated ? ", gated" : ", plain chain", s.m, t0.bm, t0.bn, t0.bk,
                              t1.split_k > 1 ? fmt::format(", down split-K {}", t1.split_k) : "", cache_text, gpu.name);
  return p;
}

}  // namespace tw::cli
