#!/usr/bin/env python3
"""Fits DecodeCostModel (include/tileweave/graph/attention_graph.hpp) to measured decode-attention plans.

  build-gpu/bench/bench_attention_sweep --seed 16 --tiles-sweep --out DIR   (and other seeds)
  python3 bench/fit_decode_plan.py DIR/h200/attention_sweep.json ... [--sms 132]

Each shape of a sweep is timed at its planned tile count and at the candidates of --tiles-sweep
(whole multiples of the pairs, a quarter / half / all / twice the SMs, one or two tiles per SM). The
model is the planner's: a fixed cost, one more for head dim 256, a cost per further pair a tile holds
part of, the widest tile's bytes at its share of its SM's rate, a merge cost when a pair is cut over
tiles plus its partials' bytes (more per byte at head dim 256, whose tiles merge with 4 warps). It is linear in its constants once the two rates are fixed: those
two are searched on a grid, the rest fitted by least squares on relative error. Prints the constants
as the C++ struct's initialisers, the fit's error, and how plans picked by the model (at the
planner's 10% margin over the sweep's own plan) compare with that plan and with the best measured.
--holdout FILE: fits on the others and reports the picks on FILE alone (cross-validation).
Needs numpy.
"""
import argparse
import json
import math

import numpy as np

FRACTION = [(0.0, 0.0), (0.25, 0.54), (0.5, 0.86), (0.75, 0.90), (1.0, 1.0)]  # decode_active_fraction
NAMES = ["base_us", "d256_us", "segment_us", "stream_scale", "merge_us", "merge_us_per_kb", "two_per_sm_us", "merge_us_per_kb_d256"]


def units(length):
    return (length + 15) // 16


def cut(case, tiles):
    """The features of a plan of `tiles` tiles (clamped to the units), as predict_decode_cost computes them."""
    h, d = case["num_kv_heads"], case["head_dim"]
    first = [0]
    for length in case["lengths"]:
        for _ in range(h):
            first.append(first[-1] + units(length))
    total = first[-1]
    tiles = max(1, min(tiles, total))
    max_units = max_segments = 0
    p = 0
    for t in range(tiles):
        u0, u1 = t * total // tiles, (t + 1) * total // tiles
        if u1 <= u0:
            continue
        while first[p + 1] <= u0:
            p += 1
        q = p
        while q < len(first) - 1 and first[q] < u1:
            q += 1
        max_units, max_segments = max(max_units, u1 - u0), max(max_segments, q - p)
    tile_of = lambda u: ((u + 1) * tiles - 1) // total
    widest = max(tile_of(first[i + 1] - 1) - tile_of(first[i]) + 1 for i in range(len(first) - 1) if first[i + 1] > first[i])
    g = case["num_q_heads"] // h
    return dict(tiles=tiles, d=d, max_units=max_units, max_segments=max_segments, widest=widest, part=(g * d + g) * 4)


def fraction(active, sms):
    x = min(1.0, active / sms)
    for (x0, f0), (x1, f1) in zip(FRACTION, FRACTION[1:]):
        if x <= x1:
            return f0 + (f1 - f0) * (x - x0) / (x1 - x0)
    return 1.0


def design(f, per_sm, sm_gbps, read_tbps, sms):
    active = min(f["tiles"], sms)
    rate = min(sm_gbps * 1e3, read_tbps * 1e6 * fraction(active, sms) / active)  # bytes per us
    stream = f["max_units"] * 16 * f["d"] * 4 * per_sm / rate
    merged = f["widest"] > 1
    merge_kb = merged * f["widest"] * f["part"] / 1e3
    return [1.0, float(f["d"] == 256), max(0, f["max_segments"] - 1), stream, float(merged), merge_kb,
            float(per_sm == 2), merge_kb * (f["d"] == 256)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", help="attention_sweep.json files written with --tiles-sweep")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--margin", type=float, default=0.9, help="the planner's: a candidate replaces the plan below this x its time")
    ap.add_argument("--holdout", default=None, help="one of the sweeps: fit on the others, report the picks on it")
    a = ap.parse_args()
    shapes = []
    for path in a.sweeps:
        doc = json.load(open(path))
        for i, case in enumerate(doc["cases"]):
            timed = {(x["num_tiles"], x["tiles_per_sm"]): x["us"] for x in case.get("tiles_sweep", []) if "us" in x}
            if "us" not in case or not timed:
                continue
            plans = [(cut(case, t), per_sm, us) for (t, per_sm), us in timed.items()]
            rules = cut(case, case["num_tiles"])
            shapes.append(dict(name=f"{path}#{i}", path=path, plans=plans, rules=rules, rules_us=case["us"]))
    if not shapes:
        raise SystemExit("no shape has a tiles_sweep: run bench_attention_sweep with --tiles-sweep")
    evaluated = [s for s in shapes if a.holdout is None or s["path"] == a.holdout]
    shapes = [s for s in shapes if a.holdout is None or s["path"] != a.holdout]
    if not shapes or not evaluated:
        raise SystemExit("--holdout must name one of two or more sweeps")
    rows = [(f, per_sm, us) for s in shapes for f, per_sm, us in s["plans"]]
    best = None
    for sm_gbps in (25, 30, 35, 40, 45, 50, 60, 80, 120):
        for read_tbps in (4.0, 4.3, 4.6, 4.9):
            x = np.array([design(f, per_sm, sm_gbps, read_tbps, a.sms) for f, per_sm, _ in rows])
            y = np.array([us for _, _, us in rows])
            coef = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)[0]
            err = float(np.mean(np.abs(x @ coef - y) / y))
            if best is None or err < best[0]:
                best = (err, sm_gbps, read_tbps, coef)
    err, sm_gbps, read_tbps, coef = best
    print(f"{len(rows)} timed plans of {len(shapes)} shapes; mean |error| {100 * err:.1f}%")
    print("DecodeCostModel:")
    for name, v in zip(NAMES, coef):
        print(f"  double {name} = {v:.3f};")
    print(f"  double sm_gbps = {sm_gbps};\n  double read_tbps = {read_tbps};")
    predict = lambda f, per_sm: float(np.dot(design(f, per_sm, sm_gbps, read_tbps, a.sms), coef))
    log_rules = log_pick = log_best = 0.0
    for s in evaluated:
        rules_per_sm = 1 if s["rules"]["tiles"] <= a.sms else 2
        pred = [predict(f, per_sm) for f, per_sm, _ in s["plans"]]
        i = int(np.argmin(pred))
        picked = s["plans"][i] if pred[i] < a.margin * predict(s["rules"], rules_per_sm) else None
        pick_us = picked[2] if picked else s["rules_us"]
        best_us = min(us for _, _, us in s["plans"])
        log_rules, log_pick, log_best = log_rules + math.log(s["rules_us"]), log_pick + math.log(pick_us), log_best + math.log(best_us)
        if picked:
            print(f"  {s['name']}: planned {s['rules']['tiles']} tiles {s['rules_us']:.2f} us -> {picked[0]['tiles']} tiles, "
                  f"{picked[1]} per SM {pick_us:.2f} us (best measured {best_us:.2f})")
    n = len(evaluated)
    print(f"{'held out' if a.holdout else 'in sample'}, {n} shapes: geomean speed-up over the sweep's plans: picked {math.exp((log_rules - log_pick) / n):.3f}x, "
          f"best measured {math.exp((log_rules - log_best) / n):.3f}x")


if __name__ == "__main__":
    main()
