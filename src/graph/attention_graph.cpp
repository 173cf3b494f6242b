// Decode attention on the host: validation, the stream-K plan and planner, the op's tiles in a
// TileGraph, and the attention -> o_proj graph.
#include "tileweave/graph/attention_graph.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "tileweave/kernels/attention/decode_units.hpp"

namespace tw {

namespace {

using kernels::decode_units;

// The planner's defaults, from the H200 variants of bench_attention (2026-11-22):
// - One tile of 8 warps per SM, for equal lengths with at most kAlignedBytesPerSm of K/V per SM
//   when tiles aligned to pairs (each pair the same whole number of tiles, or each tile the same
//   whole number of pairs of over kWholePairBytes) fill >= 90% of the SMs: the fewest partials and
//   merges. Against two tiles per SM cut evenly over every slot (H200, bench_attention_trace and
//   bench_attention): B = 64, L = 4096 242.2 against 246.4 us per replay, 245.1 against 248.6 back
//   to back; B = 32, L = 4096 143.4 against 148.4; B = 16, L = 32768 470.0 against 474.4 per
//   replay. At 65 MiB per SM it went either way between runs and machines (B = 16, L = 131072
//   1848.7 against 1854.5 on one H200, 1929.5 against 1897 on another), at 260 MiB it lost
//   (B = 64, L = 131072 7738 against 7542), and with short pairs too (B = 64, L = 512: 128 tiles
//   of 4 pairs 39.8 against 38.0 for 256 of 2 at two per SM).
// - Unequal lengths: one tile per SM when there are no more pairs than SMs and at most
//   kSmallBytesPerSm of K/V per SM, cut evenly over the SMs.
// - Otherwise two tiles per SM, cut evenly over every slot (whole pairs per tile for short pairs).
// Small work in 16-token pages needs no plan of its own: one tile per SM runs 8 warps, which hide
// each stage's page-table read as well as two tiles of 4 did (B = 16, L = 4096 per replay: 79.8
// against 82.4 us for two tiles, H200 bench_attention.json; back to back it went either way).
// The ring depth (stages per warp) depends on shared memory and stays with the GPU op.
constexpr int64_t kSmallBytesPerSm = int64_t(8) << 20;
constexpr int64_t kAlignedBytesPerSm = int64_t(32) << 20;
// A tile streams at least one stage per warp.
constexpr int kMinUnitsPerTile = kernels::kDecodeWarps;
// More equal pairs than tile slots, each at most this many K/V bytes: whole pairs per tile (no
// partials, no merges; B = 64, L = 512: 42.2 us against 46.2 with pairs cut anywhere, H200).
constexpr int64_t kWholePairBytes = int64_t(1) << 20;

// All sequences span the same number of 16-token units (the tiles can be aligned to pairs).
bool equal_units(const std::vector<int>& lens) {
  return std::all_of(lens.begin(), lens.end(), [&](int l) { return decode_units(l) == decode_units(lens[0]); });
}

// Tiles for `slots_max` co-resident ones, each streaming at least kMinUnitsPerTile units. `aligned`:
// when all pairs are equally long and fewer than the slots, each pair gets the same whole number of
// tiles, so that tile boundaries fall on pair boundaries (no tile holds parts of two pairs, and a
// pair's merge waits for the fewest tiles). `whole_pairs`: when there are more equal pairs than
// slots, every tile gets the same whole number of pairs if that fills at least 90% of the slots.
int plan_tiles(const std::vector<int>& lens, int num_kv_heads, int slots_max, bool aligned, bool whole_pairs) {
  const int npairs = static_cast<int>(lens.size()) * num_kv_heads;
  int units = 0;
  for (int len : lens) units += decode_units(len) * num_kv_heads;
  // At least one tile per pair, up to the slots: a pair of fewer units than warps keeps that many warps
  // busy, and tiles packed to kMinUnitsPerTile units ran their pairs one after another (H200, the
  // attention sweep: B = 64, 8 KV heads, 9 tokens 11.6 us in 64 tiles of 8 pairs, SDPA 4.7 us).
  const int by_units = (units + kMinUnitsPerTile - 1) / kMinUnitsPerTile;
  const int most = std::clamp(std::max(by_units, std::min(npairs, slots_max)), 1, slots_max);
  if (!equal_units(lens)) return most;
  return (npairs > most ? whole_pairs : aligned) ? kernels::decode_aligned_tiles(npairs, most) : most;
}

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("decode attention: " + what); }

}  // namespace

