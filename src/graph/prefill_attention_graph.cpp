// Prefill attention on the host: validation, the kernel's work tiles and the FLOP count.
#include "tileweave/graph/prefill_attention_graph.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <queue>
#include <string>

namespace tw {

namespace {

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("prefill attention: " + what); }

void check_offsets(const std::vector<int>& cu, const char* name) {
  if (cu.size() < 2) bad(std::string(name) + " needs batch + 1 >= 2 entries, got " + std::to_string(cu.size()));
  if (cu[0] != 0) bad(std::string(name) + "[0] must be 0, got " + std::to_string(cu[0]));
  for (size_t b = 1; b < cu.size(); ++b)
    if (cu[b] < cu[b - 1])
      bad(std::string(name) + " decreases at " + std::to_string(b) + ": " + std::to_string(cu[b - 1]) + " then " +
          std::to_string(cu[b]));
}

const std::vector<int>& keys_of(const std::vector<int>& cu_q, const std::vector<int>& cu_k) {
  return cu_k.empty() ? cu_q : cu_k;
}

// Key tiles query tile t of a sequence needs: all of them, or under the causal mask those holding a
// key <= the tile's last row + (len_k - len_q).
int kv_tiles_for(const PrefillAttentionShape& s, int len_q, int len_k, int t, int block_n, int block_m) {
  const int all = (len_k + block_n - 1) / block_n;
  if (!s.causal) return all;
  const int64_t last_row = std::min<int64_t>(int64_t(t + 1) * block_m, len_q) - 1;
  const int64_t last_key = last_row + (len_k - len_q);
  if (last_key < 0) return 0;
  return int(std::min<int64_t>(all, last_key / block_n + 1));
}

}  // namespace

int prefill_block_n(const PrefillAttentionShape& s) {
  if (s.fp8) return kPrefillFp8TileKeys;
  if (s.head_dim == 256) return 64;  // Q 64 KiB + two stages of K and V at 32 KiB each: 192 KiB
  return s.head_dim == 128 && !s.causal ? 160 : kPrefillBlockN;
}

int prefill_block_m(const PrefillAttentionShape& s, const std::vector<int>& cu_q, int sms) {
  if (s.head_dim != 64 || s.fp8 || sms < 1) return kPrefillBlockM;
  // Time ~ rounds of items over the SMs x an item's time (its rows over the rows' throughput).
  constexpr double kThreeWarpgroupSpeed = 1.18;  // 192 rows against 128, d = 64, H200 (2026-11-24)
  auto time = [&](int block_m, double speed) {
    int64_t items = 0;
    for (size_t b = 0; b + 1 < cu_q.size(); ++b) items += (cu_q[b + 1] - cu_q[b] + block_m - 1) / block_m;
    items *= s.num_q_heads;
    return double((items + sms - 1) / sms) * block_m / speed;
  };
  return time(192, kThreeWarpgroupSpeed) < time(kPrefillBlockM, 1.0) ? 192 : kPrefillBlockM;
}

void validate_prefill_attention(const PrefillAttentionShape& s, const std::vector<int>& cu_q,
                                const std::vector<int>& cu_k) {
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
    bad("head_dim must be 64, 128 or 256, got " + std::to_string(s.head_dim));
  if (s.head_dim == 256 && s.mainloop == "sm80")
    bad("head_dim 256 runs on the sm90 kernel (the sm80 kernel takes 64 or 128)");
  if (s.fp8 && s.head_dim != 128)
    bad("fp8 attention takes head_dim 128, got " + std::to_string(s.head_dim) + " (use bf16 for it)");
  if (s.mainloop != "auto" && s.mainloop != "sm90" && s.mainloop != "sm80")
    bad("mainloop must be auto, sm90 or sm80, got '" + s.mainloop + "'");
  if (s.fp8 && s.mainloop == "sm80") bad("fp8 attention runs on the sm90 kernel (mainloop sm90 or auto on Hopper)");
  if (s.num_kv_heads < 1) bad("num_kv_heads must be >= 1, got " + std::to_string(s.num_kv_heads));
  if (s.num_q_heads < 1 || s.num_q_heads % s.num_kv_heads != 0)
    bad("num_q_heads (" + std::to_string(s.num_q_heads) + ") must be a positive multiple of num_kv_heads (" +
        std::to_string(s.num_kv_heads) + ")");
  if (s.num_q_heads > 65535) bad("num_q_heads must be <= 65535, got " + std::to_string(s.num_q_heads));
  if (!(s.scale >= 0.f) || !std::isfinite(s.scale))
    bad("scale must be finite and >= 0 (0: 1/sqrt(head_dim)), got " + std::to_string(s.scale));
  check_offsets(cu_q, "cu_seqlens_q");
  if (!cu_k.empty()) {
    check_offsets(cu_k, "cu_seqlens_k");
    if (cu_k.size() != cu_q.size())
      bad("cu_seqlens_k has " + std::to_string(cu_k.size()) + " entries, cu_seqlens_q " + std::to_string(cu_q.size()));
  }
}

