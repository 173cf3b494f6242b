// The host traffic model for Python (module tileweave._tileweave): graph builders, orders,
// simulate, bounds and search. Results go back as plain dicts/lists; python/tileweave/model.py
// turns them into dataclasses. Argument names in error messages are the Python ones.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tileweave/graph/attention_graph.hpp"
#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/llm/config.hpp"
#include "tileweave/llm/weights.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/order/bounds.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/order/search.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tw::py {

void bind_cuda_ops(nb::module_& m);  // cuda_ops.cpp (CUDA builds) or below

// A named config ("tiny-llama", "llama-3-8b", ...) or a folder (or file) with a transformers config.json.
ModelConfig config_from(const std::string& name_or_dir) {
  if (std::filesystem::exists(name_or_dir)) return load_hf_config(name_or_dir);
  return named_config(name_or_dir);
}

// {name: bytes of bf16 values} -> HostWeights, every expected tensor checked (name and size).
HostWeights weights_from(const ModelConfig& c, const nb::dict& tensors) {
  HostWeights w;
  for (auto [key, value] : tensors) {
    const std::string name = nb::cast<std::string>(key);
    const nb::bytes b = nb::cast<nb::bytes>(value);
    if (b.size() % 2) throw InvalidArgument("weights['" + name + "'] has an odd number of bytes: not bf16");
    std::vector<uint16_t> bits(b.size() / 2);
    std::memcpy(bits.data(), b.c_str(), b.size());
    w.tensors.emplace(name, std::move(bits));
  }
  w.check(c);
  return w;
}

#ifndef TW_PY_HAVE_CUDA
// Built without CUDA: tileweave.ops raises a clear error when a GPU op is called.
void bind_cuda_ops(nb::module_& m) { m.attr("has_cuda") = false; }
#endif