void validate_decode_attention(const DecodeAttentionShape& s, const std::vector<int>& lens, const std::vector<int>& table) {
  if (s.batch < 1) bad("batch " + std::to_string(s.batch) + " must be >= 1");
  if (s.num_kv_heads < 1) bad("num_kv_heads " + std::to_string(s.num_kv_heads) + " must be >= 1");
  if (s.num_q_heads < 1 || s.num_q_heads % s.num_kv_heads != 0)
    bad("num_q_heads " + std::to_string(s.num_q_heads) + " is not a multiple of num_kv_heads " +
        std::to_string(s.num_kv_heads));
  const int group = s.num_q_heads / s.num_kv_heads;
  if (group > kernels::kDecodeMaxGroup)
    bad("group size " + std::to_string(group) + " (num_q_heads / num_kv_heads) exceeds " +
        std::to_string(kernels::kDecodeMaxGroup));
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
    bad("head_dim " + std::to_string(s.head_dim) + " is not 64, 128 or 256");
  auto in_range = [](const char* name, int v, int hi) {
    if (v < 0 || v > hi) bad(std::string(name) + " " + std::to_string(v) + " is outside [0, " + std::to_string(hi) + "]");
  };
  in_range("num_tiles", s.num_tiles, kernels::kDecodeMaxTiles);
  in_range("tiles_per_sm", s.tiles_per_sm, 2);
  in_range("ring_slots", s.ring_slots, kernels::kDecodeMaxSlots);
  if (int64_t(lens.size()) != s.batch)
    bad("seq_lens has " + std::to_string(lens.size()) + " entries for batch " + std::to_string(s.batch));
  for (int b = 0; b < s.batch; ++b)
    if (lens[b] < 1)
      bad("seq_lens[" + std::to_string(b) + "] = " + std::to_string(lens[b]) + ": a sequence holds at least the new token");
  const int max_len = *std::max_element(lens.begin(), lens.end());
  int64_t units = 0;
  for (int len : lens) units += int64_t(decode_units(len)) * s.num_kv_heads;
  if (units > INT32_MAX / 2) bad("the cache holds " + std::to_string(units) + " 16-token units, over 2^30");
  if (s.layout == KvLayout::Contiguous) {
    if (max_len > s.max_seq_len)
      bad("seq_lens up to " + std::to_string(max_len) + " exceed max_seq_len " + std::to_string(s.max_seq_len));
    if (!table.empty()) bad("a page table was given for a contiguous cache");
    return;
  }
  if (s.page_size < 16 || s.page_size % 16 != 0)
    bad("page_size " + std::to_string(s.page_size) + " is not a positive multiple of 16");
  if (s.num_pages < 1) bad("num_pages " + std::to_string(s.num_pages) + " must be >= 1");
  if (s.pages_per_seq < 1) bad("pages_per_seq " + std::to_string(s.pages_per_seq) + " must be >= 1");
  if (int64_t(table.size()) != int64_t(s.batch) * s.pages_per_seq)
    bad("page table has " + std::to_string(table.size()) + " entries, expected batch * pages_per_seq = " +
        std::to_string(int64_t(s.batch) * s.pages_per_seq));
  for (int b = 0; b < s.batch; ++b) {
    const int pages = (lens[b] + s.page_size - 1) / s.page_size;
    if (pages > s.pages_per_seq)
      bad("seq_lens[" + std::to_string(b) + "] = " + std::to_string(lens[b]) + " needs " + std::to_string(pages) +
          " pages, the page table has " + std::to_string(s.pages_per_seq) + " per sequence");
    for (int i = 0; i < pages; ++i) {
      const int page = table[int64_t(b) * s.pages_per_seq + i];
      if (page < 0 || page >= s.num_pages)
        bad("page_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " + std::to_string(page) +
            " is outside [0, " + std::to_string(s.num_pages) + ")");
    }
  }
}