std::vector<int> prefill_fp8_key_offsets(const std::vector<int>& cu_k, int tile_keys) {
  std::vector<int> out(cu_k.size(), 0);
  int64_t rows = 0;
  for (size_t b = 0; b + 1 < cu_k.size(); ++b) {
    out[b] = int(rows);
    const int64_t len = cu_k[b + 1] - cu_k[b];
    rows += (len + tile_keys - 1) / tile_keys * tile_keys;
    if (rows > INT32_MAX) bad("fp8 keys padded to whole blocks exceed 2^31 - 1 rows at sequence " + std::to_string(b));
  }
  out.back() = int(rows);
  return out;
}

std::vector<PrefillTile> plan_prefill_tiles(const PrefillAttentionShape& s, const std::vector<int>& cu_q,
                                            const std::vector<int>& cu_k_in, int block_n, int block_m) {
  const auto& cu_k = keys_of(cu_q, cu_k_in);
  std::vector<PrefillTile> tiles;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int len_q = cu_q[b + 1] - cu_q[b], len_k = cu_k[b + 1] - cu_k[b];
    for (int t = 0; t * block_m < len_q; ++t)
      tiles.push_back({int(b), t, kv_tiles_for(s, len_q, len_k, t, block_n, block_m)});
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const PrefillTile& a, const PrefillTile& b) { return a.kv_tiles > b.kv_tiles; });
  return tiles;
}

namespace {

double piece_cost(const PrefillPiece& p, const PrefillPieceCosts& c) {
  return p.kv_tiles + c.piece + (p.group >= 0 ? c.split : 0.0);
}

// The work with items [whole, items) as the tail, cut one of two ways: parts_per_item = 0, their key
// tiles end to end in min(sms, tiles) units of near-equal ranges (a unit may hold pieces of two or
// more items: for a tail that is a fraction of a round); parts_per_item = k, each item in k ranges, a
// unit each (pieces that start and end with an item's: for tails of few items). Its simulated end
// in `makespan`.
// item_costs: every item's cost whole (the draws before the tail).
PrefillWork tail_work(const std::vector<PrefillTile>& tiles, int heads, int sms, int64_t whole, int parts_per_item,
                      const PrefillPieceCosts& pc, const std::vector<double>& item_costs) {
  PrefillWork w;
  const int64_t n_tiles = int64_t(tiles.size());
  w.items = n_tiles * heads;
  w.whole = whole;
  auto kv = [&](int64_t item) { return int64_t(tiles[size_t(item % n_tiles)].kv_tiles); };
  std::vector<std::vector<PrefillPiece>> per_unit;
  // Item i's key tiles [a, b) as pieces of the units u0 .. (bounds: the ranges' ends in the item).
  auto split = [&](int64_t i, int u0, const std::vector<int64_t>& ends) {
    const int parts = int(ends.size());
    if (parts == 1) {
      per_unit[size_t(u0)].push_back({int(i), 0, int(kv(i)), -1, 0, 0, 1});
      return;
    }
    const int group = w.groups++, first = w.slots;
    w.slots += parts;
    int64_t a = 0;
    for (int k = 0; k < parts; ++k) {
      per_unit[size_t(u0 + k)].push_back({int(i), int(a), int(ends[size_t(k)] - a), group, first + k, first, parts});
      a = ends[size_t(k)];
    }
  };
  if (parts_per_item > 0) {
    for (int64_t i = whole; i < w.items; ++i) {
      const int64_t n = kv(i), k = std::max<int64_t>(1, std::min<int64_t>(parts_per_item, n));
      std::vector<int64_t> ends;
      for (int64_t j = 1; j <= k; ++j) ends.push_back(n * j / k);
      const int u0 = int(per_unit.size());
      per_unit.resize(per_unit.size() + size_t(k));
      split(i, u0, ends);
    }
  } else {
    int64_t total = 0;
    for (int64_t i = whole; i < w.items; ++i) total += kv(i);
    const int units = int(std::max<int64_t>(1, std::min<int64_t>(sms, total)));
    per_unit.resize(size_t(units));
    std::vector<int64_t> bound(size_t(units) + 1);
    for (int u = 0; u <= units; ++u) bound[size_t(u)] = total * u / units;
    // The unit holding key position x (x == total: the last unit).
    auto unit_of = [&](int64_t x) {
      return std::min<int>(units - 1, int(std::upper_bound(bound.begin(), bound.end(), x) - bound.begin()) - 1);
    };
    int64_t pos = 0;
    for (int64_t i = whole; i < w.items; ++i) {
      const int64_t n = kv(i);
      const int u0 = unit_of(pos), u1 = n > 0 ? unit_of(pos + n - 1) : u0;
      std::vector<int64_t> ends;
      for (int u = u0; u <= u1; ++u) ends.push_back(std::min(pos + n, bound[size_t(u) + 1]) - pos);
      split(i, u0, ends);
      pos += n;
    }
  }
  std::vector<double> costs(item_costs.begin(), item_costs.begin() + whole);
  w.unit_offsets.push_back(0);
  for (const auto& pieces : per_unit) {
    double c = 0.0;
    for (const PrefillPiece& p : pieces) c += piece_cost(p, pc), w.pieces.push_back(p);
    costs.push_back(c);
    w.unit_offsets.push_back(int(w.pieces.size()));
  }
  w.makespan = prefill_draws_end(costs, sms);
  return w;
}

}  // namespace

