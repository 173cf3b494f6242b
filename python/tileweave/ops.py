"""tileweave's GPU ops on torch tensors (this module imports torch; ``import tileweave`` does not).

Each op runs on the caller's current CUDA stream, reads and writes the tensors in place (no
copies), and is a ``torch.library`` custom op (``torch.ops.tileweave.*``) with a fake
implementation, so it works inside ``torch.compile`` graphs and under CUDA-graph capture.

- ``ffn(x, w_gate_up, w_down)``: the fused FFN, y = (silu(x Wg^T) * (x Wu^T)) Wd^T, one launch;
  ``pack_ffn_weights`` once at load time, then ``ffn_packed(x, packed)`` (about 3% faster).
- ``decode_gemm(x, w)``: y = x W^T on the tile executor (``pack_gemm_weight`` + ``packed=``).
- ``decode_attention(q, k_new, v_new, k_cache, v_cache, lengths, page_table=None)``: one query
  token per sequence, RoPE on q and k_new, k_new/v_new appended to the cache, split-KV attention;
  lengths (and the page table) may stay on the GPU (``check_errors`` reports bad values there).
- ``attention(q, k, v, causal=False, cu_seqlens=None, ...)``: prefill (self-)attention over packed
  sequences of any lengths (q [total_q, Hq, D] with cu_seqlens) or a batch of equal ones
  (q [B, L, Hq, D]), GQA, optional log-sum-exp; sm_90 (H100/H200).
- ``DecodeStep``: a whole Llama/Qwen2 decode step in one launch, state on the device.

Every op keeps a plan per shape (for attention, per cu_seqlens too; decode_attention's lengths
are read by the GPU at run time): its first call for a shape allocates and uploads, so run it once
before capturing a CUDA graph. A plan's workspace is its own: run one shape on one stream at a
time. bf16 tensors, row-major, contiguous, 16-byte aligned, all on one GPU; errors name the
argument.
"""

# No `from __future__ import annotations`: torch.library reads the custom ops' schemas from real annotations.
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import _tileweave as _tw
from .model import InvalidArgument

__all__ = [
    "DecodeStep", "PackedFfnWeights", "PackedGemmWeight", "attention", "check_errors", "clear_plans",
    "decode_attention", "decode_gemm", "ffn", "ffn_packed", "pack_ffn_weights", "pack_gemm_weight", "random_state_dict",
]


# A plain constant, so torch.compile traces the checks below without a graph break.
_HAS_CUDA = bool(_tw.has_cuda)


def _require_cuda() -> None:
    if not _HAS_CUDA:
        raise RuntimeError("tileweave was built without CUDA, so its GPU ops are missing: reinstall on a machine "
                           "with nvcc as `TILEWEAVE_CUDA=1 pip install .` (docs/python.md)")


