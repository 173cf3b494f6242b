#!/usr/bin/env python3
"""The peers of bench_dit_chain (issue 20 item 4): the attention half of a DiT block in PyTorch.

  python3 bench/dit_chain_torch.py [--cases H:L,...] [--reps N]
                                   [--merge bench/results/h200/dit_attention.json | --out DIR]

The chain, as tw::DitAttentionChain runs it: qkv = x W_qkv^T; q and k RMSNorm'd per head (weight over
the head dim) and rotated (rotate-half RoPE from a cos / sin table); SDPA held to its cuDNN backend
(the fastest here, issue 20); y = attn W_o^T. Timed eager and under torch.compile (default mode), each
captured in a CUDA graph, warmed for 0.3 s, the median of --reps per-replay event pairs
(dit_attention_torch.time_graph). Both forms are checked against each other before timing.

--merge PATH sets torch_eager_us, torch_compile_us and speedup_vs_compile (torch_compile_us / us) on
PATH's op "dit_attention_chain" cases with the same H and L (adding the ones it lacks).
"""
import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dit_attention_torch import gpu_slug, time_graph  # noqa: E402

DEFAULT_CASES = "24:4608,24:8704,24:1024,24:4097,16:8192"  # bench_dit_chain.cu's
D = 128
EPS = 1e-6


def chain(x, w_qkv, q_norm, k_norm, cos, sin, w_o, heads):
    L = x.shape[0]
    q, k, v = F.linear(x, w_qkv).view(L, 3, heads, D).unbind(1)  # [L, H, D]
    q = F.rms_norm(q, (D,), q_norm, EPS)
    k = F.rms_norm(k, (D,), k_norm, EPS)

    def rope(t):
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)

    q, k = rope(q), rope(k)
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, H, L, D]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(q, k, v)
    return F.linear(o[0].transpose(0, 1).reshape(L, heads * D), w_o)


def run_case(H, L, reps):
    W = H * D
    g = torch.Generator(device="cuda").manual_seed(1)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=g) * scale).to(torch.bfloat16)  # noqa: E731
    x, w_qkv, w_o = rnd(L, W), rnd(3 * W, W, scale=0.02), rnd(W, W, scale=0.02)
    q_norm, k_norm = rnd(D).abs() + 0.5, rnd(D).abs() + 0.5
    pos = torch.arange(L, device="cuda", dtype=torch.float32)[:, None] % 97
    ang = pos * torch.pow(10000.0, -torch.arange(D // 2, device="cuda", dtype=torch.float32) / (D // 2))
    cos, sin = ang.cos()[:, None, :].to(torch.bfloat16), ang.sin()[:, None, :].to(torch.bfloat16)  # [L, 1, D/2]
    args = (x, w_qkv, q_norm, k_norm, cos, sin, w_o, H)
    compiled = torch.compile(chain)
    ref, got = chain(*args), compiled(*args)
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    if not err < 2e-2:
        sys.exit(f"torch.compile's chain differs from eager's by {err:.3g} (H {H}, L {L})")
    row = {"op": "dit_attention_chain", "H": H, "d": D, "L": L,
           "torch_eager_us": time_graph(lambda: chain(*args), reps),
           "torch_compile_us": time_graph(lambda: compiled(*args), reps)}
    print(f"H={H:<3} L={L:<6} eager {row['torch_eager_us']:9.1f} us   torch.compile {row['torch_compile_us']:9.1f} us",
          flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--merge")
    ap.add_argument("--out")
    a = ap.parse_args()
    cases = []
    for s in filter(None, a.cases.split(",")):
        try:
            H, L = (int(v) for v in s.split(":"))
        except ValueError:
            sys.exit(f"bad case {s!r}: want H:L")
        cases.append((H, L))
    rows = [run_case(H, L, a.reps) for H, L in cases]
    if a.merge:
        with open(a.merge) as f:
            doc = json.load(f)
        for r in rows:
            hit = next((c for c in doc.setdefault("cases", []) if c.get("op") == r["op"] and c.get("H") == r["H"]
                        and c.get("L") == r["L"]), None)
            if hit is None:
                hit = {}
                doc["cases"].append(hit)
            hit.update(r)
            if "us" in hit:
                hit["speedup_vs_compile"] = hit["torch_compile_us"] / hit["us"]
                hit["speedup_vs_eager"] = hit["torch_eager_us"] / hit["us"]
        doc["chain_torch"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        with open(a.merge, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"-> {a.merge}")
    else:
        out = os.path.join(a.out or os.path.join("bench", "results", gpu_slug()), "dit_chain_torch.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"cases": rows}, f, indent=2)
        print(f"-> {out}")


if __name__ == "__main__":
    main()
