"""The tile-traffic model: tile graphs, orders, simulate, bounds and search.

Every function checks its arguments and raises ``tileweave.InvalidArgument`` (a ``ValueError``)
naming the bad one. Results are plain dataclasses with ``to_dict()`` and ``to_json()``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from . import _tileweave as _tw

InvalidArgument = _tw.InvalidArgument
Graph = _tw.Graph


class _Result:
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, indent: Optional[int] = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _check_int(value, name: str) -> int:
    # bool is an int in Python; a True tile size is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {value!r}")
    return value


def _tile(tile) -> Optional[Tuple[int, int, int]]:
    if tile is None:
        return None
    if not isinstance(tile, (tuple, list)) or len(tile) != 3:
        raise InvalidArgument(f"tile must be (bm, bn, bk), got {tile!r}")
    return tuple(_check_int(v, f"tile[{i}]") for i, v in enumerate(tile))


# ---- graphs ----


def ffn_graph(model: str = "llama3-8b", m: int = 16, d: Optional[int] = None, ffn: Optional[int] = None,
              tile: Optional[Sequence[int]] = None, split_k: int = 1) -> Graph:
    """The FFN of a model preset ("llama3-8b", "llama3-70b", "chain") for m tokens: gate/up GEMM
    (with SiLU * mul) then down GEMM. d/ffn override the preset's sizes; tile is (bm, bn, bk)
    (default 128x128x64 clipped to the problem); split_k cuts the down GEMM's K."""
    if not isinstance(model, str):
        raise InvalidArgument(f"model must be a str, got {model!r}")
    return _tw.ffn_graph(model, _check_int(m, "m"), None if d is None else _check_int(d, "d"),
                         None if ffn is None else _check_int(ffn, "ffn"), _tile(tile), _check_int(split_k, "split_k"))


def gemm_graph(m: int, n: int, k: int, tile: Optional[Sequence[int]] = None, split_k: int = 1) -> Graph:
    """One GEMM C[m, n] = A[m, k] B[n, k]^T."""
    return _tw.gemm_graph(_check_int(m, "m"), _check_int(n, "n"), _check_int(k, "k"), _tile(tile),
                          _check_int(split_k, "split_k"))


def attention_graph(batch: int, length: int, gpu: str = "h200", split_k: int = 0) -> Graph:
    """Llama-3-8B decode attention -> o_proj for `batch` sequences of `length` cached tokens, tiled
    as the GPU executor plans it for `gpu`."""
    return _tw.attention_graph(_check_int(batch, "batch"), _check_int(length, "length"), gpu,
                               _check_int(split_k, "split_k"))


# ---- the cache ----


@dataclass
class Cache(_Result):
    """The modelled L2: capacity bytes, line (sector) bytes, p tiles in flight, sets LRU partitions."""

    capacity: int
    line: int = 32
    p: int = 1
    sets: int = 1

    @staticmethod
    def for_gpu(gpu: str = "h200", capacity: Optional[int] = None, p: Optional[int] = None, line: int = 32,
                sets: int = 1) -> "Cache":
        """The preset GPU's L2 size and SM count (P), each overridable."""
        g = _tw.gpu_preset(gpu)
        return Cache(capacity=g["l2_bytes"] if capacity is None else capacity, line=line,
                     p=g["sms"] if p is None else p, sets=sets)

    def _args(self) -> Tuple[int, int, int, int]:
        return (_check_int(self.capacity, "cache.capacity"), _check_int(self.line, "cache.line"),
                _check_int(self.p, "cache.p"), _check_int(self.sets, "cache.sets"))


def _cache(cache: Optional[Cache]) -> Cache:
    if cache is None:
        return Cache.for_gpu("h200")
    if not isinstance(cache, Cache):
        raise InvalidArgument(f"cache must be a tileweave.Cache, got {type(cache).__name__}")
    return cache


def gpu_preset(name: str) -> dict:
    """{"name", "l2_bytes", "sms", "read_tbps"} of "h100" | "h200" | "a100"."""
    return _tw.gpu_preset(name)


# ---- orders ----


@dataclass
class Schedule(_Result):
    """An order of a graph's tiles: ticket i of the GPU executor runs tile order[i]."""

    name: str
    order: List[int]


def order(graph: Graph, spec: str) -> Schedule:
    """The named order `spec` (see orders()); e.g. "col_major", "grouped:8", "dataflow/col_major"."""
    if not isinstance(spec, str):
        raise InvalidArgument(f"spec must be a str, got {spec!r}")
    name, tiles = _tw.make_order(graph, spec)
    return Schedule(name, list(tiles))


def orders(graph: Graph) -> List[str]:
    """Every named order that applies to the graph."""
    return list(_tw.named_orders(graph))


def order_catalog() -> List[dict]:
    return [{"spec": s, "description": d, "chain_only": c} for s, d, c in _tw.order_catalog()]