int64_t decode_kv_bytes(const DecodeAttentionShape& s, const std::vector<int>& lens) {
  const int64_t tokens = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  return tokens * s.num_kv_heads * s.head_dim * 2 /*bytes*/ * 2 /*K and V*/;
}

DecodePlan plan_decode(const std::vector<int>& seq_lens, int num_kv_heads, int num_tiles) {
  DecodePlan pl;
  const int npairs = static_cast<int>(seq_lens.size()) * num_kv_heads;
  pl.pair_info.resize(2 * size_t(npairs + 1));
  int units = 0;
  for (int i = 0; i < npairs; ++i) {
    const int len = seq_lens[i / num_kv_heads];
    pl.pair_info[2 * i] = units;
    pl.pair_info[2 * i + 1] = len;
    units += decode_units(len);
  }
  pl.pair_info[2 * npairs] = units;
  pl.total_units = units;
  pl.num_tiles = std::clamp(num_tiles, 1, units);
  pl.tile_first.resize(4 * size_t(pl.num_tiles));
  int i = 0;
  for (int c = 0; c < pl.num_tiles; ++c) {
    const int u = kernels::decode_tile_start(c, pl.num_tiles, units);
    while (pl.pair_info[2 * (i + 1)] <= u) ++i;
    const int f[4] = {i, pl.pair_info[2 * i], pl.pair_info[2 * (i + 1)], pl.pair_info[2 * i + 1]};
    std::copy(f, f + 4, pl.tile_first.begin() + 4 * c);
  }
  return pl;
}

// The few-token path. A pair of at most kDecodeShortTokens = 4 units (64 tokens) gives each warp of a
// stream-K tile (4 or 8 warps) at most one 16-token unit however the plan cuts it: a cut over more
// tiles adds partials and a merge and shortens nothing, and what such a launch costs is the tile's
// chain -- tables, rows, prologue, ring stage, the combine over 8 warps -- not the stream (H200,
// docs/attention.md: 3.3 us back to back at 1 x 19 tokens without RoPE and append, an empty kernel
// 0.84). One block per pair with all of the pair's K/V requested at once is one DRAM round trip plus
// the math, as long as every pair's block is resident at once: pairs <= sms x the blocks per SM its
// launch bounds guarantee (one wave; past it the later blocks would wait out a whole chain, and the
// launch holds enough bytes for the ring's stream to pay). The lengths ride in the kernel's
// parameters (a byte each, B <= kDecodeShortMaxBatch). Overrides of the stream-K plan keep that plan.
bool decode_few_tokens(const DecodeAttentionShape& s, const std::vector<int>& seq_lens, int sms) {
  if (!s.few_tokens || s.num_tiles > 0 || s.tiles_per_sm > 0 || s.ring_slots > 0 || s.kv_load == KvLoad::Bulk) return false;
  if (seq_lens.empty() || s.batch > kernels::kDecodeShortMaxBatch) return false;
  if (*std::max_element(seq_lens.begin(), seq_lens.end()) > kernels::kDecodeShortTokens) return false;
  return int64_t(s.batch) * s.num_kv_heads <= int64_t(sms) * kernels::decode_short_blocks_per_sm(s.head_dim);
}