double prefill_draws_end(const std::vector<double>& costs, int sms) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free;
  for (int i = 0; i < sms; ++i) free.push(0.0);
  double end = 0.0;
  for (double c : costs) {
    const double t = free.top() + c;
    free.pop();
    free.push(t);
    end = std::max(end, t);
  }
  return end;
}

PrefillWork plan_prefill_work(const std::vector<PrefillTile>& tiles, int heads, int sms, bool split,
                              const PrefillPieceCosts& pc) {
  if (heads < 1 || sms < 1) bad("plan_prefill_work needs heads >= 1 and sms >= 1");
  if (!(pc.piece >= 0) || !(pc.split >= 0)) bad("plan_prefill_work needs piece costs >= 0");
  PrefillWork best;
  best.items = best.whole = int64_t(tiles.size()) * heads;
  std::vector<double> costs;
  for (int64_t i = 0; i < best.items; ++i)
    costs.push_back(tiles[size_t(i % int64_t(tiles.size()))].kv_tiles + pc.piece);
  best.makespan = best.makespan_whole = prefill_draws_end(costs, sms);
  if (!split || best.items == 0) return best;
  const double whole_end = best.makespan;
  const int64_t rest = best.items % sms;
  for (int t = 0; t <= 2; ++t) {
    const int64_t tail = rest + int64_t(t) * sms;
    if (tail == 0 || tail > best.items) continue;
    for (int parts = 0; parts <= kPrefillMaxParts; parts += parts == 0 ? 2 : 1) {
      PrefillWork w = tail_work(tiles, heads, sms, best.items - tail, parts, pc, costs);
      w.makespan_whole = whole_end;
      if (w.makespan <= 0.98 * whole_end && w.makespan < best.makespan) best = std::move(w);
    }
  }
  return best;
}

