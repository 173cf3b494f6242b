"""tileweave: chains of GPU ops run as one dataflow of tiles.

The host traffic model is always here (no GPU, no torch needed)::

    import tileweave as tw
    g = tw.ffn_graph("llama3-8b", m=16)
    print(tw.simulate(g, "dataflow/col_major", tw.Cache.for_gpu("h200")).dram_total)

The GPU ops on torch tensors live in ``tileweave.ops`` (imports torch; needs a CUDA build:
``TILEWEAVE_CUDA=1 pip install .``). docs/python.md has the whole API.
"""

from . import _tileweave
from .model import (
    Bound,
    Bounds,
    Cache,
    Graph,
    InvalidArgument,
    Report,
    Schedule,
    SearchResult,
    TensorTraffic,
    attention_graph,
    bounds,
    ffn_graph,
    gemm_graph,
    gpu_preset,
    order,
    order_catalog,
    orders,
    schedule_from_json,
    schedule_to_json,
    search,
    simulate,
)

__version__ = "0.1.0"

# True when this build holds the GPU ops (built with TILEWEAVE_CUDA=1 and nvcc).
has_cuda: bool = bool(_tileweave.has_cuda)

__all__ = [
    "Bound", "Bounds", "Cache", "Graph", "InvalidArgument", "Report", "Schedule", "SearchResult", "TensorTraffic",
    "attention_graph", "bounds", "ffn_graph", "gemm_graph", "gpu_preset", "has_cuda", "order", "order_catalog",
    "orders", "schedule_from_json", "schedule_to_json", "search", "simulate",
]