DecodePlan plan_decode_for(const DecodeAttentionShape& s, const std::vector<int>& seq_lens, int sms,
                           bool lengths_on_device) {
  if (sms < 1) bad("the GPU's SM count " + std::to_string(sms) + " must be >= 1");
  const bool few = !lengths_on_device && decode_few_tokens(s, seq_lens, sms);
  const int64_t npairs = int64_t(s.batch) * s.num_kv_heads;
  const bool uniform = equal_units(seq_lens);
  const int64_t bytes = decode_kv_bytes(s, seq_lens);
  const int64_t pair_bytes = int64_t(*std::max_element(seq_lens.begin(), seq_lens.end())) * s.head_dim * 2 * 2;
  bool one_per_sm = npairs <= sms && bytes <= (uniform ? kAlignedBytesPerSm : kSmallBytesPerSm) * sms;
  if (uniform && npairs > sms && pair_bytes > kWholePairBytes && bytes <= kAlignedBytesPerSm * sms) {
    const int64_t per_tile = (npairs + sms - 1) / sms, tiles = npairs / per_tile;
    one_per_sm = npairs % per_tile == 0 && 10 * tiles >= 9 * int64_t(sms);
  }
  const int tiles_per_sm = s.tiles_per_sm > 0 ? s.tiles_per_sm : (one_per_sm ? 1 : 2);
  const int slots_max = std::min(sms * tiles_per_sm, kernels::kDecodeMaxTiles);
  // Whole pairs per tile at one tile per SM, and for short pairs at two -- under the planner's own
  // tiles per SM only (the executor's attention -> o_proj fixes tiles_per_sm and wants every
  // block's first ticket to be an attention tile).
  const bool whole_pairs = s.tiles_per_sm == 0 && (tiles_per_sm == 1 || pair_bytes <= kWholePairBytes);
  const int tiles = s.num_tiles > 0 ? s.num_tiles
                                    : plan_tiles(seq_lens, s.num_kv_heads, slots_max, tiles_per_sm == 1, whole_pairs);
  DecodePlan pl = plan_decode(seq_lens, s.num_kv_heads, tiles);
  pl.tiles_per_sm = tiles_per_sm;
  pl.rule_tiles = pl.num_tiles;
  pl.rule_tiles_per_sm = tiles_per_sm;
  pl.rule_us = pl.predicted_us = predict_decode_cost(s, seq_lens, pl.num_tiles, tiles_per_sm, sms).us;
  pl.few_tokens = few;
  if (s.num_tiles > 0 || s.tiles_per_sm > 0) return pl;  // the caller's overrides
  // The model's best candidate, where it beats the rules' plan by the margin. Fitted on two sweeps and
  // tried on a third (H200), the picks were faster on 5-8 of each 40 shapes (1.04-1.57x: ragged short
  // pairs cut one unit a tile, whole pairs per tile where the merges cost more than the split saves,
  // fewer tiles for head dim 256's wide partials) and slower by more than 3% on one of the 120; with
  // no margin, more shapes lost where the model's error exceeds the candidates' difference.
  const std::vector<DecodeCandidate> ranked = rank_decode_candidates(s, seq_lens, sms);
  if (ranked.empty() || !(ranked[0].cost.us < 0.9 * pl.rule_us)) return pl;
  DecodePlan chosen = plan_decode(seq_lens, s.num_kv_heads, ranked[0].tiles);
  chosen.tiles_per_sm = ranked[0].tiles_per_sm;
  chosen.rule_tiles = pl.rule_tiles;
  chosen.rule_tiles_per_sm = pl.rule_tiles_per_sm;
  chosen.rule_us = pl.rule_us;
  chosen.predicted_us = ranked[0].cost.us;
  chosen.few_tokens = few;
  return chosen;
}

std::vector<DecodeCandidate> rank_decode_candidates(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                                                    int sms, const DecodeCostModel& m) {
  std::vector<DecodeCandidate> out;
  for (const auto& [t, per_sm] : decode_plan_candidates(s, seq_lens, sms))
    out.push_back({t, per_sm, predict_decode_cost(s, seq_lens, t, per_sm, sms, m)});
  std::stable_sort(out.begin(), out.end(), [](const DecodeCandidate& a, const DecodeCandidate& b) { return a.cost.us < b.cost.us; });
  return out;
}

double decode_active_fraction(int active, int sms) {
  if (sms < 1 || active < 1) return 0;
  static constexpr double kAt[5][2] = {{0, 0}, {0.25, 0.54}, {0.5, 0.86}, {0.75, 0.90}, {1.0, 1.0}};
  const double x = std::min(1.0, double(active) / sms);
  for (int i = 1; i < 5; ++i)
    if (x <= kAt[i][0]) return kAt[i - 1][1] + (kAt[i][1] - kAt[i - 1][1]) * (x - kAt[i - 1][0]) / (kAt[i][0] - kAt[i - 1][0]);
  return 1.0;
}