def _check(t, name: str, shape: Sequence[Optional[int]], dtype=torch.bfloat16, device=None) -> None:
    """dtype, device, rank/shape (None: any size) and layout of one argument, naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise InvalidArgument(f"{name} must be {dtype}, got {t.dtype}")
    if t.device.type != "cuda":
        raise InvalidArgument(f"{name} must be on a CUDA device, got {t.device}")
    if device is not None and t.device != device:
        raise InvalidArgument(f"{name} is on {t.device}, the other tensors on {device}")
    if t.dim() != len(shape):
        raise InvalidArgument(f"{name} must have {len(shape)} dimensions, got shape {tuple(t.shape)}")
    for i, want in enumerate(shape):
        if want is not None and t.shape[i] != want:
            expect = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise InvalidArgument(f"{name} must have shape {expect}, got {tuple(t.shape)} (dimension {i})")
    if not t.is_contiguous():
        raise InvalidArgument(f"{name} must be contiguous (row-major): call .contiguous() first")


def _check_aligned(**tensors: torch.Tensor) -> None:
    # Only on real tensors (fake ones under torch.compile have no address): the kernels copy 16 bytes at a time.
    for name, t in tensors.items():
        if t.data_ptr() % 16:
            raise InvalidArgument(f"{name} must be 16-byte aligned (a view at an odd offset?): call .clone() first")


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


_plans: Dict[tuple, object] = {}


def _plan(kind: str, device: torch.device, *args):
    """The plan object for (kind, device, args), made on first use on that device."""
    key = (kind, device.index, *args)
    plan = _plans.get(key)
    if plan is None:
        with torch.cuda.device(device):
            plan = getattr(_tw, kind)(*args)
        _plans[key] = plan
    return plan


def clear_plans() -> None:
    """Frees every op's plans (device workspaces). Each distinct shape -- and for attention each
    distinct cu_seqlens -- keeps one until then. Graphs that captured a freed plan must not be
    replayed."""
    torch.cuda.synchronize()
    _plans.clear()


_ACTIVATIONS = ("silu", "identity", "relu", "gelu_tanh")


def _activation(activation: str) -> bool:
    """Whether the FFN is gated (silu), after checking the name."""
    if activation not in _ACTIVATIONS:
        raise InvalidArgument(f"activation must be 'silu' (gated: silu(x Wg^T) * (x Wu^T)), or for the plain chain "
                              f"act(x W0^T) 'identity', 'relu' or 'gelu_tanh', got {activation!r}")
    return activation == "silu"


# ---- FFN ----


@torch.library.custom_op("tileweave::ffn", mutates_args=())
def _ffn_op(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, activation: str) -> torch.Tensor:
    m, d = x.shape
    f = w_down.shape[1]
    y = torch.empty((m, d), dtype=x.dtype, device=x.device)
    _check_aligned(x=x, w_gate_up=w_gate_up, w_down=w_down, y=y)
    _plan("FfnPlan", x.device, m, d, f, activation, False).run(x.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                                                                y.data_ptr(), _stream(x.device))
    return y


@_ffn_op.register_fake
def _(x, w_gate_up, w_down, activation):
    return x.new_empty(x.shape)


def ffn(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """y [M, d] = FFN(x [M, d]) in one launch. silu: w_gate_up = cat([W_gate, W_up]) [2F, d]; identity,
    relu, gelu_tanh (the plain chain y = act(x W0^T) W1^T; gelu_tanh as torch's gelu(approximate="tanh")):
    w_gate_up = W0 [F, d]. w_down [d, F]."""
    _require_cuda()
    gated = _activation(activation)
    _check(x, "x", (None, None))
    d = x.shape[1]
    _check(w_down, "w_down", (d, None), device=x.device)
    f = w_down.shape[1]
    _check(w_gate_up, "w_gate_up", ((2 if gated else 1) * f, d), device=x.device)
    return _ffn_op(x, w_gate_up, w_down, activation)


@dataclass
class PackedFfnWeights:
    """W_gate_up and W_down in the fused FFN's streaming layout (pack_ffn_weights)."""

    gate_up: torch.Tensor
    down: torch.Tensor
    d: int
    ffn: int
    activation: str


def pack_ffn_weights(w_gate_up: torch.Tensor, w_down: torch.Tensor, activation: str = "silu") -> PackedFfnWeights:
    """The weights rewritten once (at load time) so each pipeline stage is one contiguous copy.
    Needs an sm_90 GPU (H100/H200)."""
    _require_cuda()
    gated = _activation(activation)
    _check(w_down, "w_down", (None, None))
    d, f = w_down.shape
    _check(w_gate_up, "w_gate_up", ((2 if gated else 1) * f, d), device=w_down.device)
    plan = _plan("FfnPlan", w_down.device, 1, d, f, activation, True)  # the layout does not depend on M
    n_gu, n_down = plan.packed_size()
    gu = torch.empty(n_gu, dtype=torch.bfloat16, device=w_down.device)
    dn = torch.empty(n_down, dtype=torch.bfloat16, device=w_down.device)
    plan.pack(w_gate_up.data_ptr(), w_down.data_ptr(), gu.data_ptr(), dn.data_ptr(), _stream(w_down.device))
    return PackedFfnWeights(gu, dn, d, f, activation)


@torch.library.custom_op("tileweave::ffn_packed", mutates_args=())
def _ffn_packed_op(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ffn_dim: int,
                   activation: str) -> torch.Tensor:
    m, d = x.shape
    y = torch.empty((m, d), dtype=x.dtype, device=x.device)
    _check_aligned(x=x, y=y)
    _plan("FfnPlan", x.device, m, d, ffn_dim, activation, True).run(x.data_ptr(), gate_up.data_ptr(), down.data_ptr(),
                                                                     y.data_ptr(), _stream(x.device))
    return y


@_ffn_packed_op.register_fake
def _(x, gate_up, down, ffn_dim, activation):
    return x.new_empty(x.shape)


def ffn_packed(x: torch.Tensor, packed: PackedFfnWeights) -> torch.Tensor:
    """ffn() with weights from pack_ffn_weights()."""
    _require_cuda()
    if not isinstance(packed, PackedFfnWeights):
        raise TypeError(f"packed must come from pack_ffn_weights(), got {type(packed).__name__}")
    _check(x, "x", (None, packed.d), device=packed.down.device)
    return _ffn_packed_op(x, packed.gate_up, packed.down, packed.ffn, packed.activation)


# ---- decode GEMM ----


@torch.library.custom_op("tileweave::decode_gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, w: torch.Tensor, n: int, packed: bool) -> torch.Tensor:
    m, k = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _check_aligned(x=x, w=w, y=y)
    _plan("GemmPlan", x.device, m, n, k, packed).run(y.data_ptr(), x.data_ptr(), w.data_ptr(), _stream(x.device))
    return y


@_gemm_op.register_fake
def _(x, w, n, packed):
    return x.new_empty((x.shape[0], n))


@dataclass
class PackedGemmWeight:
    """W [N, K] in the decode GEMM's streaming layout (pack_gemm_weight)."""

    data: torch.Tensor
    n: int
    k: int


def pack_gemm_weight(w: torch.Tensor) -> PackedGemmWeight:
    _require_cuda()
    _check(w, "w", (None, None))
    n, k = w.shape
    plan = _plan("GemmPlan", w.device, 1, n, k, True)
    out = torch.empty(plan.packed_size(), dtype=torch.bfloat16, device=w.device)
    plan.pack(w.data_ptr(), out.data_ptr(), _stream(w.device))
    return PackedGemmWeight(out, n, k)


def decode_gemm(x: torch.Tensor, w: Union[torch.Tensor, PackedGemmWeight]) -> torch.Tensor:
    """y [M, N] = x [M, K] W^T, W a torch Linear weight [N, K] (or pack_gemm_weight(W)); K % 8 == 0.
    Needs an sm_90 GPU (H100/H200)."""
    _require_cuda()
    if isinstance(w, PackedGemmWeight):
        _check(x, "x", (None, w.k), device=w.data.device)
        return _gemm_op(x, w.data, w.n, True)
    _check(x, "x", (None, None))
    _check(w, "w", (None, x.shape[1]), device=x.device)
    return _gemm_op(x, w, w.shape[0], False)


# ---- decode attention ----


@torch.library.custom_op("tileweave::decode_attention", mutates_args=("k_cache", "v_cache"))
def _attention_op(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, lengths: torch.Tensor, page_table: Optional[torch.Tensor], scale: float,
                  rope_theta: float, append: bool) -> torch.Tensor:
    b, hq, d = q.shape
    paged = page_table is not None
    out = torch.empty_like(q)
    _check_aligned(q=q, k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache, out=out)
    hkv = k_cache.shape[1]
    # One plan per shape: the lengths and the page table are read by the GPU at run time.
    plan = _plan("AttentionPlan", q.device, b, hq, hkv, d, paged, 0 if paged else k_cache.shape[2],
                 k_cache.shape[2] if paged else 0, k_cache.shape[0] if paged else 0,
                 page_table.shape[1] if paged else 0, scale, rope_theta, append)
    plan.run(q.data_ptr(), k_new.data_ptr(), v_new.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
             lengths.data_ptr(), page_table.data_ptr() if paged else 0, _stream(q.device))
    return out


@_attention_op.register_fake
def _(q, k_new, v_new, k_cache, v_cache, lengths, page_table, scale, rope_theta, append):
    return torch.empty_like(q)


def _int_list(v, name: str) -> List[int]:
    if isinstance(v, torch.Tensor):
        if v.dtype not in (torch.int32, torch.int64):
            raise InvalidArgument(f"{name} must hold integers, got {v.dtype}")
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise InvalidArgument(f"{name} must be a list of ints or an integer tensor, got {type(v).__name__}")
    return v


def _device_ints(t: torch.Tensor, name: str, shape: Tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An integer CUDA tensor as the int32 array the kernel reads (converted on the GPU if int64)."""
    if t.dtype not in (torch.int32, torch.int64):
        raise InvalidArgument(f"{name} must hold integers (int32 or int64), got {t.dtype}")
    if t.device != device:
        raise InvalidArgument(f"{name} is on {t.device}, q on {device}")
    if tuple(t.shape) != shape:
        raise InvalidArgument(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    return t.to(torch.int32).contiguous()


def decode_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, lengths, page_table=None, rope_theta: Optional[float] = 10000.0,
                     scale: Optional[float] = None, append: bool = True) -> torch.Tensor:
    """One decode token per sequence against its KV cache; returns out [B, Hq, D].

    q [B, Hq, D]; k_new, v_new [B, Hkv, D] (before RoPE; written into the cache at row lengths[b] - 1
    when append). Caches: contiguous [B, Hkv, S, D], or paged [num_pages, Hkv, page_size, D] with
    page_table [B, pages_per_seq]. lengths[b]: tokens in sequence b after the append. RoPE is
    rotate-half with base rope_theta (None: none); scale defaults to 1/sqrt(D). Hq/Hkv in 1..8, D 64
    or 128.

    lengths and page_table may live on the GPU (integer CUDA tensors): the kernel reads them when it
    runs -- no host sync, one plan for every length, and a CUDA graph replayed after they change
    uses the new values. Their values are checked there: a call with a bad one returns NaN and
    leaves the caches alone, and check_errors() raises naming it. Lists (or CPU tensors) are checked
    here, before anything runs, then uploaded."""
    _require_cuda()
    _check(q, "q", (None, None, None))
    b, hq, d = q.shape
    _check(k_cache, "k_cache", (None, None, None, d), device=q.device)
    hkv = k_cache.shape[1]
    _check(v_cache, "v_cache", tuple(k_cache.shape), device=q.device)
    _check(k_new, "k_new", (b, hkv, d), device=q.device)
    _check(v_new, "v_new", (b, hkv, d), device=q.device)
    if page_table is None and k_cache.shape[0] != b:
        raise InvalidArgument(f"k_cache (contiguous) must have shape ({b}, {hkv}, S, {d}), got {tuple(k_cache.shape)}"
                              " (a paged cache needs page_table)")
    on_gpu = isinstance(lengths, torch.Tensor) and lengths.device.type == "cuda"
    if page_table is not None and on_gpu != (isinstance(page_table, torch.Tensor) and page_table.device.type == "cuda"):
        raise InvalidArgument("lengths and page_table must both be CUDA tensors (checked on the GPU) or both host "
                              "values (checked here)")
    table = None
    if on_gpu:
        lens = _device_ints(lengths, "lengths", (b,), q.device)
        if page_table is not None:
            if page_table.dim() != 2 or page_table.shape[0] != b:
                raise InvalidArgument(f"page_table must be [batch = {b}, pages_per_seq], got {tuple(page_table.shape)}")
            table = _device_ints(page_table, "page_table", tuple(page_table.shape), q.device)
    else:
        host = [int(x) for x in _int_list(lengths, "lengths")]
        if len(host) != b:
            raise InvalidArgument(f"lengths has {len(host)} entries for batch {b}")
        if page_table is None:
            cap = k_cache.shape[2]
        else:
            rows = _int_list(page_table, "page_table")
            if len(rows) != b or any(not isinstance(r, (list, tuple)) or len(r) != len(rows[0]) for r in rows):
                raise InvalidArgument(f"page_table must be [batch = {b}, pages_per_seq] ints")
            cap = len(rows[0]) * k_cache.shape[2]
        for i, n in enumerate(host):
            if not 1 <= n <= cap:
                raise InvalidArgument(f"lengths[{i}] = {n} is outside [1, {cap}] (the new token and the cache's "
                                      "capacity)")
        if page_table is not None:
            num_pages, page_size = k_cache.shape[0], k_cache.shape[2]
            for i, r in enumerate(rows):
                for j in range((host[i] + page_size - 1) // page_size):
                    if not 0 <= int(r[j]) < num_pages:
                        raise InvalidArgument(f"page_table[{i}][{j}] = {r[j]} is outside [0, {num_pages})")
            table = torch.tensor([[int(p) for p in r] for r in rows], dtype=torch.int32, device=q.device)
        lens = torch.tensor(host, dtype=torch.int32, device=q.device)
    if isinstance(scale, bool) or not (scale is None or isinstance(scale, (int, float))):
        raise InvalidArgument(f"scale must be a number or None, got {scale!r}")
    return _attention_op(q, k_new, v_new, k_cache, v_cache, lens, table, 0.0 if scale is None else float(scale),
                         0.0 if rope_theta is None else float(rope_theta), bool(append))


def check_errors() -> None:
    """Raises InvalidArgument naming the first bad value that decode_attention calls with lengths or a
    page table on the GPU met since the last check (such calls return NaN instead of raising), and
    clears it. Synchronises the device."""
    _require_cuda()
    for key, plan in list(_plans.items()):
        if key[0] == "AttentionPlan":
            msg = plan.take_error()
            if msg:
                raise InvalidArgument(msg)


# ---- prefill attention ----


@torch.library.custom_op("tileweave::attention", mutates_args=())
def _prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: List[int], cu_seqlens_k: List[int],
                causal: bool, scale: float, return_lse: bool, fp8: bool,
                mainloop: str) -> Tuple[torch.Tensor, torch.Tensor]:
    total_q, hq, d = q.shape
    out = torch.empty_like(q)
    # A custom op returns no optional tensor: without return_lse, lse is an empty placeholder.
    lse = torch.empty((hq, total_q) if return_lse else (0,), dtype=torch.float32, device=q.device)
    if total_q == 0:
        return out, lse
    if k.shape[0] == 0:  # no keys at all (and k has no address to hand over): every row sees none
        return out.zero_(), lse.fill_(float("-inf"))
    _check_aligned(q=q, k=k, v=v, out=out)
    plan = _plan("PrefillAttentionPlan", q.device, hq, k.shape[1], d, causal, scale, tuple(cu_seqlens),
                 tuple(cu_seqlens_k), fp8, mainloop)
    plan.run(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr() if return_lse else 0,
             _stream(q.device))
    return out, lse


@_prefill_op.register_fake
def _(q, k, v, cu_seqlens, cu_seqlens_k, causal, scale, return_lse, fp8, mainloop):
    total_q, hq, _ = q.shape
    return torch.empty_like(q), q.new_empty((hq, total_q) if return_lse else (0,), dtype=torch.float32)


def _offsets(v, name: str, rows: int, rows_of: str) -> List[int]:
    """cu_seqlens-style offsets: ints from 0, never decreasing, ending at the tensor's row count."""
    cu = _int_list(v, name)
    if len(cu) < 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in cu):
        raise InvalidArgument(f"{name} must be batch + 1 >= 2 int offsets (0, len_0, len_0 + len_1, ...), "
                              f"got {list(cu[:8])}{' ...' if len(cu) > 8 else ''}")
    if cu[0] != 0:
        raise InvalidArgument(f"{name}[0] must be 0, got {cu[0]}")
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            raise InvalidArgument(f"{name} decreases at {i}: {cu[i - 1]} then {cu[i]}")
    if cu[-1] != rows:
        raise InvalidArgument(f"{name} ends at {cu[-1]}, but {rows_of} has {rows} rows (the lengths must add up "
                              "to them)")
    return list(cu)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, cu_seqlens=None,
              cu_seqlens_k=None, scale: Optional[float] = None, return_lse: bool = False, fp8: bool = False,
              mainloop: str = "auto"):
    """Prefill attention, softmax(scale q k^T) v per sequence and head, in one launch
    (docs/prefill_attention.md). mainloop: "sm90" (wgmma: H100/H200), "sm80" (mma.sync: Ampere,
    Ada, or Hopper too; bf16 only) or "auto" (sm90 on an sm_90 GPU, else sm80). Returns out shaped like q, or (out, lse) with
    return_lse: lse [Hq, total_q] fp32, the natural-log sum of exp(scale q.k) of each row.

    Layouts (bf16): packed sequences as FlashAttention's varlen API, q [total_q, Hq, D] and k, v
    [total_k, Hkv, D], sequence b being rows cu_seqlens[b] .. cu_seqlens[b + 1] (batch + 1 host
    ints: a list, or an int tensor, which is read back); its keys are rows cu_seqlens_k[b] ..
    cu_seqlens_k[b + 1] of k (default: cu_seqlens). Without cu_seqlens, q [B, L, Hq, D] with k, v
    [B, Lk, Hkv, D] is a batch of equal lengths (lse rows b * L + i), and a 3-D q one sequence.

    causal: key j visible to query i iff j <= i + (len_k - len_q) (bottom-right; rows that see no
    key output 0, lse -inf). GQA: Hq a multiple of Hkv. D 64 or 128. scale: 1/sqrt(D) by default.
    fp8: compute in e4m3 (D 128): the op quantizes q, k, v itself (per-token q, per-64-key k, both
    Hadamard-rotated, per-channel v) into buffers of its plan; inputs and output stay bf16. 1.3-1.4x the
    bf16 speed at L >= 4096 on an H200, cosine ~0.998 to the bf16 output (docs/prefill_attention.md).
    The plan depends on the offsets: each distinct cu_seqlens keeps one until clear_plans()."""
    _require_cuda()
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    batched = cu_seqlens is None and q.dim() == 4
    if batched:
        _check(q, "q", (None, None, None, None))
        b, lq, hq, d = q.shape
        _check(k, "k", (b, None, None, d), device=q.device)
        _check(v, "v", tuple(k.shape), device=q.device)
        if cu_seqlens_k is not None:
            raise InvalidArgument("cu_seqlens_k needs cu_seqlens (a packed q [total_q, Hq, D]): "
                                  "q [B, L, Hq, D] has one length for every sequence")
        lk, hkv = k.shape[1], k.shape[2]
        # Views, not copies (all contiguous): B sequences of L rows packed one after another.
        q, k, v = q.view(b * lq, hq, d), k.view(b * lk, hkv, d), v.view(b * lk, hkv, d)
        cu_q, cu_k = [i * lq for i in range(b + 1)], [i * lk for i in range(b + 1)]
    else:
        if q.dim() != 3:
            raise InvalidArgument(f"q must be [total_q, Hq, D] (packed, with cu_seqlens) or [B, L, Hq, D] (without), "
                                  f"got shape {tuple(q.shape)}")
        _check(q, "q", (None, None, None))
        hq, d = q.shape[1], q.shape[2]
        _check(k, "k", (None, None, d), device=q.device)
        _check(v, "v", tuple(k.shape), device=q.device)
        if cu_seqlens is None:
            if cu_seqlens_k is not None:
                raise InvalidArgument("cu_seqlens_k needs cu_seqlens")
            cu_q, cu_k = [0, q.shape[0]], [0, k.shape[0]]  # one sequence
        else:
            cu_q = _offsets(cu_seqlens, "cu_seqlens", q.shape[0], "q")
            if cu_seqlens_k is None:
                if k.shape[0] != q.shape[0]:
                    raise InvalidArgument(f"k has {k.shape[0]} rows and q {q.shape[0]}: keys of other lengths than "
                                          "the queries need cu_seqlens_k")
                cu_k = cu_q
            else:
                cu_k = _offsets(cu_seqlens_k, "cu_seqlens_k", k.shape[0], "k")
                if len(cu_k) != len(cu_q):
                    raise InvalidArgument(f"cu_seqlens_k has {len(cu_k)} entries, cu_seqlens {len(cu_q)} "
                                          "(batch + 1 each)")
    if d not in (64, 128, 256):
        raise InvalidArgument(f"q's head dim D (its last dimension) must be 64, 128 or 256, got {d}")
    if d == 256 and mainloop == "sm80":
        raise InvalidArgument("head dim D = 256 runs on the sm90 kernel (mainloop 'sm90' or 'auto' on Hopper)")
    if not isinstance(fp8, bool):
        raise InvalidArgument(f"fp8 must be True or False, got {fp8!r}")
    if mainloop not in ("auto", "sm90", "sm80"):
        raise InvalidArgument(f"mainloop must be 'auto', 'sm90' or 'sm80', got {mainloop!r}")
    if fp8 and mainloop == "sm80":
        raise InvalidArgument("fp8 attention runs on the sm90 kernel (mainloop 'sm90' or 'auto' on Hopper)")
    if fp8 and d != 128:
        raise InvalidArgument(f"fp8 attention takes head dim D = 128, got {d} (use fp8=False)")
    hkv = k.shape[-2]
    if hq == 0 or hkv == 0 or hq % hkv:
        raise InvalidArgument(f"q's heads (Hq = {hq}) must be a positive multiple of k's (Hkv = {hkv})")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or
                              not (0 < scale < math.inf)):
        raise InvalidArgument(f"scale must be a positive finite number or None (1/sqrt(D)), got {scale!r}")
    out, lse = _prefill_op(q, k, v, cu_q, cu_k, bool(causal), 0.0 if scale is None else float(scale),
                           bool(return_lse), fp8, mainloop)
    if batched:
        out = out.view(b, lq, hq, d)
    return (out, lse) if return_lse else out


