#!/usr/bin/env python3
"""PyTorch's best whole decode step (Llama / Qwen2 families), timed as DESIGN.md §3 reports it.

  python3 bench/decode_step_torch.py --out DIR [--cases model:batch:kv_len,...] [--merge decode_step.json]
                                     [--config-json [NAME=]PATH ...] [--also max-autotune] [--reps 50]
  python3 bench/decode_step_torch.py --self-test [--device cpu|cuda] [--self-test-compile]

A self-contained decode step (no transformers: own ops, so torch.compile and graph capture are reliable),
random bf16 weights N(0, 0.02) (norm weights 1) and random KV caches, for one new token per sequence:

  embedding gather; per layer: RMSNorm (float32 statistics, weight * x.to(bf16) as transformers), one fused
  q/k/v GEMM (+ bias for Qwen2), rotate-half RoPE at each sequence's position (cos/sin from inv_freq, Llama-3
  scaling where the config has it, computed once per step and cast to bf16 as transformers does), K/V appended
  into a static cache [B, Hkv, S, D] by index (index_put at (batch, position)), SDPA over the cache, o_proj +
  residual, RMSNorm, one fused gate/up GEMM, SiLU * up, down + residual; final norm; LM head; greedy argmax.

The new token goes at position kv_len - 1: the cache holds kv_len - 1 earlier tokens, and after the append
every sequence attends over exactly kv_len positions (L = kv_len; KV bytes = B * L * layers * 2 * Hkv * D * 2).
All sequences of a case have the same length and the cache is sized S = kv_len, so attention runs over the whole
cache with no mask (the "common length" form: no mask tensor to read, and SDPA may use its flash/cuDNN kernels);
ragged lengths use a boolean mask [B, 1, 1, S] (tested by --self-test, not timed). GQA: "gqa" = q [B, Hq, 1, D]
with enable_gqa=True; "fold" = the G = Hq / Hkv query heads of a KV head as G query rows, q [B, Hkv, G, D], no
GQA flag. SDPA picks different kernels for the two, and differently in eager and compiled code (H200, torch 2.11,
Llama-3.2-1B B=1 KV 1024: compiled gqa 1131 us, compiled fold 1268 us, the fold form's attention 3x slower), so
--attn auto (default) times the whole step with each form, eager graph and compiled, and each column keeps the
faster; the row's attn_forms holds both, attn_form_best and the note say which won.

Times: "graph" = the eager step captured in one CUDA graph; "compiled" = torch.compile(step, mode="default",
fullgraph=True, dynamic=False), warmed up, then captured in one CUDA graph (the strongest PyTorch form; with
--also max-autotune also mode "max-autotune-no-cudagraphs" captured the same way). Each time is the median over
--reps replays (>= 20) of one event pair per replay. Weights (>= 2.4 GB) are far larger than L2, so one weight set
is replayed with no rotation. The compiled step's logits are checked against the eager step's first (relative
error; a broken compile is reported, not timed).

Output: DIR/decode_step_torch.json {"gpu", "torch", "date", "cases": [{"model", "batch", "kv_len",
"eager_graph_us", "torch_compile_graph_us", "weights_bytes", "kv_bytes", "floor_us", "note", ...}]}; cases already
in that file with other keys are kept, so cases may be run in several invocations. --merge PATH adds
torch_graph_us / torch_compile_graph_us (and speedup_vs_torch_compile = torch_compile_graph_us / step_us where
the entry has step_us) to the entries of PATH's "cases" with the same model, batch and kv_len.

--self-test: the minimal model against transformers' LlamaForCausalLM / Qwen2ForCausalLM (float32, same weights,
random norms and biases, ragged positions with the mask and the common-length form, both GQA forms), inv_freq
against transformers' rope functions, config.json parsing (4.x and 5.x layouts), and a bf16 comparison against
transformers' own bf16 decode. With --self-test-compile (default on CUDA) the compiled step against the eager one.
"""
import argparse
import datetime
import gc
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

# Inductor / Triton caches in a local folder (no network; reruns skip compilation). Set before torch is imported.
_CACHE_DIR = os.environ.get("TW_TORCH_CACHE_DIR",
                            os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build-gpu", "torch-cache"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_CACHE_DIR, "inductor"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_CACHE_DIR, "triton"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEFAULT_CASES = ("llama-3.2-1b:1:1024,llama-3.2-1b:1:32768,llama-3.2-1b:16:4096,"
                 "llama-3-8b:1:1024,llama-3-8b:16:4096")


# ----------------------------------------------------------------------------------------------------------- config
@dataclass
class ModelCfg:
    name: str
    family: str  # "llama" | "qwen2"
    vocab: int
    hidden: int
    inter: int
    layers: int
    n_q: int
    n_kv: int
    head_dim: int
    eps: float
    theta: float
    rope_scaling: dict = None  # {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    tied: bool = False
    qkv_bias: bool = False
    max_pos: int = 131072

    @property
    def q_dim(self):
        return self.n_q * self.head_dim

    @property
    def kv_dim(self):
        return self.n_kv * self.head_dim

    def weight_bytes(self):
        """bf16 bytes one decode step reads: layer matrices, norms and biases, final norm, LM head (the embedding
        when tied); the gathered embedding rows are not counted (as tileweave's ModelConfig::decode_weight_bytes)."""
        h, per = self.hidden, 0
        per += h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h  # qkv, o
        per += 3 * h * self.inter  # gate, up, down
        per += 2 * h  # two norms
        if self.qkv_bias:
            per += self.q_dim + 2 * self.kv_dim
        return 2 * (self.layers * per + h + self.vocab * h)

    def kv_bytes(self, batch, length):
        return batch * length * self.layers * 2 * self.n_kv * self.head_dim * 2

    def hf_dict(self):
        """A transformers config.json (4.x and 5.x both load it)."""
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[self.family]
        d = {"architectures": [arch], "model_type": self.family, "vocab_size": self.vocab, "hidden_size": self.hidden,
             "intermediate_size": self.inter, "num_hidden_layers": self.layers, "num_attention_heads": self.n_q,
             "num_key_value_heads": self.n_kv, "head_dim": self.head_dim, "rms_norm_eps": self.eps,
             "rope_theta": self.theta, "max_position_embeddings": self.max_pos, "hidden_act": "silu",
             "tie_word_embeddings": self.tied, "torch_dtype": "bfloat16", "initializer_range": 0.02}
        rp = {"rope_type": "default", "rope_theta": self.theta}
        if self.rope_scaling:
            d["rope_scaling"] = dict(self.rope_scaling, rope_type="llama3")
            rp.update(self.rope_scaling, rope_type="llama3")
        d["rope_parameters"] = rp
        if self.family == "llama":
            d["attention_bias"] = False
            d["mlp_bias"] = False
        else:
            d["use_sliding_window"] = False
        return d


