"""The traffic model through the Python package (CPU only; CI runs these in a fresh venv)."""

import json
import subprocess
import sys

import pytest

import tileweave as tw

SMALL_CACHE = tw.Cache(capacity=256 << 10, p=4)


@pytest.fixture(scope="module")
def ffn():
    return tw.ffn_graph("llama3-8b", m=64, d=512, ffn=1024, tile=(32, 64, 64))


def test_import_needs_no_torch():
    # In a fresh interpreter: other test files here import torch.
    code = "import sys, tileweave; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "import tileweave imported torch"


def test_graph_shapes(ffn):
    ops = ffn.ops()
    assert [o["kind"] for o in ops] == ["gemm_silu_mul", "gemm"]
    # gate/up: 64/32 x 1024/64 tiles; down: 64/32 x 512/64.
    assert ops[0]["num_tiles"] == 2 * 16 and ops[1]["num_tiles"] == 2 * 8
    assert ffn.num_tiles == 48
    assert {t["name"] for t in ffn.tensors()} >= {"x", "h", "y"}
    tile = ffn.tile(ops[1]["first_tile"])
    assert tile["op"] == 1 and tile["deps"], "a down tile depends on gate/up tiles"


def test_default_tile_is_clipped_to_the_problem():
    g = tw.gemm_graph(16, 4096, 4096)
    assert g.ops()[0]["tile"] == (16, 128, 64)


@pytest.mark.parametrize("spec", ["row_major", "col_major", "hilbert", "grouped:2", "dataflow/col_major",
                                  "chain_rows:1", "kslices/col_major"])
def test_every_order_is_at_least_the_bound(ffn, spec):
    b = tw.bounds(ffn, SMALL_CACHE)
    r = tw.simulate(ffn, spec, SMALL_CACHE)
    assert r.order == spec
    assert b.best >= b.compulsory_read + b.compulsory_write > 0
    assert r.dram_total >= b.best
    assert sum(t.dram_read for t in r.per_tensor) == r.dram_read
    assert 0.0 <= r.hit_rate <= 1.0


def test_orders_and_catalog(ffn):
    names = tw.orders(ffn)
    assert "dataflow/col_major" in names and "chain_half_rows" in names
    assert "chain_rows:1" not in tw.orders(tw.gemm_graph(64, 64, 64)), "chain orders need two ops"
    assert any(c["spec"] == "hilbert" for c in tw.order_catalog())


def test_an_order_is_a_permutation(ffn):
    s = tw.order(ffn, "col_major")
    assert sorted(s.order) == list(range(ffn.num_tiles))


def test_simulate_a_schedule_or_a_list_the_same_as_its_spec(ffn):
    s = tw.order(ffn, "snake")
    by_spec = tw.simulate(ffn, "snake", SMALL_CACHE).dram_total
    assert tw.simulate(ffn, s, SMALL_CACHE).dram_total == by_spec
    assert tw.simulate(ffn, list(s.order), SMALL_CACHE).dram_total == by_spec


def test_cache_size_matters(ffn):
    tiny = tw.simulate(ffn, "row_major", tw.Cache(capacity=16 << 10, p=4)).dram_total
    big = tw.simulate(ffn, "row_major", tw.Cache(capacity=64 << 20, p=4)).dram_total
    assert tiny > big


def test_gpu_preset_cache():
    c = tw.Cache.for_gpu("h100")
    assert (c.capacity, c.p) == (50 << 20, 132)
    assert tw.Cache.for_gpu("a100", p=7).p == 7


def test_trace_is_cumulative(ffn):
    r = tw.simulate(ffn, "col_major", SMALL_CACHE, trace=True)
    assert len(r.trace) == ffn.num_tiles
    reads = [t[1] for t in r.trace]
    assert reads == sorted(reads) and reads[-1] <= r.dram_read


def test_results_are_json(ffn):
    r = tw.simulate(ffn, "col_major", SMALL_CACHE)
    d = json.loads(r.to_json())
    assert d["dram_total"] == r.dram_total and d["per_tensor"][0]["name"] == r.per_tensor[0].name
    b = json.loads(tw.bounds(ffn, SMALL_CACHE).to_json())
    assert b["bounds"][0]["name"] == "compulsory"


def test_schedule_json_round_trip(ffn):
    s = tw.order(ffn, "hilbert")
    back = tw.schedule_from_json(ffn, tw.schedule_to_json(ffn, s))
    assert back.order == s.order and back.name == "hilbert"


def test_exact_search_finds_an_optimum_no_named_order_beats():
    g = tw.gemm_graph(64, 64, 64, tile=(32, 32, 32))
    cache = tw.Cache(capacity=4096, p=1)
    r = tw.search(g, cache, method="exact")
    assert r.method == "exact" and r.num_optimal_orders >= 1
    assert tw.simulate(g, r.schedule, cache).dram_total == r.traffic
    assert all(tw.simulate(g, o, cache).dram_total >= r.traffic for o in tw.orders(g))
    assert r.traffic >= tw.bounds(g, cache).best


def test_heuristic_search_is_no_worse_than_its_seed(ffn):
    r = tw.search(ffn, SMALL_CACHE, method="heuristic", time_limit=1, max_evaluations=200)
    assert r.method == "heuristic" and r.traffic <= r.seed_traffic
    assert tw.simulate(ffn, r.schedule, SMALL_CACHE).dram_total == r.traffic
    assert json.loads(r.to_json())["schedule"]["order"] == r.schedule.order