# ---- a whole decode step ----


class _DeviceArray:
    """A device buffer torch can view without a copy (__cuda_array_interface__); keeps its owner alive."""

    def __init__(self, owner, ptr: int, shape: Tuple[int, ...], typestr: str):
        self._owner = owner
        # Version 2 (no "stream"): the buffer is written on the caller's stream, which torch reads in order.
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 2,
                                         "strides": None}


class DecodeStep:
    """A whole decode step of a Llama/Qwen2-family model in one launch (docs/decode_step.md).

    config: a named config ("tiny-llama", "llama-3.2-1b", ...) or a folder with config.json.
    Weights: load_state_dict({transformers name: bf16 tensor}) or random_weights(seed). Then
    set_lengths / set_tokens, and step() on the current stream (capturable in a CUDA graph once
    the first step has run): the sampled tokens replace the inputs in ``tokens`` (a zero-copy
    int32 view [batch]) and the lengths grow by one. Needs an sm_90 GPU."""

    def __init__(self, config: str = "tiny-llama", batch: int = 1, max_seq_len: int = 4096, paged: bool = False,
                 page_size: int = 16, keep_logits: bool = False, device: Union[int, str, torch.device, None] = None):
        _require_cuda()
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if self.device.type != "cuda":
            raise InvalidArgument(f"device must be a CUDA device, got {self.device}")
        with torch.cuda.device(self.device):
            self._plan = _tw.StepPlan(config, batch, max_seq_len, paged, page_size, keep_logits)
        self.config = _tw.model_config(config)
        self.keep_logits = keep_logits

    def load_state_dict(self, tensors: Dict[str, torch.Tensor]) -> None:
        raw = {}
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
                raise InvalidArgument(f"weights['{name}'] must be a bf16 tensor, got "
                                      f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
            raw[name] = t.detach().contiguous().view(torch.int16).cpu().numpy().tobytes()
        with torch.cuda.device(self.device):
            self._plan.load_weights(raw)

    def random_weights(self, seed: int = 1) -> None:
        with torch.cuda.device(self.device):
            self._plan.random_weights(seed)

    def set_lengths(self, lengths: Sequence[int]) -> None:
        self._plan.set_lengths(list(lengths), _stream(self.device))

    def set_tokens(self, tokens: Sequence[int]) -> None:
        self._plan.set_tokens(list(tokens), _stream(self.device))

    def step(self) -> None:
        with torch.cuda.device(self.device):
            self._plan.step(_stream(self.device))

    @property
    def lengths(self) -> List[int]:
        return list(self._plan.lengths)

    @property
    def tokens(self) -> torch.Tensor:
        """[batch] int32 on the device: the inputs, then the sampled tokens (a view: later steps update it)."""
        arr = _DeviceArray(self, self._plan.tokens_ptr, (self._plan.batch,), "<i4")
        return torch.as_tensor(arr, device=self.device)

    @property
    def logits(self) -> torch.Tensor:
        """[batch, vocab] fp32 logits of the last step (keep_logits=True), a view."""
        if not self.keep_logits:
            raise InvalidArgument("logits needs DecodeStep(..., keep_logits=True)")
        arr = _DeviceArray(self, self._plan.logits_ptr, (self._plan.batch, self._plan.vocab_size), "<f4")
        return torch.as_tensor(arr, device=self.device)


def random_state_dict(config: str = "tiny-llama", seed: int = 1, device="cuda") -> Dict[str, torch.Tensor]:
    """tileweave's deterministic random weights for a config as bf16 tensors (for tests and references)."""
    out = {}
    for name, (shape, data) in _tw.random_weights(config, seed).items():
        t = torch.frombuffer(bytearray(data), dtype=torch.int16).view(torch.bfloat16).reshape(shape)
        out[name] = t.to(device)
    return out