def _llama3(factor, low=1.0, high=4.0, orig=8192):
    return {"factor": float(factor), "low_freq_factor": float(low), "high_freq_factor": float(high),
            "original_max_position_embeddings": int(orig)}


NAMED = {
    "llama-3.2-1b": ModelCfg("llama-3.2-1b", "llama", 128256, 2048, 8192, 16, 32, 8, 64, 1e-5, 500000.0,
                             _llama3(32, 1, 4, 8192), tied=True),
    "llama-3-8b": ModelCfg("llama-3-8b", "llama", 128256, 4096, 14336, 32, 32, 8, 128, 1e-5, 500000.0, None,
                           tied=False, max_pos=8192),
    "llama-3.1-8b": ModelCfg("llama-3.1-8b", "llama", 128256, 4096, 14336, 32, 32, 8, 128, 1e-5, 500000.0,
                             _llama3(8, 1, 4, 8192), tied=False),
    "qwen2-0.5b": ModelCfg("qwen2-0.5b", "qwen2", 151936, 896, 4864, 24, 14, 2, 64, 1e-6, 1e6, None, tied=True,
                           qkv_bias=True, max_pos=32768),
    "qwen2-7b": ModelCfg("qwen2-7b", "qwen2", 152064, 3584, 18944, 28, 28, 4, 128, 1e-6, 1e6, None, tied=False,
                         qkv_bias=True, max_pos=32768),
}


def parse_hf_config(d, name):
    """A transformers config.json (4.x: rope_theta + rope_scaling; 5.x: rope_parameters) as a ModelCfg."""
    mt = d.get("model_type") or ""
    archs = d.get("architectures") or []
    if mt not in ("llama", "mistral", "qwen2"):
        mt = ("qwen2" if any("Qwen2" in a for a in archs) else "mistral" if any("Mistral" in a for a in archs)
              else "llama" if any("Llama" in a for a in archs) else mt)
    if mt == "mistral":  # the Llama computation; a sliding window changes nothing within it (tileweave's step
        mt = "llama"     # refuses caches longer than the window)
    if mt not in ("llama", "qwen2"):
        raise ValueError(f"{name}: model_type {d.get('model_type')!r} is not llama, mistral or qwen2")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{name}: hidden_act {d.get('hidden_act')!r} is not silu")
    if d.get("mlp_bias"):
        raise ValueError(f"{name}: mlp_bias is not modelled")
    if mt == "llama" and d.get("attention_bias"):
        raise ValueError(f"{name}: Llama attention_bias (q/k/v and o_proj biases) is not modelled")
    if mt == "qwen2" and d.get("use_sliding_window"):
        raise ValueError(f"{name}: Qwen2 sliding-window attention is not modelled")
    n_q = int(d["num_attention_heads"])
    hidden = int(d["hidden_size"])
    rp = d.get("rope_parameters") or {}
    if isinstance(rp, dict) and "rope_type" not in rp and "type" not in rp and rp and all(isinstance(v, dict) for v in rp.values()):
        raise ValueError(f"{name}: per-layer-type rope_parameters are not modelled")
    rs = d.get("rope_scaling") or {}
    theta = d.get("rope_theta", rp.get("rope_theta", 10000.0))
    scaling = None
    for src in (rs, rp):
        kind = src.get("rope_type", src.get("type"))
        if kind == "llama3":
            scaling = _llama3(src["factor"], src.get("low_freq_factor", 1.0), src.get("high_freq_factor", 4.0),
                              src.get("original_max_position_embeddings", 8192))
            break
        if kind not in (None, "default"):
            raise ValueError(f"{name}: rope type {kind!r} is not modelled")
    hd = d.get("head_dim") or hidden // n_q
    return ModelCfg(name=name, family=mt, vocab=int(d["vocab_size"]), hidden=hidden,
                    inter=int(d["intermediate_size"]), layers=int(d["num_hidden_layers"]), n_q=n_q,
                    n_kv=int(d.get("num_key_value_heads") or n_q), head_dim=int(hd),
                    eps=float(d.get("rms_norm_eps", 1e-6)), theta=float(theta), rope_scaling=scaling,
                    tied=bool(d.get("tie_word_embeddings", False)), qkv_bias=(mt == "qwen2"),
                    max_pos=int(d.get("max_position_embeddings", 131072)))


def load_config_arg(arg):
    """--config-json [NAME=]PATH (a config.json or a folder holding one) -> (name, ModelCfg)."""
    name, _, path = arg.rpartition("=") if "=" in arg else ("", "", arg)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        d = json.load(f)
    if not name:
        stem = os.path.splitext(os.path.basename(path))[0]
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) if stem == "config" else stem
    return name, parse_hf_config(d, name)