DecodeCost predict_decode_cost(const DecodeAttentionShape& s, const std::vector<int>& seq_lens, int num_tiles,
                               int tiles_per_sm, int sms, const DecodeCostModel& m) {
  if (sms < 1) bad("the GPU's SM count " + std::to_string(sms) + " must be >= 1");
  if (tiles_per_sm < 1 || tiles_per_sm > 2) bad("tiles_per_sm " + std::to_string(tiles_per_sm) + " is not 1 or 2");
  const int H = s.num_kv_heads, npairs = static_cast<int>(seq_lens.size()) * H;
  std::vector<int> first(npairs + 1, 0);  // each pair's first unit
  for (int i = 0; i < npairs; ++i) first[i + 1] = first[i] + decode_units(seq_lens[i / H]);
  const int units = first[npairs], tiles = std::clamp(num_tiles, 1, std::max(1, units));
  DecodeCost c;
  for (int t = 0, p = 0; t < tiles; ++t) {
    const int u0 = kernels::decode_tile_start(t, tiles, units), u1 = kernels::decode_tile_start(t + 1, tiles, units);
    if (u1 <= u0) continue;
    while (first[p + 1] <= u0) ++p;
    int q = p;
    while (q < npairs && first[q] < u1) ++q;
    c.max_units = std::max(c.max_units, u1 - u0);
    c.max_segments = std::max(c.max_segments, q - p);
  }
  for (int i = 0; i < npairs; ++i)
    if (first[i + 1] > first[i])
      c.widest_pair = std::max(c.widest_pair, kernels::decode_tile_of(first[i + 1] - 1, tiles, units) -
                                                  kernels::decode_tile_of(first[i], tiles, units) + 1);
  const int active = std::min(tiles, sms), group = s.num_q_heads / std::max(1, H);
  const double sm_rate = std::min(m.sm_gbps * 1e3, m.read_tbps * 1e6 * decode_active_fraction(active, sms) / active);
  const double unit_bytes = double(kernels::kDecodeStageTokens) * s.head_dim * 4;  // K and V, bf16
  c.stream_us = m.stream_scale * c.max_units * unit_bytes * tiles_per_sm / sm_rate;
  if (c.widest_pair > 1) {
    const double kb = c.widest_pair * (double(group) * s.head_dim + group) * 4 / 1e3;
    c.merge_us = m.merge_us + (m.merge_us_per_kb + (s.head_dim == 256 ? m.merge_us_per_kb_d256 : 0)) * kb;
  }
  c.us = m.base_us + (s.head_dim == 256 ? m.d256_us : 0) + m.segment_us * std::max(0, c.max_segments - 1) + c.stream_us +
         c.merge_us + (tiles_per_sm == 2 ? m.two_per_sm_us : 0);
  return c;
}