namespace {

// nb::dict("key"_a = value, ...), which nanobind's dict has no constructor for.
template <class... A>
nb::dict kw(A&&... a) {
  nb::dict d;
  ((d[a.name_] = a.value), ...);
  return d;
}

// A built graph and a line describing it. Shared, because a CacheModel would point into it.
struct Graph {
  std::shared_ptr<TileGraph> g = std::make_shared<TileGraph>();
  std::string description;
};

// The same limits as the CLI: larger problems take the simulator minutes.
constexpr int64_t kMaxDim = int64_t{1} << 20;
constexpr int64_t kMaxTiles = int64_t{1} << 22;

void check_dim(int64_t v, const std::string& what) {
  if (v <= 0) throw InvalidArgument(what + " must be positive, got " + std::to_string(v));
  if (v > kMaxDim) throw InvalidArgument(what + " = " + std::to_string(v) + " is absurd (max " + std::to_string(kMaxDim) + ")");
}

using TileArg = std::optional<std::tuple<int64_t, int64_t, int64_t>>;

// tile=None: 128x128x64 clipped to the problem (the CLI's default); else (bm, bn, bk), each at most
// the problem's size.
Tiling make_tiling(const TileArg& tile, int64_t m, int64_t n, int64_t k, const std::string& mn, const std::string& nn,
                   const std::string& kn) {
  if (!tile) return Tiling{std::min<int64_t>(128, m), std::min<int64_t>(128, n), std::min<int64_t>(64, k), 1, {}};
  const auto [bm, bn, bk] = *tile;
  check_dim(bm, "tile[0] (bm)"), check_dim(bn, "tile[1] (bn)"), check_dim(bk, "tile[2] (bk)");
  auto larger = [](const char* t, int64_t v, const std::string& name, int64_t dim) {
    if (v > dim)
      throw InvalidArgument(std::string(t) + " = " + std::to_string(v) + " is larger than " + name + " = " + std::to_string(dim));
  };
  larger("tile[0] (bm)", bm, mn, m), larger("tile[1] (bn)", bn, nn, n), larger("tile[2] (bk)", bk, kn, k);
  return Tiling{bm, bn, bk, 1, {}};
}

void check_split_k(int64_t split_k) {
  if (split_k < 1 || split_k > 4096) throw InvalidArgument("split_k must be in [1, 4096], got " + std::to_string(split_k));
}

void check_work(int64_t m, int64_t n, int64_t k, const Tiling& t) {
  const int64_t tiles = ((m + t.bm - 1) / t.bm) * ((n + t.bn - 1) / t.bn) * t.split_k;
  if (tiles > kMaxTiles)
    throw InvalidArgument(std::to_string(tiles) + " tiles is absurd (max " + std::to_string(kMaxTiles) + "): use a larger tile");
  if (double(tiles / t.split_k) * double((k + t.bk - 1) / t.bk) > 5e8)
    throw InvalidArgument("more than 5e8 tile K-steps is absurd: use a larger tile");
}

std::string tile_text(const Tiling& t) {
  return std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" + std::to_string(t.bk);
}

Graph ffn_graph(const std::string& model, int64_t m, std::optional<int64_t> d, std::optional<int64_t> ffn,
                const TileArg& tile, int64_t split_k) {
  check_dim(m, "m");
  FfnShape s = model_preset(model, m);
  if (d) check_dim(*d, "d"), s.d = *d;
  if (ffn) check_dim(*ffn, "ffn"), s.f = *ffn;
  check_split_k(split_k);
  Tiling t0 = make_tiling(tile, s.m, s.f, s.d, "m", "ffn", "d"), t1 = make_tiling(tile, s.m, s.d, s.f, "m", "d", "ffn");
  t1.split_k = split_k;
  check_work(s.m, s.f, s.d, t0), check_work(s.m, s.d, s.f, t1);
  Graph g;
  *g.g = build_ffn_graph(s, {t0, t1}).graph;
  g.description = model + " FFN (d " + std::to_string(s.d) + ", ffn " + std::to_string(s.f) +
                  (s.gated ? ", gated" : ", plain chain") + "), M = " + std::to_string(s.m) + ", tiles " + tile_text(t0) +
                  (split_k > 1 ? ", down split-K " + std::to_string(split_k) : "");
  return g;
}

Graph gemm_graph(int64_t m, int64_t n, int64_t k, const TileArg& tile, int64_t split_k) {
  check_dim(m, "m"), check_dim(n, "n"), check_dim(k, "k");
  check_split_k(split_k);
  Tiling t = make_tiling(tile, m, n, k, "m", "n", "k");
  t.split_k = split_k;
  check_work(m, n, k, t);
  Graph g;
  *g.g = build_gemm_graph(m, n, k, t).graph;
  g.description = "GEMM " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ", tiles " +
                  tile_text(t) + (split_k > 1 ? ", split-K " + std::to_string(split_k) : "");
  return g;
}

// Llama-3-8B decode attention -> o_proj as the GPU executor plans it (the CLI's --attention).
Graph attention_graph(int64_t batch, int64_t length, const std::string& gpu, int64_t split_k) {
  check_dim(batch, "batch"), check_dim(length, "length");
  if (batch * length > (int64_t{1} << 21))
    throw InvalidArgument("batch * length = " + std::to_string(batch * length) + " cached tokens is absurd (max 2^21)");
  if (split_k < 0 || split_k > 4096) throw InvalidArgument("split_k must be in [0, 4096] (0: planned), got " + std::to_string(split_k));
  const GpuPreset preset = gpu_preset(gpu);
  DecodeAttentionShape s;
  s.batch = static_cast<int>(batch);
  s.max_seq_len = length;
  s.tiles_per_sm = 2;
  const std::vector<int> lens(s.batch, static_cast<int>(length));
  validate_decode_attention(s, lens, {});
  const DecodePlan plan = plan_decode_for(s, lens, preset.sms);
  const Tiling t = attention_oproj_tiling(s, 4096, static_cast<int>(split_k));
  Graph g;
  *g.g = build_attention_oproj_graph(s, lens, {}, plan, 4096, t, false).graph;
  g.description = "Llama-3-8B decode attention (32/8 heads, d 128) B = " + std::to_string(batch) + ", L = " +
                  std::to_string(length) + ": " + std::to_string(plan.num_tiles) + " attention tiles (" + gpu +
                  " plan); o_proj tiles " + tile_text(t) + ", split-K " + std::to_string(t.split_k);
  return g;
}

CacheConfig cache_config(int64_t capacity, int64_t line, int64_t p, int64_t sets) {
  // CacheConfig's fields are int: refuse what would not fit before narrowing.
  if (p < 1 || p > 1000000) throw InvalidArgument("cache.p (tiles in flight) must be in [1, 1000000], got " + std::to_string(p));
  if (sets < 1 || sets > (1 << 24)) throw InvalidArgument("cache.sets must be in [1, 16777216], got " + std::to_string(sets));
  if (line < 1 || line > (1 << 20)) throw InvalidArgument("cache.line must be in [1, 1048576], got " + std::to_string(line));
  if (capacity > (int64_t{1} << 40)) throw InvalidArgument("cache.capacity = " + std::to_string(capacity) + " is absurd (over 1 TiB)");
  CacheConfig c;
  c.capacity_bytes = capacity;
  c.line_bytes = line;
  c.in_flight = static_cast<int>(p);
  c.sets = static_cast<int>(sets);
  c.validate();
  return c;
}

Schedule to_schedule(const Graph& g, const std::string& name, const std::vector<int>& order) {
  Schedule s{name, order};
  validate(*g.g, s);
  return s;
}

nb::dict report_dict(const TrafficReport& r) {
  nb::list per_tensor;
  for (const TensorTraffic& t : r.per_tensor)
    per_tensor.append(kw("name"_a = t.name, "role"_a = to_string(t.role), "dram_read"_a = t.dram_read,
                               "dram_write"_a = t.dram_write, "hit_bytes"_a = t.hit_bytes,
                               "requested_bytes"_a = t.requested_bytes));
  nb::list trace;
  for (const TraceStep& s : r.trace)
    trace.append(nb::make_tuple(s.tile, s.dram_read, s.dram_write, s.hit_bytes));
  return kw("order"_a = r.order, "dram_read"_a = r.dram_read, "dram_write"_a = r.dram_write,
                  "hit_bytes"_a = r.hit_bytes, "requested_bytes"_a = r.requested_bytes, "per_tensor"_a = per_tensor,
                  "trace"_a = trace);
}

nb::dict simulate_py(const Graph& g, const std::string& name, const std::vector<int>& order, int64_t capacity,
                     int64_t line, int64_t p, int64_t sets, bool trace) {
  CacheConfig c = cache_config(capacity, line, p, sets);
  c.trace = trace;
  const Schedule s = to_schedule(g, name, order);
  TrafficReport r;
  {
    nb::gil_scoped_release release;  // long simulations let other Python threads run
    r = simulate(*g.g, s, c);
  }
  return report_dict(r);
}

nb::dict bounds_py(const Graph& g, int64_t capacity, int64_t line, int64_t p, int64_t sets) {
  const TrafficBounds b = traffic_bounds(*g.g, cache_config(capacity, line, p, sets));
  nb::list list;
  for (const Bound& x : b.bounds) list.append(kw("name"_a = x.name, "bytes"_a = x.bytes, "note"_a = x.note));
  return kw("compulsory_read"_a = b.compulsory_read, "compulsory_write"_a = b.compulsory_write,
                  "best"_a = b.best(), "bounds"_a = list);
}

nb::dict search_py(const Graph& g, int64_t capacity, int64_t line, int64_t p, int64_t sets, const std::string& method,
                   double time_limit, int64_t max_states, uint64_t seed, int64_t max_evaluations) {
  const CacheConfig c = cache_config(capacity, line, p, sets);
  if (method != "auto" && method != "exact" && method != "heuristic")
    throw InvalidArgument("method must be 'auto', 'exact' or 'heuristic', got '" + method + "'");
  if (!(time_limit >= 0) || time_limit > 86400)
    throw InvalidArgument("time_limit must be in [0, 86400] s, got " + std::to_string(time_limit));
  if (max_states < 1) throw InvalidArgument("max_states must be positive, got " + std::to_string(max_states));
  if (max_evaluations < 0) throw InvalidArgument("max_evaluations must be >= 0, got " + std::to_string(max_evaluations));
  const bool exact = method == "exact" || (method == "auto" && g.g->num_tiles() <= 20 && c.in_flight == 1);
  nb::dict out;
  Schedule best;
  if (exact) {
    ExactOptions o;
    o.max_states = max_states;
    o.time_limit_s = time_limit;
    ExactResult r;
    {
      nb::gil_scoped_release release;
      r = exact_search(*g.g, c, o);
    }
    best = r.best;
    best.name = "exact";
    out["method"] = "exact";
    out["traffic"] = r.traffic;
    out["num_optimal_orders"] = r.num_optimal;
    out["count_saturated"] = r.count_saturated;
    out["states"] = r.states;
  } else {
    HeuristicOptions o;
    o.time_limit_s = time_limit;
    o.max_evaluations = max_evaluations;
    o.seed = seed;
    HeuristicResult r;
    {
      nb::gil_scoped_release release;
      r = heuristic_search(*g.g, c, o);
    }
    best = r.best;
    out["method"] = "heuristic";
    out["traffic"] = r.traffic;
    out["seed_order"] = r.seed_order;
    out["seed_traffic"] = r.seed_traffic;
    out["evaluations"] = r.evaluations;
  }
  out["order_name"] = best.name;
  out["order"] = best.order;
  return out;
}

nb::list ops_py(const Graph& g) {
  nb::list out;
  for (const Op& o : g.g->ops()) {
    nb::dict d = kw("name"_a = o.name, "kind"_a = to_string(o.kind), "m"_a = o.m, "n"_a = o.n, "k"_a = o.k,
               "tile"_a = nb::make_tuple(o.tiling.bm, o.tiling.bn, o.tiling.bk), "split_k"_a = o.tiling.split_k,
               "grid"_a = nb::make_tuple(o.grid_m, o.grid_n), "first_tile"_a = o.first_tile, "num_tiles"_a = o.num_tiles);
    out.append(d);
  }
  return out;
}

nb::list tensors_py(const Graph& g) {
  nb::list out;
  for (const Tensor& t : g.g->tensors())
    out.append(kw("name"_a = t.name, "rows"_a = t.rows, "cols"_a = t.cols, "elem_bytes"_a = t.elem_bytes,
                        "role"_a = to_string(t.role)));
  return out;
}

nb::dict tile_py(const Graph& g, int64_t id) {
  if (id < 0 || id >= g.g->num_tiles())
    throw InvalidArgument("tile id " + std::to_string(id) + " is out of range [0, " + std::to_string(g.g->num_tiles()) + ")");
  const Tile& t = g.g->tile(static_cast<int>(id));
  auto regions = [&](const std::vector<Region>& rs) {
    nb::list l;
    for (const Region& r : rs) l.append(nb::make_tuple(g.g->tensor(r.tensor).name, r.r0, r.r1, r.c0, r.c1));
    return l;
  };
  return kw("op"_a = t.op, "tm"_a = t.tm, "tn"_a = t.tn, "ks"_a = t.ks, "k0"_a = t.k0, "k1"_a = t.k1,
                  "deps"_a = t.deps, "reads"_a = regions(t.reads), "writes"_a = regions(t.writes), "flops"_a = t.flops);
}

}  // namespace
}  // namespace tw::py