def norm_name(s):
    return re.sub(r"[^a-z0-9]", "", str(s).lower())


# ------------------------------------------------------------------------------------------------------------- rope
def rope_inv_freq(cfg):
    """head_dim/2 inverse frequencies in float32, computed as transformers does (default and "llama3" rope)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d))
    s = cfg.rope_scaling
    if not s:
        return inv
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    orig = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    # Long wavelengths (> orig / lo) are slowed by `factor`, short ones (< orig / hi) kept, and the band between
    # blends the two linearly in orig / wavelen.
    scaled = torch.where(wavelen > orig / lo, inv / factor, inv)
    t = (orig / wavelen - lo) / (hi - lo)
    blended = (1 - t) * scaled / factor + t * scaled
    in_band = ~(wavelen < orig / hi) * ~(wavelen > orig / lo)
    return torch.where(in_band, blended, scaled)


# ------------------------------------------------------------------------------------------------------------ model
class DecodeStep(torch.nn.Module):
    """One decode step for B sequences over static KV caches, [B, Hkv, S, D] for each layer's K and V.

    forward(tokens [B] int64, pos [B] int64) -> (next tokens [B] int64, logits [B, V]); the new K/V of sequence b
    are written at pos[b] and it attends over positions 0..pos[b]. mask=False: every pos[b] must be S - 1 (the
    whole cache, no mask). attn: "gqa" | "fold" (see the module doc)."""

    def __init__(self, cfg, batch, s_max, device, dtype=torch.bfloat16, mask=False, attn="gqa"):
        super().__init__()
        self.cfg, self.batch, self.s_max, self.mask, self.attn = cfg, batch, s_max, mask, attn
        self.rope_offset = 0  # self-test hook: RoPE at pos + offset (cache slot pos), to reach long positions
        c, L = cfg, cfg.layers
        z = dict(device=device, dtype=dtype)
        e = lambda *shape: torch.empty(*shape, **z)  # noqa: E731
        self.register_buffer("embed", e(c.vocab, c.hidden))
        self.register_buffer("lm_head", None if c.tied else e(c.vocab, c.hidden))
        self.register_buffer("w_in", e(L, c.hidden))
        self.register_buffer("w_qkv", e(L, c.q_dim + 2 * c.kv_dim, c.hidden))
        self.register_buffer("b_qkv", e(L, c.q_dim + 2 * c.kv_dim) if c.qkv_bias else None)
        self.register_buffer("w_o", e(L, c.hidden, c.q_dim))
        self.register_buffer("w_post", e(L, c.hidden))
        self.register_buffer("w_gate_up", e(L, 2 * c.inter, c.hidden))
        self.register_buffer("w_down", e(L, c.hidden, c.inter))
        self.register_buffer("w_final", e(c.hidden))
        # One K and one V buffer per layer: an index_put_ into a whole graph input is done in place by inductor,
        # while one into a view of a stacked [layers, ...] cache is compiled as a copy of the whole cache.
        for i in range(L):
            self.register_buffer(f"k_cache_{i}", e(batch, c.n_kv, s_max, c.head_dim))
            self.register_buffer(f"v_cache_{i}", e(batch, c.n_kv, s_max, c.head_dim))
        self.register_buffer("inv_freq", rope_inv_freq(c).to(device))
        self.register_buffer("batch_idx", torch.arange(batch, device=device))
        self.register_buffer("seq_idx", torch.arange(s_max, device=device))

    def init_random(self, std=0.02, seed=0, norm_std=0.0, bias_std=0.0):
        g = torch.Generator(device=self.embed.device).manual_seed(seed)
        for t in (self.embed, self.lm_head, self.w_qkv, self.w_o, self.w_gate_up, self.w_down):
            if t is not None:
                t.normal_(0.0, std, generator=g)
        for t in (self.w_in, self.w_post, self.w_final):
            t.fill_(1.0)
            if norm_std:
                t.add_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32).to(t.dtype), alpha=norm_std)
        if self.b_qkv is not None:
            self.b_qkv.zero_()
            if bias_std:
                self.b_qkv.normal_(0.0, bias_std, generator=g)
        for i in range(self.cfg.layers):
            self.kv(i)[0].normal_(0.0, 1.0, generator=g)
            self.kv(i)[1].normal_(0.0, 1.0, generator=g)
        return self

    def kv(self, i):
        """Layer i's K and V caches [B, Hkv, S, D]."""
        return getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")

    @torch.no_grad()
    def load_hf(self, sd):
        """Copy a Llama/Qwen2 transformers state dict (names as saved) into the fused layout."""
        c = self.cfg
        self.embed.copy_(sd["model.embed_tokens.weight"])
        if self.lm_head is not None:
            self.lm_head.copy_(sd["lm_head.weight"])
        self.w_final.copy_(sd["model.norm.weight"])
        for i in range(c.layers):
            p = f"model.layers.{i}."
            self.w_in[i].copy_(sd[p + "input_layernorm.weight"])
            self.w_post[i].copy_(sd[p + "post_attention_layernorm.weight"])
            self.w_qkv[i].copy_(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], 0))
            if self.b_qkv is not None:
                self.b_qkv[i].copy_(torch.cat([sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"], 0))
            self.w_o[i].copy_(sd[p + "self_attn.o_proj.weight"])
            self.w_gate_up[i].copy_(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]], 0))
            self.w_down[i].copy_(sd[p + "mlp.down_proj.weight"])
        return self

    def _rms(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.eps)
        return w * xf.to(x.dtype)

    @staticmethod
    def _rope(x, cos, sin):
        h = x.shape[-1] // 2
        rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
        return x * cos + rot * sin

    def _attend(self, k, v, q, mask):
        c, B = self.cfg, q.shape[0]
        if self.attn == "fold":  # q heads h = j * G + r of KV head j as G query rows
            qf = q.view(B, c.n_kv, c.n_q // c.n_kv, c.head_dim)
            o = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask)
        else:
            o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, enable_gqa=c.n_q != c.n_kv)
        return o.reshape(B, c.q_dim)

    def forward(self, tokens, pos):
        c, B, D = self.cfg, tokens.shape[0], self.cfg.head_dim
        x = self._embed_rows(tokens)
        rpos = pos + self.rope_offset if self.rope_offset else pos
        freqs = rpos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos().to(x.dtype)[:, None, :]
        sin = emb.sin().to(x.dtype)[:, None, :]
        mask = (self.seq_idx[None, :] <= pos[:, None])[:, None, None, :] if self.mask else None
        for i in range(c.layers):
            h = self._rms(x, self.w_in[i])
            qkv = F.linear(h, self.w_qkv[i], None if self.b_qkv is None else self.b_qkv[i])
            q, k, v = qkv.split((c.q_dim, c.kv_dim, c.kv_dim), dim=-1)
            q = self._rope(q.view(B, c.n_q, D), cos, sin)
            k = self._rope(k.view(B, c.n_kv, D), cos, sin)
            kc, vc = self.kv(i)
            kc[self.batch_idx, :, pos] = k
            vc[self.batch_idx, :, pos] = v.view(B, c.n_kv, D)
            x = x + self._reduce(F.linear(self._attend(kc, vc, q, mask), self.w_o[i]))
            h = self._rms(x, self.w_post[i])
            gate, up = F.linear(h, self.w_gate_up[i]).split((c.inter, c.inter), dim=-1)
            x = x + self._reduce(F.linear(F.silu(gate) * up, self.w_down[i]))
        x = self._rms(x, self.w_final)
        logits = F.linear(x, self.embed if self.lm_head is None else self.lm_head)
        return self._pick(logits), logits

    # Hooks for a tensor-parallel rank (bench/decode_step_torch_tp.py); here the whole model's.
    def _embed_rows(self, tokens):
        return self.embed[tokens]

    def _reduce(self, x):  # the sum of the ranks' partial outputs of o_proj / down
        return x

    def _pick(self, logits):  # the greedy tokens
        return logits.argmax(-1)