int TileGraph::add_prefill_attention(std::string name, const PrefillAttentionShape& s, const std::vector<int>& cu_q,
                                     const std::vector<int>& cu_k_in, int block_m, int block_n,
                                     const PrefillAttentionTensorIds& t) {
  validate_prefill_attention(s, cu_q, cu_k_in);
  const std::vector<int>& cu_k = keys_of(cu_q, cu_k_in);
  auto bad_op = [&](const std::string& what) { return InvalidArgument("op '" + name + "': " + what); };
  if (block_m < 1 || block_n < 1)
    throw bad_op("block_m " + std::to_string(block_m) + " and block_n " + std::to_string(block_n) + " must be >= 1");
  const int64_t D = s.head_dim, qd = int64_t(s.num_q_heads) * D, kvd = int64_t(s.num_kv_heads) * D;
  auto expect = [&](int id, const char* what, int64_t rows, int64_t col0, int64_t cols) {
    check_tensor(id, what);
    const Tensor& T = tensors_[id];
    if (T.rows != rows || col0 < 0 || T.cols < col0 + cols)
      throw bad_op(std::string(what) + " is " + std::to_string(T.rows) + "x" + std::to_string(T.cols) + ", expected " +
                   std::to_string(rows) + " rows holding columns " + std::to_string(col0) + ".." +
                   std::to_string(col0 + cols));
  };
  expect(t.q, "q", cu_q.back(), t.q_col, qd);
  expect(t.k, "k", cu_k.back(), t.k_col, kvd);
  expect(t.v, "v", cu_k.back(), t.v_col, kvd);
  expect(t.out, "out", cu_q.back(), 0, qd);
  const std::vector<PrefillTile> plan = plan_prefill_tiles(s, cu_q, cu_k, block_n, block_m);
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::PrefillAttention;
  o.m = cu_q.back(), o.n = qd, o.k = cu_k.back();
  o.a = t.q, o.b = t.k, o.c = t.out;
  // Not a grid over the output (packed sequences' tiles start at their own rows): consumers find
  // their producers by overlap. The order grid is (head, the plan's tile): tm = the head, tn = the
  // tile, numbered row-major as tile_id expects, so the row-major order is the kernel's, head by head.
  o.tiling.bm = block_m, o.tiling.bn = D, o.tiling.bk = block_n, o.tiling.split_k = 1;
  o.grid_m = s.num_q_heads, o.grid_n = int64_t(plan.size());
  o.first_tile = num_tiles();
  const int group = s.num_q_heads / s.num_kv_heads;
  for (int h = 0; h < s.num_q_heads; ++h)
    for (size_t i = 0; i < plan.size(); ++i) {
      const PrefillTile& p = plan[i];
      const int64_t q0 = cu_q[p.seq] + int64_t(p.q_tile) * block_m, q1 = std::min<int64_t>(q0 + block_m, cu_q[p.seq + 1]);
      const int64_t keys = std::min<int64_t>(int64_t(p.kv_tiles) * block_n, cu_k[p.seq + 1] - cu_k[p.seq]);
      const int kvh = h / group;
      Tile tile;
      tile.op = static_cast<int>(ops_.size());
      tile.tm = h, tile.tn = int64_t(i);
      tile.reads.push_back({t.q, q0, q1, t.q_col + h * D, t.q_col + (h + 1) * D});
      if (keys > 0) {
        tile.reads.push_back({t.k, cu_k[p.seq], cu_k[p.seq] + keys, t.k_col + kvh * D, t.k_col + (kvh + 1) * D});
        tile.reads.push_back({t.v, cu_k[p.seq], cu_k[p.seq] + keys, t.v_col + kvh * D, t.v_col + (kvh + 1) * D});
      }
      tile.writes.push_back({t.out, q0, q1, h * D, (h + 1) * D});
      tile.flops = 4.0 * double(D) * double(q1 - q0) * double(keys);  // the mask's savings not counted
      tiles_.push_back(std::move(tile));
    }
  return finish_op(std::move(o));
}

double prefill_attention_flops(const PrefillAttentionShape& s, const std::vector<int>& cu_q,
                               const std::vector<int>& cu_k_in) {
  const auto& cu_k = keys_of(cu_q, cu_k_in);
  double pairs = 0;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int64_t lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    if (!s.causal) {
      pairs += double(lq) * double(lk);
      continue;
    }
    // Row i sees keys 0 .. min(lk - 1, i + lk - lq).
    for (int64_t i = 0; i < lq; ++i) pairs += double(std::clamp<int64_t>(i + lk - lq + 1, 0, lk));
  }
  return 4.0 * s.head_dim * s.num_q_heads * pairs;
}

}  // namespace tw