NB_MODULE(_tileweave, m) {
  using namespace tw;
  using namespace tw::py;
  m.doc() = "tileweave's C++ core: the tile-traffic model and, in CUDA builds, the GPU ops (use the tileweave package)";
  // A ValueError subclass, so `except ValueError` catches bad arguments too.
  nb::exception<InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);

  nb::class_<Graph>(m, "Graph")
      .def_prop_ro("num_tiles", [](const Graph& g) { return g.g->num_tiles(); })
      .def_ro("description", &Graph::description)
      .def("ops", &ops_py)
      .def("tensors", &tensors_py)
      .def("tile", &tile_py, "id"_a);

  m.def("ffn_graph", &ffn_graph, "model"_a, "m"_a, "d"_a.none(), "ffn"_a.none(), "tile"_a.none(), "split_k"_a);
  m.def("gemm_graph", &gemm_graph, "m"_a, "n"_a, "k"_a, "tile"_a.none(), "split_k"_a);
  m.def("attention_graph", &attention_graph, "batch"_a, "length"_a, "gpu"_a, "split_k"_a);

  m.def("gpu_preset", [](const std::string& name) {
    const GpuPreset p = gpu_preset(name);
    return kw("name"_a = p.name, "l2_bytes"_a = p.l2_bytes, "sms"_a = p.sms, "read_tbps"_a = p.read_tbps);
  });
  m.def("gpu_preset_names", &gpu_preset_names);
  m.def("model_preset_names", &model_preset_names);
  m.def("order_catalog", [] {
    nb::list l;
    for (const OrderInfo& o : order_catalog()) l.append(nb::make_tuple(o.spec, o.description, o.chain_only));
    return l;
  });

  m.def("make_order", [](const Graph& g, const std::string& spec) {
    const Schedule s = make_order(*g.g, spec);
    return std::make_tuple(s.name, s.order);
  });
  m.def("named_orders", [](const Graph& g) { return named_orders(*g.g); });
  m.def("validate_order", [](const Graph& g, const std::string& name, const std::vector<int>& order) {
    to_schedule(g, name, order);
  });
  m.def("schedule_to_json", [](const Graph& g, const std::string& name, const std::vector<int>& order) {
    return schedule_to_json(*g.g, to_schedule(g, name, order));
  });
  m.def("schedule_from_json", [](const Graph& g, const std::string& text) {
    const Schedule s = schedule_from_json(*g.g, text);
    return std::make_tuple(s.name, s.order);
  });

  m.def("simulate", &simulate_py, "graph"_a, "name"_a, "order"_a, "capacity"_a, "line"_a, "p"_a, "sets"_a, "trace"_a);
  m.def("bounds", &bounds_py, "graph"_a, "capacity"_a, "line"_a, "p"_a, "sets"_a);
  m.def("search", &search_py, "graph"_a, "capacity"_a, "line"_a, "p"_a, "sets"_a, "method"_a, "time_limit"_a,
        "max_states"_a, "seed"_a, "max_evaluations"_a);

  // The decode step's model configs and weights (host side), for tileweave.ops.DecodeStep and references.
  m.def("model_config", [](const std::string& name_or_dir) {
    const ModelConfig c = config_from(name_or_dir);
    c.validate();
    return kw("name"_a = c.name, "family"_a = to_string(c.family), "vocab_size"_a = c.vocab_size,
                    "hidden_size"_a = c.hidden_size, "intermediate_size"_a = c.intermediate_size,
                    "num_layers"_a = c.num_layers, "num_q_heads"_a = c.num_q_heads, "num_kv_heads"_a = c.num_kv_heads,
                    "head_dim"_a = c.head_dim, "rms_norm_eps"_a = c.rms_norm_eps, "rope_theta"_a = c.rope_theta,
                    "tie_word_embeddings"_a = c.tie_word_embeddings, "qkv_bias"_a = c.qkv_bias,
                    "rope_inv_freq"_a = c.rope_inv_freq());
  }, "name_or_dir"_a);
  m.def("model_config_names", &named_config_names);
  m.def("random_weights", [](const std::string& name_or_dir, uint64_t seed) {
    const ModelConfig c = config_from(name_or_dir);
    const HostWeights w = random_weights(c, seed);
    nb::dict out;
    for (const WeightSpec& spec : expected_weights(c)) {
      const std::vector<uint16_t>& bits = w.at(spec.name);
      out[spec.name.c_str()] = nb::make_tuple(spec.shape, nb::bytes(bits.data(), bits.size() * 2));
    }
    return out;
  }, "name_or_dir"_a, "seed"_a);

  bind_cuda_ops(m);
}