# ----------------------------------------------------------------------------------------------------------- timing
def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def capture(fn, *args):
    """Warm fn up on a side stream, capture one call in a CUDA graph; returns (graph, outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args)
    torch.cuda.synchronize()
    return g, out


def time_graph(g, reps, warmup=5):
    for _ in range(warmup):
        g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for e0, e1 in ev:
        e0.record()
        g.replay()
        e1.record()
    torch.cuda.synchronize()
    return statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in ev)


def time_form(model, tokens, pos, form, args):
    """Eager graph and compiled graph times of the step with one attention form; returns (dict, notes)."""
    res, notes = {}, []
    model.attn = form
    torch._dynamo.reset()
    g, (_, ref_logits) = capture(model, tokens, pos)
    res["eager_graph_us"] = round(time_graph(g, args.reps), 1)
    ref = ref_logits.clone()
    del g, ref_logits
    line = f"  {form}: graph {res['eager_graph_us']:.1f} us"
    modes = [("default", "torch_compile_graph_us", "compile")]
    if "max-autotune" in args.also:
        modes.append(("max-autotune-no-cudagraphs", "torch_compile_max_autotune_graph_us", "compile_max_autotune"))
    for mode, key, tag in modes:
        torch._dynamo.reset()
        try:
            t0 = time.perf_counter()
            cfn = torch.compile(model, mode=mode, fullgraph=True, dynamic=False)
            _, lg = cfn(tokens, pos)
            torch.cuda.synchronize()
            res[f"{tag}_s"] = round(time.perf_counter() - t0, 1)
            err = rel_err(lg, ref)
            res[f"{tag}_rel_err"] = float(f"{err:.3g}")
            if not err < args.compile_tol:
                notes.append(f"{form} {mode}: logits rel err {err:.3g} vs eager >= {args.compile_tol}: not timed")
                line += f"; {mode}: rel err {err:.3g}, NOT TIMED"
                continue
            g, _ = capture(cfn, tokens, pos)
            res[key] = round(time_graph(g, args.reps), 1)
            del g
            line += f"; {mode} {res[key]:.1f} us (compile {res[f'{tag}_s']:.1f} s, rel err vs eager {err:.2e})"
        except Exception as e:  # noqa: BLE001 - a failed compile is reported, the other timings kept
            notes.append(f"{form} {mode}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            line += f"; {mode}: FAILED ({type(e).__name__})"
        finally:
            torch._dynamo.reset()
    print(line, flush=True)
    del ref
    return res, notes


def run_case(cfg, batch, kv_len, args):
    """Times one case; returns its JSON row."""
    row = {"model": cfg.name, "batch": batch, "kv_len": kv_len, "weights_bytes": cfg.weight_bytes(),
           "kv_bytes": cfg.kv_bytes(batch, kv_len)}
    row["floor_us"] = round((row["weights_bytes"] + row["kv_bytes"]) / (args.floor_tbps * 1e6), 1)
    need = row["weights_bytes"] + cfg.vocab * cfg.hidden * 2 * (not cfg.tied) + row["kv_bytes"]
    free, _ = torch.cuda.mem_get_info()
    if need + (3 << 30) > free:
        row["note"] = f"skipped: needs {need / 2**30:.1f} GiB + 3 GiB, {free / 2**30:.1f} GiB free"
        print(f"  {row['note']}", flush=True)
        return row
    forms = ["gqa", "fold"] if args.attn == "auto" and cfg.n_q != cfg.n_kv else [args.attn if args.attn != "auto" else "gqa"]
    t0 = time.time()
    model = DecodeStep(cfg, batch, kv_len, "cuda").init_random(seed=args.seed)
    tokens = torch.randint(0, cfg.vocab, (batch,), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    pos = torch.full((batch,), kv_len - 1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    print(f"  weights + caches ready ({time.time() - t0:.1f} s)", flush=True)
    notes, per_form = [], {}
    with torch.no_grad():
        for _ in range(2):
            model(tokens, pos)
        torch.cuda.synchronize()
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        eager = []
        for _ in range(5):
            ev0.record()
            model(tokens, pos)
            ev1.record()
            torch.cuda.synchronize()
            eager.append(ev0.elapsed_time(ev1) * 1e3)
        row["eager_us"] = round(statistics.median(eager), 1)  # no graph: CPU-bound launches, for reference
        for form in forms:
            per_form[form], n = time_form(model, tokens, pos, form, args)
            notes += n
    # each column: the faster attention form
    keys = ["eager_graph_us", "torch_compile_graph_us"]
    if "max-autotune" in args.also:
        keys.append("torch_compile_max_autotune_graph_us")
    best = {}
    for key in keys:
        timed = {f: r[key] for f, r in per_form.items() if key in r}
        if timed:
            best[key] = min(timed, key=timed.get)
            row[key] = timed[best[key]]
    for f, r in per_form.items():
        for k in ("compile_s", "compile_rel_err"):
            if k in r and best.get("torch_compile_graph_us", f) == f:
                row[k] = r[k]
    row["attn_forms"] = per_form
    row["attn_form_best"] = best
    which = ", ".join(f"{k.replace('_us', '')}: {v}" for k, v in best.items())
    notes.append(f"attention: SDPA over the whole cache (S = kv_len, no mask), faster of the forms timed "
                 f"({which}); new token at kv_len-1; weights not rotated (>> L2)")
    row["note"] = "; ".join(notes)
    del model, tokens, pos
    gc.collect()
    torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------------------------------ merge/table
def case_key(c):
    model = c.get("model", c.get("name", c.get("shape")))
    batch = c.get("batch", c.get("B"))
    kv = c.get("kv_len", c.get("L", c.get("S")))
    return (norm_name(model), int(batch) if batch is not None else None, int(kv) if kv is not None else None)


def merge_into(path, rows):
    with open(path) as f:
        res = json.load(f)
    by_key = {case_key(r): r for r in rows}
    hits = 0
    for c in res.get("cases", []):
        r = by_key.get(case_key(c))
        if r is None:
            continue
        hits += 1
        for src, dst in (("eager_graph_us", "torch_graph_us"), ("torch_compile_graph_us", "torch_compile_graph_us")):
            if src in r:
                c[dst] = r[src]
        if "torch_compile_graph_us" in r and c.get("step_us"):
            c["speedup_vs_torch_compile"] = round(r["torch_compile_graph_us"] / c["step_us"], 3)
    res["torch_decode_step"] = {"torch": torch.__version__, "method": "own minimal Llama/Qwen2 step, random bf16 "
                                "weights; torch_graph_us: eager ops in one CUDA graph; torch_compile_graph_us: "
                                "torch.compile(mode='default', fullgraph=True, dynamic=False) in one CUDA graph; "
                                "median of per-replay event pairs; bench/decode_step_torch.py"}
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
    print(f"merged into {path}: {hits} of {len(res.get('cases', []))} entries matched")
    for c in res.get("cases", []):
        if "torch_compile_graph_us" in c or "torch_graph_us" in c:
            print(f"  {c.get('model')} B={c.get('batch', c.get('B'))} KV={c.get('kv_len', c.get('L'))}: "
                  f"step {c.get('step_us', '-')} us, torch graph {c.get('torch_graph_us', '-')}, compiled "
                  f"{c.get('torch_compile_graph_us', '-')}, x compiled {c.get('speedup_vs_torch_compile', '-')}")


def print_table(rows, tbps):
    print(f"\n{'model':<14} {'B':>3} {'KV':>6} {'graph us':>9} {'compiled':>9} {'max-at':>9} {'floor us':>9} "
          f"{'comp %fl':>8}  note   (floor = (weights + KV) / {tbps} TB/s)")
    for r in rows:
        f = lambda k: f"{r[k]:9.1f}" if k in r else f"{'-':>9}"  # noqa: E731
        pct = f"{100 * r['floor_us'] / r['torch_compile_graph_us']:7.1f}%" if "torch_compile_graph_us" in r else f"{'-':>8}"
        print(f"{r['model']:<14} {r['batch']:3d} {r['kv_len']:6d} {f('eager_graph_us')} {f('torch_compile_graph_us')} "
              f"{f('torch_compile_max_autotune_graph_us')} {f('floor_us')} {pct}  {r.get('note', '')[:90]}")


# -------------------------------------------------------------------------------------------------------- self-test
TINY = {
    # head_dim 64 with theta 5e5 puts inv_freq in all three llama3 bands; head_dim != hidden / heads on purpose
    "st-llama3": ModelCfg("st-llama3", "llama", 512, 128, 320, 3, 4, 2, 64, 1e-5, 500000.0,
                          _llama3(32, 1, 4, 8192), tied=False),
    "st-llama-tied": ModelCfg("st-llama-tied", "llama", 384, 96, 256, 2, 6, 2, 16, 1e-5, 10000.0, None, tied=True),
    "st-qwen2": ModelCfg("st-qwen2", "qwen2", 448, 128, 288, 2, 4, 2, 32, 1e-6, 1e6, None, tied=True, qkv_bias=True),
    "st-qwen2-mha": ModelCfg("st-qwen2-mha", "qwen2", 320, 64, 160, 2, 4, 4, 16, 1e-6, 1e6, None, tied=False,
                             qkv_bias=True),
    # tileweave's own tiny shapes (ModelConfig named_config): llama3 bands at short range, 7 q heads on 1 KV head
    "tiny-llama": ModelCfg("tiny-llama", "llama", 512, 256, 640, 2, 8, 2, 64, 1e-5, 500000.0, _llama3(8, 1, 4, 64),
                           tied=False, max_pos=4096),
    "tiny-qwen2": ModelCfg("tiny-qwen2", "qwen2", 600, 320, 704, 2, 7, 1, 64, 1e-6, 1e6, None, tied=True,
                           qkv_bias=True, max_pos=4096),
}


def hf_model(cfg, dtype, device, seed, norm_std=0.1, bias_std=0.5, std=0.02):
    import transformers
    d = tempfile.mkdtemp(prefix="tw-selftest-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg.hf_dict(), f)
    hc = transformers.AutoConfig.from_pretrained(d)
    hc.initializer_range = std
    torch.manual_seed(seed)
    try:
        m = transformers.AutoModelForCausalLM.from_config(hc, dtype=dtype, attn_implementation="eager")
    except TypeError:
        m = transformers.AutoModelForCausalLM.from_config(hc, torch_dtype=dtype, attn_implementation="eager")
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype), alpha=norm_std)
            elif n.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g).to(p.dtype) * bias_std)
    return m.to(device).eval(), d


def self_test(args):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    dev = args.device
    torch.manual_seed(0)
    failures = []

    def check(what, value, tol):
        ok = value <= tol
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: {value:.3g} (tol {tol:g})", flush=True)
        if not ok:
            failures.append(what)

    print(f"self-test on {dev}: torch {torch.__version__}, transformers {transformers.__version__}")
    # 1. inv_freq against transformers' rope functions, for the named and tiny configs
    print("inv_freq vs transformers:")
    for cfg in list(NAMED.values()) + list(TINY.values()):
        d = tempfile.mkdtemp(prefix="tw-rope-")
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg.hf_dict(), f)
        hc = transformers.AutoConfig.from_pretrained(d)
        rp = getattr(hc, "rope_parameters", None) or getattr(hc, "rope_scaling", None) or {}
        kind = rp.get("rope_type", rp.get("type", "default")) if isinstance(rp, dict) else "default"
        mod = {"llama": "transformers.models.llama.modeling_llama", "qwen2": "transformers.models.qwen2.modeling_qwen2"}
        rot_cls = getattr(__import__(mod[cfg.family], fromlist=["x"]), {"llama": "LlamaRotaryEmbedding",
                                                                         "qwen2": "Qwen2RotaryEmbedding"}[cfg.family])
        ref = rot_cls(config=hc).inv_freq.float()  # what the model itself uses
        if kind != "default":  # and the rope function directly
            ref2 = ROPE_INIT_FUNCTIONS[kind](hc, "cpu")[0]
            if not torch.equal(ref, ref2):
                failures.append(f"{cfg.name}: transformers' rotary module and rope function disagree")
        mine = rope_inv_freq(cfg)
        check(f"{cfg.name} inv_freq ({kind}) max abs rel diff", ((mine - ref).abs() / ref).max().item(), 0.0)
        if cfg.rope_scaling:
            wl = 2 * math.pi / rope_inv_freq(dataclass_replace(cfg, rope_scaling=None))
            o, s = cfg.rope_scaling["original_max_position_embeddings"], cfg.rope_scaling
            bands = ((wl < o / s["high_freq_factor"]).sum().item(),
                     ((wl >= o / s["high_freq_factor"]) & (wl <= o / s["low_freq_factor"])).sum().item(),
                     (wl > o / s["low_freq_factor"]).sum().item())
            print(f"       llama3 bands (kept, blended, divided): {bands}")
            if cfg.name.startswith("tiny") and min(bands) == 0:
                failures.append(f"{cfg.name}: a llama3 band is empty")
    # 2. config.json parsing: transformers' own saved config (5.x layout) and the 4.x layout
    print("config.json parsing:")
    for cfg in TINY.values():
        m, d = hf_model(cfg, torch.float32, "cpu", 0)
        out = os.path.join(d, "saved")
        m.config.save_pretrained(out)
        with open(os.path.join(out, "config.json")) as f:
            saved = json.load(f)
        for layout, dct in (("saved by transformers", saved), ("4.x keys", {k: v for k, v in cfg.hf_dict().items()
                                                                             if k != "rope_parameters"})):
            got = parse_hf_config(dct, cfg.name)
            same = asdict(got) == asdict(dataclass_replace(cfg, max_pos=got.max_pos))
            print(f"  {'ok  ' if same else 'FAIL'} {cfg.name} ({layout})")
            if not same:
                print(f"       got {asdict(got)}\n       want {asdict(cfg)}")
                failures.append(f"{cfg.name} config parse ({layout})")
    # 3. float32 logits against transformers, ragged positions (mask) and the common-length form, both GQA forms
    print("float32 decode vs transformers (full-sequence forward, eager attention):")
    for cfg in TINY.values():
        m, _ = hf_model(cfg, torch.float32, dev, 1)
        sd = {k: v for k, v in m.state_dict().items()}
        if cfg.tied:
            sd.pop("lm_head.weight", None)
        # sequence b runs its token i at step starts[b] + i; with llama3 scaling, distances long enough (hundreds)
        # for the blended and divided low frequencies to move the logits; RoPE positions start at `off` (both sides)
        lens, starts = ([7, 12, 17], [3, 0, 6]) if not cfg.rope_scaling else ([300, 700, 520], [150, 0, 90])
        off = 20000
        seqs = [torch.randint(0, cfg.vocab, (n,)) for n in lens]
        with torch.no_grad():
            ref = [m(input_ids=s[None].to(dev), position_ids=off + torch.arange(len(s), device=dev)[None]).logits[0].float()
                   for s in seqs]
        for form in ("gqa", "fold"):
            step = DecodeStep(cfg, len(lens), max(lens) + 7, dev, dtype=torch.float32, mask=True, attn=form)
            step.init_random(seed=3)  # caches hold random data: the mask must hide it
            step.load_hf(sd)
            step.rope_offset = off
            worst = 0.0
            with torch.no_grad():
                for t in range(max(s + n for s, n in zip(starts, lens))):
                    idx = [min(max(t - s, 0), n - 1) for s, n in zip(starts, lens)]  # finished/unstarted: repeat
                    tok = torch.tensor([int(seqs[b][i]) for b, i in enumerate(idx)], device=dev)
                    nxt, lg = step(tok, torch.tensor(idx, device=dev))
                    for b, i in enumerate(idx):
                        worst = max(worst, rel_err(lg[b], ref[b][i]))
                        if int(nxt[b]) != int(lg[b].argmax()):
                            failures.append(f"{cfg.name}: argmax")
            check(f"{cfg.name} ragged+mask {form}, RoPE at {off}+: max logits rel err", worst, 1e-4)
            # common length: S = length, whole cache, no mask, at the last position of every sequence
            n = 9
            s2 = [torch.randint(0, cfg.vocab, (n,)) for _ in range(2)]
            with torch.no_grad():
                r2 = [m(input_ids=s[None].to(dev)).logits[0, -1].float() for s in s2]
                st = DecodeStep(cfg, 2, n, dev, dtype=torch.float32, mask=True, attn=form).init_random(seed=4).load_hf(sd)
                for i in range(n - 1):
                    st(torch.tensor([int(s[i]) for s in s2], device=dev), torch.full((2,), i, device=dev))
                st.mask = False
                _, lg = st(torch.tensor([int(s[-1]) for s in s2], device=dev), torch.full((2,), n - 1, device=dev))
            check(f"{cfg.name} common length, no mask, {form}: logits rel err",
                  max(rel_err(lg[b], r2[b]) for b in range(2)), 1e-4)
    # 4. bf16: our step against transformers' own bf16 decode (DynamicCache, one token per forward)
    print("bf16 decode vs transformers bf16 (same weights; both round, so only a loose bound):")
    for cfg in (TINY["st-llama3"], TINY["st-qwen2"], TINY["tiny-qwen2"]):
        m, _ = hf_model(cfg, torch.bfloat16, dev, 2)
        sd = dict(m.state_dict())
        n, B = 20, 2
        seqs = [torch.randint(0, cfg.vocab, (n,)) for _ in range(B)]
        step = DecodeStep(cfg, B, n, dev, mask=True, attn="gqa").init_random(seed=5).load_hf(sd)
        worst = 0.0
        with torch.no_grad():
            caches = [transformers.DynamicCache() for _ in range(B)]
            for i in range(n):
                _, lg = step(torch.tensor([int(s[i]) for s in seqs], device=dev), torch.full((B,), i, device=dev))
                for b in range(B):
                    r = m(input_ids=seqs[b][i:i + 1][None].to(dev), past_key_values=caches[b], use_cache=True)
                    worst = max(worst, rel_err(lg[b], r.logits[0, -1]))
        check(f"{cfg.name} bf16 max logits rel err", worst, 2e-2)
    # 5. the compiled step against the eager one (bf16)
    if args.self_test_compile:
        print("torch.compile vs eager (bf16):")
        for cfg in (TINY["st-llama3"], TINY["tiny-qwen2"]):
            torch._dynamo.reset()
            B, S = 3, 40
            step = DecodeStep(cfg, B, S, dev, attn="gqa").init_random(seed=6, norm_std=0.1, bias_std=0.5)
            tok = torch.randint(0, cfg.vocab, (B,), device=dev)
            pos = torch.full((B,), S - 1, device=dev)
            with torch.no_grad():
                _, ref = step(tok, pos)
                bi = torch.arange(B, device=dev)
                every = lambda j: torch.stack([step.kv(i)[j] for i in range(cfg.layers)])  # noqa: E731
                k_ref, v_ref = every(0)[:, bi, :, pos].clone(), every(1)[:, bi, :, pos].clone()
                rest = every(0)[:, :, :, :-1].clone()
                for i in range(cfg.layers):
                    for c in step.kv(i):
                        c[bi, :, pos] = 0
                cfn = torch.compile(step, mode="default", fullgraph=True, dynamic=False)
                _, lg = cfn(tok, pos)
                check(f"{cfg.name} compiled logits rel err", rel_err(lg, ref), 2e-2)
                check(f"{cfg.name} compiled K/V append rel err", max(rel_err(every(0)[:, bi, :, pos], k_ref),
                                                                     rel_err(every(1)[:, bi, :, pos], v_ref)), 2e-2)
                check(f"{cfg.name} compiled step leaves the rest of the cache",
                      rel_err(every(0)[:, :, :, :-1], rest), 0.0)
                if dev == "cuda":
                    g, (_, lg2) = capture(cfn, tok, pos)
                    g.replay()
                    torch.cuda.synchronize()
                    check(f"{cfg.name} compiled + CUDA graph logits rel err", rel_err(lg2, ref), 2e-2)
                    g, (_, lg3) = capture(step, tok, pos)
                    g.replay()
                    torch.cuda.synchronize()
                    check(f"{cfg.name} eager + CUDA graph logits rel err", rel_err(lg3, ref), 1e-3)
            torch._dynamo.reset()
    print(f"self-test: {'FAILED: ' + ', '.join(failures) if failures else 'all passed'}")
    return 1 if failures else 0


def dataclass_replace(cfg, **kw):
    d = asdict(cfg)
    d.update(kw)
    return ModelCfg(**d)


# ------------------------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default="bench/results/h200", help="folder for decode_step_torch.json")
    ap.add_argument("--cases", default=DEFAULT_CASES, help="model:batch:kv_len,... (models: " + ", ".join(NAMED)
                    + ", or a --config-json name)")
    ap.add_argument("--config-json", action="append", default=[], metavar="[NAME=]PATH",
                    help="a transformers config.json (or its folder), usable in --cases as NAME (default: the "
                         "folder's name, or the file's stem); repeatable")
    ap.add_argument("--merge", default=None, help="decode_step.json whose matching cases get torch_graph_us, "
                    "torch_compile_graph_us, speedup_vs_torch_compile")
    ap.add_argument("--also", default="", help="comma list; 'max-autotune' adds mode max-autotune-no-cudagraphs")
    ap.add_argument("--reps", type=int, default=50, help="graph replays per time (>= 20)")
    ap.add_argument("--attn", choices=("auto", "gqa", "fold"), default="auto",
                    help="auto: time both GQA forms (two compiles per case) and keep the faster for each column")
    ap.add_argument("--compile-tol", type=float, default=0.25,
                    help="compiled-vs-eager logits rel err bound (bf16 rounding alone gives ~4%% at 1B on random "
                         "weights; a broken compile gives ~1)")
    ap.add_argument("--floor-tbps", type=float, default=None,
                    help="read floor for floor_us (default: the floor bench_decode_step measured in the --merge file, "
                         "else DESIGN.md §3's 4.68)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--self-test-compile", action="store_true", help="also compile in the self-test (default on CUDA)")
    ap.add_argument("--device", default=None, help="self-test device (default cuda if available)")
    args = ap.parse_args()
    # The floor the ratios use: bench_decode_step's, measured on this GPU in its run, when merging into it.
    floor_source = "given"
    if args.floor_tbps is None:
        measured = None
        if args.merge and os.path.exists(args.merge):
            with open(args.merge) as f:
                measured = json.load(f).get("floor_read_tbps")
        args.floor_tbps = float(measured) if measured else 4.68
        floor_source = f"measured by bench_decode_step ({args.merge})" if measured else "DESIGN.md §3 (not measured)"

    if args.self_test:
        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        args.self_test_compile = args.self_test_compile or args.device == "cuda"
        sys.exit(self_test(args))
    if not torch.cuda.is_available():
        sys.exit("decode_step_torch.py: timing needs a CUDA GPU (--self-test runs on the CPU)")
    args.reps = max(args.reps, 20)
    configs = dict(NAMED)
    for a in args.config_json:
        name, cfg = load_config_arg(a)
        configs[name] = cfg
    by_norm = {norm_name(k): v for k, v in configs.items()}
    cases = []
    for spec in filter(None, (s.strip() for s in args.cases.split(","))):
        try:
            model, batch, kv = spec.rsplit(":", 2)
            cfg = by_norm[norm_name(model)]
            cases.append((dataclass_replace(cfg, name=model if model in configs else cfg.name), int(batch), int(kv)))
        except (ValueError, KeyError):
            sys.exit(f"bad case {spec!r}: want model:batch:kv_len with model in {sorted(configs)}")

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; inductor cache "
          f"{os.environ['TORCHINDUCTOR_CACHE_DIR']}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode_step_torch.json")
    doc = {"cases": []}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    rows = []
    for cfg, batch, kv in cases:
        t0 = time.time()
        print(f"[{len(rows) + 1}/{len(cases)}] {cfg.name} B={batch} KV={kv}", flush=True)
        try:
            row = run_case(cfg, batch, kv, args)
        except torch.cuda.OutOfMemoryError as e:
            row = {"model": cfg.name, "batch": batch, "kv_len": kv, "weights_bytes": cfg.weight_bytes(),
                   "kv_bytes": cfg.kv_bytes(batch, kv), "note": f"skipped: out of memory ({str(e).splitlines()[0][:120]})"}
        gc.collect()
        torch.cuda.empty_cache()
        print(f"  case done in {time.time() - t0:.0f} s", flush=True)
        rows.append(row)
        # written after every case (a run cut short keeps what it measured); same-key cases are replaced
        new_keys = {case_key(r) for r in rows}
        kept = [c for c in doc.get("cases", []) if case_key(c) not in new_keys]
        doc.update({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "method": "own minimal decode step, random bf16 weights N(0,0.02), norms 1, random KV; new token "
                              "at position kv_len-1, attention over kv_len positions; eager_graph_us: eager ops in one "
                              "CUDA graph; torch_compile_graph_us: torch.compile(mode='default', fullgraph=True, "
                              "dynamic=False) in one CUDA graph; each the faster of two GQA forms; median of per-replay "
                              f"event pairs over {args.reps} replays; weights >> L2, not rotated; floor_us at "
                              f"{args.floor_tbps} TB/s",
                    "floor_read_tbps": args.floor_tbps, "floor_source": floor_source,
                    "cases": kept + rows})
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
    print(f"wrote {path}")
    print_table(rows, args.floor_tbps)
    if args.merge:
        merge_into(args.merge, doc["cases"])


if __name__ == "__main__":
    main()
