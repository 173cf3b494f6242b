#!/usr/bin/env python3
"""torch SDPA decode attention, timed cold on bench_attention's shapes, merged into its JSON.

  python3 bench/attention_sdpa.py --out DIR [--merge bench_attention.json] [--quick]

Same shapes as bench/bench_attention.cu (32 query heads, 8 KV heads, d = 128, bf16, one query
token, KV length L), same methods: >= 512 MB of KV sets in rotation so L2 holds none of a replay's
input; sdpa_us: one CUDA graph per set, one event pair per replay, the median; sdpa_seq_us: the
sets' calls back to back in one graph (>= 8), the graph's median time / calls. SDPA gets the KV
heads as they are (enable_gqa=True): no expanded copies. With --merge, each contiguous case of the
C++ result gets sdpa_us, speedup_vs_sdpa and (back to back) sdpa_seq_us, seq_speedup_vs_sdpa.
"""
import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

HQ, HKV, D = 32, 8, 128


def grid(quick):
    if quick:
        return [(1, 4096), (16, 32768)]
    return [(b, l) for b in (1, 16, 64) for l in (512, 4096, 32768, 131072)]


def time_sdpa(batch, length, warmup=10, hq=HQ, hkv=HKV, d=D, lengths=None):
    """SDPA on q [B, hq, 1, d] and K/V [B, hkv, length, d]; `lengths` (ragged: each sequence's keys, <=
    length) adds a boolean mask [B, 1, 1, length], as a padded batch is run with SDPA."""
    set_bytes = 2 * batch * hkv * length * d * 2
    sets = min(256, max(1, (512 << 20) // set_bytes + 1))
    free, _ = torch.cuda.mem_get_info()
    if sets * set_bytes + (4 << 30) > free:
        return {"skipped": "does not fit"}
    reps = 30 if set_bytes > (4 << 30) else 100
    q = torch.empty(batch, hq, 1, d, device="cuda", dtype=torch.bfloat16).uniform_(-1.732, 1.732)
    mask = None
    if lengths is not None:
        n = torch.tensor(lengths, device="cuda")
        mask = (torch.arange(length, device="cuda")[None, :] < n[:, None])[:, None, None, :]
    kv = []
    for _ in range(sets):
        k = torch.empty(batch, hkv, length, d, device="cuda", dtype=torch.bfloat16).uniform_(-1.732, 1.732)
        v = torch.empty_like(k).uniform_(-1.732, 1.732)
        kv.append((k, v))

    def call(k, v):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hq != hkv)

    graphs = []
    torch.cuda.synchronize()
    with torch.no_grad():
        for k, v in kv:  # warm each shape/backend outside capture, then capture
            call(k, v)
        torch.cuda.synchronize()
        pool = None
        for k, v in kv:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                call(k, v)
            pool = g.pool()
            graphs.append(g)
        order = [i % sets for i in range(max(sets, 8))]
        seq = torch.cuda.CUDAGraph()
        with torch.cuda.graph(seq, pool=pool):
            for i in order:
                call(*kv[i])
    seq_times = []
    for i in range(2 + 15):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        seq.replay()
        e1.record()
        torch.cuda.synchronize()
        if i >= 2:
            seq_times.append(e0.elapsed_time(e1) * 1e3 / len(order))
    for i in range(warmup):
        graphs[i % sets].replay()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    for i in range(reps):
        ev[i].record()
        graphs[(warmup + i) % sets].replay()
    ev[reps].record()
    torch.cuda.synchronize()
    times = [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(reps)]
    del graphs, seq, kv
    torch.cuda.empty_cache()
    return {"sdpa_us": statistics.median(times), "sdpa_seq_us": statistics.median(seq_times), "sets": sets}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--merge", default=None, help="bench_attention JSON to add sdpa_us / speedup_vs_sdpa to")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = []
    for batch, length in grid(args.quick):
        try:
            r = time_sdpa(batch, length)
        except RuntimeError as e:  # e.g. out of memory
            r = {"skipped": str(e).splitlines()[0]}
            torch.cuda.empty_cache()
        r.update({"B": batch, "L": length})
        rows.append(r)
        print(f"sdpa B={batch:3d} L={length:7d}: {r.get('sdpa_us', r.get('skipped'))} "
              f"(back to back {r.get('sdpa_seq_us', '-')})", flush=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "num_q_heads": HQ,
           "num_kv_heads": HKV, "head_dim": D, "cases": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention_sdpa.json"), "w") as f:
        json.dump(doc, f, indent=2)
    if not args.merge:
        return
    with open(args.merge) as f:
        res = json.load(f)
    sdpa = {(r["B"], r["L"]): r["sdpa_us"] for r in rows if "sdpa_us" in r}
    sdpa_seq = {(r["B"], r["L"]): r["sdpa_seq_us"] for r in rows if "sdpa_seq_us" in r}
    res["sdpa"] = {"torch": torch.__version__, "method": "F.scaled_dot_product_attention(enable_gqa=True), "
                   "CUDA graph per KV set, >= 512 MB of sets rotated, median of per-replay events; seq: the sets "
                   "back to back in one graph (>= 8 calls), graph time / calls"}
    print(f"\nfloor {res['floor_read_tbps']:.3f} TB/s  ({res['gpu']}, {res['date_utc']})")
    names = sorted({n for c in res["cases"] for n in c.get("variants_us", {})})
    print(f"{'B':>3} {'L':>7} {'layout':<11} {'us':>9} {'TB/s':>6} {'floor%':>7} {'sdpa_us':>9} {'x sdpa':>7} "
          f"{'seq_us':>9} {'floor%':>7} {'sdpa_seq':>9} {'x sdpa':>7}  "
          + " ".join(f"{n[:13]:>13}" for n in names))
    for c in res["cases"]:
        key = (c["B"], c["L"])
        if c["layout"] == "contiguous" and key in sdpa:
            c["sdpa_us"] = sdpa[key]
            c["speedup_vs_sdpa"] = sdpa[key] / c["time_us"]
            if key in sdpa_seq and "seq_us" in c:
                c["sdpa_seq_us"] = sdpa_seq[key]
                c["seq_speedup_vs_sdpa"] = sdpa_seq[key] / c["seq_us"]
        lay = c["layout"] + ("" if c["layout"] == "contiguous" else str(c["page_size"]))
        s_us = f"{c['sdpa_us']:9.2f}" if "sdpa_us" in c else f"{'-':>9}"
        s_x = f"{c['speedup_vs_sdpa']:7.2f}" if "speedup_vs_sdpa" in c else f"{'-':>7}"
        q_us = f"{c['seq_us']:9.2f} {c['seq_pct_floor']:6.1f}%" if "seq_us" in c else f"{'-':>9} {'-':>7}"
        q_s = f"{c['sdpa_seq_us']:9.2f} {c['seq_speedup_vs_sdpa']:7.2f}" if "sdpa_seq_us" in c else f"{'-':>9} {'-':>7}"
        print(f"{c['B']:3d} {c['L']:7d} {lay:<11} {c['time_us']:9.2f} {c['tbps']:6.3f} {c['pct_floor']:6.1f}% {s_us} {s_x} {q_us} {q_s}"
              + "  " + " ".join(f"{c.get('variants_us', {}).get(n, 0):13.2f}" for n in names))
    with open(args.merge, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