def test_attention_graph():
    g = tw.attention_graph(batch=4, length=512, gpu="h100")
    kinds = [o["kind"] for o in g.ops()]
    assert kinds == ["decode_attention", "gemm"]
    assert tw.simulate(g, "dataflow/col_major", tw.Cache.for_gpu("h100")).dram_total >= tw.bounds(g).compulsory_read


def test_model_configs_and_random_weights():
    from tileweave import _tileweave

    c = _tileweave.model_config("tiny-llama")
    assert c["num_layers"] == 2 and len(c["rope_inv_freq"]) == c["head_dim"] // 2
    w = _tileweave.random_weights("tiny-llama", 1)
    shape, data = w["model.embed_tokens.weight"]
    assert shape == [c["vocab_size"], c["hidden_size"]] and len(data) == 2 * shape[0] * shape[1]
    assert w == _tileweave.random_weights("tiny-llama", 1), "random weights are deterministic for a seed"


# ---- bad input: a tileweave.InvalidArgument (a ValueError) naming the value ----


@pytest.mark.parametrize("call, words", [
    (lambda: tw.gemm_graph(0, 64, 64), "m must be positive, got 0"),
    (lambda: tw.gemm_graph(64, -3, 64), "n must be positive, got -3"),
    (lambda: tw.gemm_graph(64, 64, 1 << 30), "k = 1073741824 is absurd"),
    (lambda: tw.gemm_graph(64, 64, 64, tile=(128, 32, 32)), "tile[0] (bm) = 128 is larger than m = 64"),
    (lambda: tw.gemm_graph(64, 64, 64, tile=(32, 32)), "tile must be (bm, bn, bk)"),
    (lambda: tw.gemm_graph(64, 64, 64, split_k=0), "split_k must be in [1, 4096], got 0"),
    (lambda: tw.gemm_graph(64.0, 64, 64), "m must be an int, got 64.0"),
    (lambda: tw.gemm_graph(True, 64, 64), "m must be an int, got True"),
    (lambda: tw.ffn_graph("llama9", 16), "unknown model preset 'llama9'"),
    (lambda: tw.ffn_graph("llama3-8b", 16, d=-1), "d must be positive, got -1"),
    (lambda: tw.attention_graph(4, 0), "length must be positive, got 0"),
    (lambda: tw.attention_graph(4, 64, gpu="h900"), "unknown GPU preset 'h900'"),
    (lambda: tw.Cache.for_gpu("v100"), "unknown GPU preset 'v100'"),
    (lambda: tw.simulate(tw.gemm_graph(64, 64, 64), "zigzag"), "unknown order 'zigzag'"),
    (lambda: tw.simulate(tw.gemm_graph(64, 64, 64), "row_major", tw.Cache(capacity=16, line=32)),
     "cache capacity 16 B is smaller than one line"),
    (lambda: tw.simulate(tw.gemm_graph(64, 64, 64), "row_major", tw.Cache(capacity=4096, p=0)),
     "cache.p (tiles in flight) must be in [1, 1000000], got 0"),
    (lambda: tw.simulate(tw.gemm_graph(64, 64, 64), "row_major", cache=4096), "cache must be a tileweave.Cache"),
    (lambda: tw.simulate(tw.gemm_graph(64, 64, 64, tile=(32, 32, 32)), [0, 1, 2]), "order"),
    (lambda: tw.simulate(tw.gemm_graph(64, 64, 64, tile=(32, 32, 32)), [0, 1, 2, "3"]), "order[3] must be an int"),
    (lambda: tw.search(tw.gemm_graph(64, 64, 64), method="magic"), "method must be 'auto', 'exact' or 'heuristic'"),
    (lambda: tw.search(tw.gemm_graph(64, 64, 64), time_limit=-1), "time_limit must be in [0, 86400]"),
    (lambda: tw.search(tw.gemm_graph(64, 64, 64), seed=-1), "seed must be >= 0, got -1"),
    (lambda: tw.search(tw.gemm_graph(64, 64, 64), tw.Cache(capacity=4096, p=2), method="exact"),
     "exact search models one tile in flight (P = 1), got P = 2"),
    (lambda: tw.schedule_from_json(tw.gemm_graph(64, 64, 64), "{not json"), ""),
    (lambda: tw.gemm_graph(64, 64, 64).tile(99), "tile id 99 is out of range [0, 1)"),
])
def test_bad_input_names_the_value(call, words):
    with pytest.raises(tw.InvalidArgument) as e:
        call()
    assert isinstance(e.value, ValueError)
    assert words in str(e.value)


def test_gpu_ops_need_a_cuda_build():
    if tw.has_cuda:
        pytest.skip("this build has the GPU ops (tests/python/gpu covers them)")
    torch = pytest.importorskip("torch", reason="torch is not installed: tileweave.ops imports it")
    from tileweave import ops

    with pytest.raises(RuntimeError, match="built without CUDA"):
        ops.decode_gemm(torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16))
    q = torch.zeros(8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="built without CUDA"):
        ops.attention(q, q, q, cu_seqlens=[0, 8])