std::vector<std::pair<int, int>> decode_plan_candidates(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                                                        int sms) {
  const int npairs = static_cast<int>(seq_lens.size()) * s.num_kv_heads;
  int units = 0;
  for (int len : seq_lens) units += decode_units(len) * s.num_kv_heads;
  std::vector<int> counts;
  for (int k : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128})
    if (int64_t(npairs) * k <= 2 * int64_t(sms)) counts.push_back(npairs * k);
  for (int t : {sms / 4, sms / 2, sms, 2 * sms})
    if (t >= 1) counts.push_back(t);
  std::vector<std::pair<int, int>> out;
  const bool two_fit = !(s.head_dim == 256 && s.num_q_heads / s.num_kv_heads > 8);  // the op refuses it
  for (int t : counts) {
    const int tiles = std::min({t, units, kernels::kDecodeMaxTiles});
    if (tiles <= sms) out.emplace_back(tiles, 1);
    if (two_fit && tiles <= 2 * sms && tiles > 1) out.emplace_back(tiles, 2);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int decode_tile_warps(int head_dim, int tiles_per_sm) { return tiles_per_sm == 1 && head_dim <= 128 ? 8 : 4; }

DecodePlanSummary summarize_decode_plan(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                                        const DecodePlan& plan) {
  DecodePlanSummary r;
  r.pairs = static_cast<int>(seq_lens.size()) * s.num_kv_heads;
  r.tiles = plan.num_tiles;
  r.tiles_per_sm = plan.tiles_per_sm;
  r.warps = decode_tile_warps(s.head_dim, plan.tiles_per_sm);
  r.units_per_tile = (plan.total_units + plan.num_tiles - 1) / plan.num_tiles;
  r.kv_bytes = decode_kv_bytes(s, seq_lens);
  const int group = s.num_q_heads / s.num_kv_heads;
  const int64_t part = (int64_t(group) * s.head_dim + group) * 4;  // a partial's output and LSEs, fp32
  for (int i = 0; i < r.pairs; ++i) {
    const int u0 = plan.pair_info[2 * size_t(i)], u1 = plan.pair_info[2 * size_t(i + 1)];
    const int n = kernels::decode_tile_of(u1 - 1, plan.num_tiles, plan.total_units) -
                  kernels::decode_tile_of(u0, plan.num_tiles, plan.total_units) + 1;
    if (n < 2) continue;
    ++r.split_pairs;
    r.partials += n;
    r.widest_pair_tiles = std::max(r.widest_pair_tiles, n);
  }
  r.partial_bytes = 2 * r.partials * part;
  r.widest_merge_bytes = r.widest_pair_tiles > 1 ? r.widest_pair_tiles * part : 0;
  return r;
}

std::vector<DecodeTileDesc> decode_tile_descs(const DecodePlan& plan) {
  std::vector<DecodeTileDesc> out(plan.num_tiles);
  for (int c = 0; c < plan.num_tiles; ++c) {
    const int last_unit = kernels::decode_tile_start(c + 1, plan.num_tiles, plan.total_units) - 1;
    int pair = plan.tile_first[4 * c];
    while (plan.pair_info[2 * (pair + 1)] <= last_unit) ++pair;
    out[c] = {c, plan.tile_first[4 * c], pair + 1};
  }
  return out;
}

int TileGraph::add_decode_attention(std::string name, const DecodeAttentionShape& s, const std::vector<int>& lens,
                                    const std::vector<int>& table, const DecodePlan& plan,
                                    const DecodeAttentionTensorIds& t, int kv_granule) {
  validate_decode_attention(s, lens, table);
  const int B = s.batch, Hkv = s.num_kv_heads, G = s.num_q_heads / Hkv, D = s.head_dim;
  const int npairs = B * Hkv;
  const bool paged = s.layout == KvLayout::Paged;
  auto bad_op = [&](const std::string& what) { return InvalidArgument("op '" + name + "': " + what); };
  if (plan.num_tiles < 1 || plan.pair_info.size() != 2 * size_t(npairs + 1) ||
      plan.tile_first.size() != 4 * size_t(plan.num_tiles))
    throw bad_op("the plan's tables do not fit " + std::to_string(npairs) + " (sequence, KV head) pairs and " +
                 std::to_string(plan.num_tiles) + " tiles");
  for (int i = 0; i < npairs; ++i)
    if (plan.pair_info[2 * i + 1] != lens[i / Hkv])
      throw bad_op("the plan was made for length " + std::to_string(plan.pair_info[2 * i + 1]) + " of sequence " +
                   std::to_string(i / Hkv) + ", seq_lens says " + std::to_string(lens[i / Hkv]));
  auto expect = [&](int id, const char* what, int64_t rows, int64_t cols) {
    check_tensor(id, what);
    const Tensor& T = tensors_[id];
    if (T.rows != rows || T.cols != cols || T.elem_bytes != 2)
      throw bad_op(std::string(what) + " is " + std::to_string(T.rows) + "x" + std::to_string(T.cols) + " (" +
                   std::to_string(T.elem_bytes) + " B elements), expected bf16 " + std::to_string(rows) + "x" +
                   std::to_string(cols));
  };
  const int64_t qd = int64_t(s.num_q_heads) * D;
  const int64_t cache_rows = paged ? int64_t(s.num_pages) * Hkv * s.page_size : int64_t(npairs) * s.max_seq_len;
  // q may be the first columns of a wider tensor (a decode step's fused q|k|v projection).
  check_tensor(t.q, "q");
  if (tensors_[t.q].rows != B || tensors_[t.q].cols < qd || tensors_[t.q].elem_bytes != 2)
    throw bad_op("q is " + std::to_string(tensors_[t.q].rows) + "x" + std::to_string(tensors_[t.q].cols) +
                 ", expected bf16 " + std::to_string(B) + " rows of at least " + std::to_string(qd) + " columns");
  expect(t.out, "out", B, qd);
  expect(t.k_cache, "k_cache", cache_rows, D);
  expect(t.v_cache, "v_cache", cache_rows, D);
  if (s.append) {
    expect(t.k_new, "k_new", B, int64_t(Hkv) * D);
    expect(t.v_new, "v_new", B, int64_t(Hkv) * D);
  }

  Op o;
  o.name = std::move(name);
  o.kind = OpKind::DecodeAttention;
  o.m = B, o.n = qd, o.k = plan.total_units;
  o.a = t.q, o.b = t.k_cache, o.c = t.out;
  // Not a grid: bm x bn is the whole output; split_k 1 is what make_exec_plan and the model read.
  o.tiling.bm = B, o.tiling.bn = qd, o.tiling.bk = kernels::kDecodeStageTokens, o.tiling.split_k = 1;
  o.grid_m = 1, o.grid_n = plan.num_tiles;
  o.first_tile = num_tiles();
  // Row of token `tok` of pair `pair` in the K (or V) cache tensor.
  auto cache_row = [&](int pair, int tok) -> int64_t {
    if (!paged) return int64_t(pair) * s.max_seq_len + tok;
    const int b = pair / Hkv, h = pair % Hkv;
    const int page = table[int64_t(b) * s.pages_per_seq + tok / s.page_size];
    return (int64_t(page) * Hkv + h) * s.page_size + tok % s.page_size;
  };
  for (const DecodeTileDesc& d : decode_tile_descs(plan)) {
    Tile tile;
    tile.op = static_cast<int>(ops_.size());
    tile.tn = d.tile;
    tile.k0 = kernels::decode_tile_start(d.tile, plan.num_tiles, plan.total_units);
    tile.k1 = kernels::decode_tile_start(d.tile + 1, plan.num_tiles, plan.total_units);
    // Per sequence of the pair range: q (and the new k, v) of its heads in, their output out.
    for (int b = d.pair_begin / Hkv; b <= (d.pair_end - 1) / Hkv; ++b) {
      const int h0 = std::max(d.pair_begin, b * Hkv) - b * Hkv, h1 = std::min(d.pair_end, (b + 1) * Hkv) - b * Hkv;
      tile.reads.push_back({t.q, b, b + 1, int64_t(h0) * G * D, int64_t(h1) * G * D});
      if (s.append) {
        tile.reads.push_back({t.k_new, b, b + 1, int64_t(h0) * D, int64_t(h1) * D});
        tile.reads.push_back({t.v_new, b, b + 1, int64_t(h0) * D, int64_t(h1) * D});
      }
      tile.writes.push_back({t.out, b, b + 1, int64_t(h0) * G * D, int64_t(h1) * G * D});
    }
    // The K/V rows the tile streams: its units of each pair, up to the sequence's end (the kernel
    // zero-fills a short last stage, reading nothing there), one region per page when paged.
    for (int pair = d.pair_begin; pair < d.pair_end; ++pair) {
      const int pu0 = plan.pair_info[2 * pair], pu1 = plan.pair_info[2 * (pair + 1)], len = plan.pair_info[2 * pair + 1];
      const int tok0 = static_cast<int>(std::max<int64_t>(tile.k0, pu0) - pu0) * kernels::kDecodeStageTokens;
      const int tok1 = std::min(static_cast<int>(std::min<int64_t>(tile.k1, pu1) - pu0) * kernels::kDecodeStageTokens, len);
      const int limit = paged ? std::max(tok1, (tok1 + s.page_size - 1) / s.page_size * s.page_size)
                              : static_cast<int>(s.max_seq_len);
      const int tok_end = std::min(limit, (tok1 + kv_granule - 1) / kv_granule * kv_granule);
      for (int tok = tok0; tok < tok_end;) {
        const int end = paged ? std::min(tok_end, (tok / s.page_size + 1) * s.page_size) : tok_end;
        const int64_t r = cache_row(pair, tok);
        tile.reads.push_back({t.k_cache, r, r + (end - tok), 0, D});
        tile.reads.push_back({t.v_cache, r, r + (end - tok), 0, D});
        tok = end;
      }
      tile.flops += 4.0 * G * D * (tok1 - tok0);  // q.K^T and P.V for the group's G heads
    }
    tiles_.push_back(std::move(tile));
  }
  o.num_tiles = num_tiles() - o.first_tile;
  ops_.push_back(o);
  derive_deps(o.first_tile);
  return static_cast<int>(ops_.size()) - 1;
}

Tiling attention_oproj_tiling(const DecodeAttentionShape& s, int64_t hidden, int split_k) {
  if (hidden < 1) throw InvalidArgument("o_proj: hidden size " + std::to_string(hidden) + " must be >= 1");
  const int64_t k = int64_t(s.num_q_heads) * s.head_dim;
  Tiling t;
  t.bm = t.bn = s.batch <= 16 ? 16 : 64;
  t.bk = s.batch <= 16 ? 256 : 128;
  if (split_k < 0 || split_k > (k + t.bk - 1) / t.bk)
    throw InvalidArgument("o_proj: split_k " + std::to_string(split_k) + " is outside [0, " +
                          std::to_string((k + t.bk - 1) / t.bk) + "] (K = " + std::to_string(k) + " in steps of " +
                          std::to_string(t.bk) + ")");
  if (split_k > 0) {
    t.split_k = split_k;
  } else {
    // Slices of whole KV-head groups (and whole K steps), about 128 KiB of weights per tile. Measured
    // on the H200 (bench/results/h200/bench_attention_oproj.json, Llama-3-8B, B 1..64): 128 KiB tiles
    // (1 slice at B <= 16, 4 at B = 64) were the fastest split: per-tile costs (the pipeline fill,
    // the wait, split-K reductions) outweigh finer dependencies, as the attention tiles end together.
    const int64_t group_cols = int64_t(s.num_q_heads / std::max(1, s.num_kv_heads)) * s.head_dim;
    const int64_t unit = std::lcm(std::max<int64_t>(group_cols, 1), t.bk);
    const int64_t target = (int64_t(128) << 10) / 2 / t.bn;
    const int64_t slice = std::max<int64_t>(1, (target + unit / 2) / unit) * unit;
    t.split_k = std::max<int64_t>(1, (k + slice - 1) / slice);
  }
  // Whole K steps per slice and no empty slice (as TileGraph cuts them).
  const int64_t slice = ((k + t.split_k - 1) / t.split_k + t.bk - 1) / t.bk * t.bk;
  t.split_k = (k + slice - 1) / slice;
  return t;
}

AttentionOprojGraph build_attention_oproj_graph(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                                                const std::vector<int>& page_table, const DecodePlan& plan,
                                                int64_t hidden, const Tiling& oproj, bool residual) {
  validate_decode_attention(s, seq_lens, page_table);
  if (hidden < 1) throw InvalidArgument("o_proj: hidden size " + std::to_string(hidden) + " must be >= 1");
  AttentionOprojGraph g;
  TileGraph& G = g.graph;
  const int64_t B = s.batch, qd = int64_t(s.num_q_heads) * s.head_dim, kvd = int64_t(s.num_kv_heads) * s.head_dim;
  const int64_t cache_rows = s.layout == KvLayout::Paged ? int64_t(s.num_pages) * s.num_kv_heads * s.page_size
                                                         : B * s.num_kv_heads * s.max_seq_len;
  g.attn.q = G.add_tensor("q", B, qd, 2, TensorRole::Input);
  if (s.append) {
    g.attn.k_new = G.add_tensor("k_new", B, kvd, 2, TensorRole::Input);
    g.attn.v_new = G.add_tensor("v_new", B, kvd, 2, TensorRole::Input);
  }
  g.attn.k_cache = G.add_tensor("k_cache", cache_rows, s.head_dim, 2, TensorRole::Input);
  g.attn.v_cache = G.add_tensor("v_cache", cache_rows, s.head_dim, 2, TensorRole::Input);
  g.attn.out = G.add_tensor("o", B, qd, 2, TensorRole::Intermediate);
  g.w_o = G.add_tensor("w_o", hidden, qd, 2, TensorRole::Weight);
  if (residual) g.residual = G.add_tensor("residual", B, hidden, 2, TensorRole::Input);
  g.y = G.add_tensor("y", B, hidden, 2, TensorRole::Output);
  g.op_attention = G.add_decode_attention("attention", s, seq_lens, page_table, plan, g.attn);
  g.op_oproj = G.add_gemm("o_proj", g.attn.out, g.w_o, g.y, oproj, g.residual);
  return g;
}

}  // namespace tw
