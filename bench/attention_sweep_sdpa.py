#!/usr/bin/env python3
"""torch SDPA on bench_attention_sweep's shapes (issue 16's attention sweep), merged into its JSON.

  python3 bench/attention_sweep_sdpa.py --merge attention_sweep.json

For each case: SDPA on q [B, Hq, 1, D] and contiguous K/V [B, Hkv, longest, D] (SDPA has no paged form: a
paged case's peer reads the same lengths from a contiguous cache), a boolean mask where the lengths are
ragged, timed back to back like ours (the sets' calls in one CUDA graph, >= 512 MB of K/V sets rotated;
attention_sdpa.time_sdpa). Adds peer = "torch_sdpa", peer_us (back to back), speedup = peer_us / us, and a
summary: cases at or above the peer, the worst speedup, memory-bound cases at >= 90% of the floor.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from attention_sdpa import time_sdpa  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--merge", required=True, help="attention_sweep.json from bench_attention_sweep")
    args = ap.parse_args()
    with open(args.merge) as f:
        res = json.load(f)
    at_peer = run = 0
    worst = None
    print(f"{'#':>3} {'heads':>7} {'d':>4} {'B':>3} {'layout':<10} {'longest':>7} {'ragged':>6} {'ours':>9} {'sdpa':>9} {'x':>6}")
    for i, c in enumerate(res["cases"]):
        ragged = c["ragged"]
        try:
            r = time_sdpa(c["batch"], c["longest"], hq=c["num_q_heads"], hkv=c["num_kv_heads"], d=c["head_dim"],
                          lengths=c["lengths"] if ragged else None)
        except RuntimeError as e:  # e.g. out of memory, or no SDPA kernel for the shape
            r = {"skipped": str(e).splitlines()[0][:200]}
            torch.cuda.empty_cache()
        c["peer"] = "torch_sdpa"
        if "sdpa_seq_us" in r:
            c["peer_us"] = r["sdpa_seq_us"]
            c["peer_mask"] = ragged
        else:
            c["peer_skipped"] = r.get("skipped")
        if "us" in c and "peer_us" in c:
            c["speedup"] = c["peer_us"] / c["us"]
            run += 1
            at_peer += c["speedup"] >= 1.0
            worst = c["speedup"] if worst is None else min(worst, c["speedup"])
        ours = f"{c['us']:9.2f}" if "us" in c else f"{'-':>9}"
        peer = f"{c['peer_us']:9.2f}" if "peer_us" in c else f"{'-':>9}"
        x = f"{c['speedup']:6.2f}" if "speedup" in c else f"{'-':>6}"
        print(f"{i + 1:3d} {c['num_q_heads']:3d}/{c['num_kv_heads']:<3d} {c['head_dim']:4d} {c['batch']:3d} {c['layout']:<10} "
              f"{c['longest']:7d} {str(ragged):>6} {ours} {peer} {x}", flush=True)
    s = res.setdefault("summary", {})
    s.update({"compared": run, "at_or_above_peer": at_peer, "worst_speedup": worst,
              "peer": {"torch": torch.__version__, "method": "F.scaled_dot_product_attention on contiguous caches, "
                       "enable_gqa where the group > 1, a boolean mask for ragged lengths; back to back"}})
    with open(args.merge, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    print(f"{at_peer} of {run} compared cases at or above SDPA (worst {worst}); {s.get('supported')} of {s.get('cases')} "
          f"shapes run by tileweave -> {args.merge}")


if __name__ == "__main__":
    main()