def schedule_from_json(graph: Graph, text: str) -> Schedule:
    """A custom order as JSON ({"name": ..., "order": [...]}), validated against the graph."""
    name, tiles = _tw.schedule_from_json(graph, text)
    return Schedule(name, list(tiles))


def schedule_to_json(graph: Graph, schedule: Schedule) -> str:
    return _tw.schedule_to_json(graph, schedule.name, list(schedule.order))


OrderArg = Union[str, Schedule, Sequence[int]]


def _schedule(graph: Graph, o: OrderArg) -> Schedule:
    if isinstance(o, str):
        return order(graph, o)
    if isinstance(o, Schedule):
        return o
    if isinstance(o, (list, tuple)):
        return Schedule("custom", [_check_int(t, f"order[{i}]") for i, t in enumerate(o)])
    raise InvalidArgument(f"order must be a spec str, a Schedule or a list of tile ids, got {type(o).__name__}")


# ---- simulate, bounds, search ----


@dataclass
class TensorTraffic(_Result):
    name: str
    role: str
    dram_read: int
    dram_write: int
    hit_bytes: int
    requested_bytes: int


@dataclass
class Report(_Result):
    """DRAM bytes one order moves. trace (with simulate(..., trace=True)): after every tile,
    (tile, cumulative dram_read, dram_write, hit_bytes)."""

    order: str
    dram_read: int
    dram_write: int
    hit_bytes: int
    requested_bytes: int
    per_tensor: List[TensorTraffic] = field(default_factory=list)
    trace: List[Tuple[int, int, int, int]] = field(default_factory=list)

    @property
    def dram_total(self) -> int:
        return self.dram_read + self.dram_write

    @property
    def hit_rate(self) -> float:
        return self.hit_bytes / self.requested_bytes if self.requested_bytes else 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dram_total"], d["hit_rate"] = self.dram_total, self.hit_rate
        return d


def simulate(graph: Graph, order: OrderArg = "dataflow/col_major", cache: Optional[Cache] = None,
             trace: bool = False) -> Report:
    """Replays the order over the cache with cache.p tiles in flight; the DRAM bytes it causes."""
    s = _schedule(graph, order)
    r = _tw.simulate(graph, s.name, s.order, *_cache(cache)._args(), bool(trace))
    return Report(order=r["order"], dram_read=r["dram_read"], dram_write=r["dram_write"], hit_bytes=r["hit_bytes"],
                  requested_bytes=r["requested_bytes"], per_tensor=[TensorTraffic(**t) for t in r["per_tensor"]],
                  trace=[tuple(t) for t in r["trace"]])


@dataclass
class Bound(_Result):
    name: str
    bytes: int
    note: str


@dataclass
class Bounds(_Result):
    """Lower bounds on any order's DRAM bytes; best is the largest."""

    compulsory_read: int
    compulsory_write: int
    best: int
    bounds: List[Bound]


def bounds(graph: Graph, cache: Optional[Cache] = None) -> Bounds:
    b = _tw.bounds(graph, *_cache(cache)._args())
    return Bounds(b["compulsory_read"], b["compulsory_write"], b["best"], [Bound(**x) for x in b["bounds"]])


@dataclass
class SearchResult(_Result):
    """The best order found. exact: num_optimal_orders/states; heuristic: seed_order/evaluations."""

    method: str
    traffic: int
    schedule: Schedule
    num_optimal_orders: Optional[int] = None
    count_saturated: Optional[bool] = None
    states: Optional[int] = None
    seed_order: Optional[str] = None
    seed_traffic: Optional[int] = None
    evaluations: Optional[int] = None


def search(graph: Graph, cache: Optional[Cache] = None, method: str = "auto", time_limit: float = 10.0,
           max_states: int = 5_000_000, seed: int = 1, max_evaluations: int = 0) -> SearchResult:
    """The order with the least DRAM traffic: "exact" (P = 1, small graphs), "heuristic"
    (annealing from the best named order), or "auto" (exact for <= 20 tiles at P = 1)."""
    if not isinstance(method, str):
        raise InvalidArgument(f"method must be a str, got {method!r}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)):
        raise InvalidArgument(f"time_limit must be a number of seconds, got {time_limit!r}")
    if _check_int(seed, "seed") < 0:
        raise InvalidArgument(f"seed must be >= 0, got {seed}")
    r = _tw.search(graph, *_cache(cache)._args(), method, float(time_limit), _check_int(max_states, "max_states"),
                   _check_int(seed, "seed"), _check_int(max_evaluations, "max_evaluations"))
    extra = {k: r[k] for k in ("num_optimal_orders", "count_saturated", "states", "seed_order", "seed_traffic",
                               "evaluations") if k in r}
    return SearchResult(method=r["method"], traffic=r["traffic"], schedule=Schedule(r["order_name"], list(r["order"])),
                        **extra)
