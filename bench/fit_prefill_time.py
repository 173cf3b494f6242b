#!/usr/bin/env python3
"""Fits prefill attention's time model (model/prefill_traffic.hpp, PrefillTimeModel) to measured runs.

  python3 bench/fit_prefill_time.py [JSON ...]   (default: bench/results/h200/dit_attention*.json)

Every item (a query tile of one head) is modelled as b + a x (key rows it reads), the items run on
132 SMs taking them in the kernel's order from a counter (list scheduling), plus a 3 us launch. Per
configuration (bf16 d = 64, bf16 d = 128, fp8 d = 128) a and b are fitted by least squares on the
relative error over the non-causal cases, where every item is alike and the time is rounds x item
(b >= 0: a negative fixed cost is refitted as 0); the causal cases are only predicted. Prints the
constants for the C++ model and every case's error.
"""
import glob
import heapq
import json
import math
import os
import sys

import numpy as np

SMS = 132
LAUNCH_US = 3.0
CONFIGS = [("bf16", 64), ("bf16", 128), ("fp8_e4m3", 128)]


def plan(fp8, heads, d, length, causal):
    """(block_m, block_n): graph/prefill_attention_graph.cpp's prefill_block_m / prefill_block_n."""
    bn = 192 if fp8 else (160 if d == 128 and not causal else 128)
    bm = 128
    if d == 64 and not fp8:
        def t(rows, speed):
            return math.ceil(math.ceil(length / rows) * heads / SMS) * rows / speed
        bm = 192 if t(192, 1.18) < t(128, 1.0) else 128
    return bm, bn


def item_keys(fp8, heads, d, length, causal):
    bm, bn = plan(fp8, heads, d, length, causal)
    keys = []
    for t in range(math.ceil(length / bm)):
        kv = math.ceil(length / bn)
        if causal:
            kv = min(kv, (min((t + 1) * bm, length) - 1) // bn + 1)
        keys.append(kv * bn)
    return sorted(keys, reverse=True)


def predict(a, b, fp8, heads, d, length, causal):
    keys = item_keys(fp8, heads, d, length, causal)
    free = [0.0] * min(SMS, len(keys) * heads)
    heapq.heapify(free)
    for _ in range(heads):
        for k in keys:
            heapq.heappush(free, heapq.heappop(free) + b + a * k)
    return max(free) + LAUNCH_US


def main():
    files = sys.argv[1:] or sorted(glob.glob(os.path.join(os.path.dirname(__file__), "results/h200/dit_attention*.json")))
    cases = []
    for f in files:
        for c in json.load(open(f))["cases"]:
            if "us" in c and c.get("batch", 1) == 1:
                cases.append((c["dtype"], c["H"], c["d"], c["L"], c["causal"], c["us"], os.path.basename(f)))
    for dtype, d in CONFIGS:
        pts = [c for c in cases if c[0] == dtype and c[2] == d]
        fp8 = dtype != "bf16"
        rows, rhs = [], []
        for _, h, _, length, causal, us, _ in pts:
            if causal:
                continue
            keys = item_keys(fp8, h, d, length, False)
            rounds = math.ceil(len(keys) * h / SMS)
            rows.append([rounds * keys[0] / us, rounds / us])
            rhs.append((us - LAUNCH_US) / us)
        a, b = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0]
        if b < 0:
            b = 0.0
            a = float(np.dot(np.array(rows)[:, 0], rhs) / np.dot(np.array(rows)[:, 0], np.array(rows)[:, 0]))
        print(f"{dtype} d={d}: us_per_key_row {a:.6f}, us_per_item {b:.3f}  ({len(rows)} cases fitted)")
        for _, h, _, length, causal, us, f in pts:
            p = predict(a, b, fp8, h, d, length, causal)
            print(f"  H={h:2d} L={length:6d} {'causal' if causal else 'full  '} measured {us:9.1f} predicted {p:9.1f} "
                  f"error {100 * (p - us) / us:+5.1f}%  ({f})")


if __name__ == "__main__":
    main()
