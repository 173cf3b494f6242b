#!/usr/bin/env python3
"""Draws a tile timeline the executor recorded (one format for all: bench/tile_trace.cuh).

`bench_ffn --trace` writes ffn_trace_<model>_m<M>.json, `bench_model_vs_ncu --trace-dir`
gemm_trace_<shape>_m<M>_<order>.json.

  python3 scripts/plot_trace.py TRACE.json [-o OUT.png]

One row per SM, one bar per tile: pale while the tile waited for its producers (ticket taken ->
dependencies met), solid while the consumers ran it (picked up -> output published), coloured by
op. The right-hand margin shows when each SM ran out of work. Needs matplotlib.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--out", default=None, help="image to write (default: TRACE with .png)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit("plot_trace.py needs matplotlib: python3 -m pip install matplotlib")
    with open(args.trace) as f:
        doc = json.load(f)
    tiles = doc["tiles"]
    if not tiles:
        sys.exit(f"{args.trace}: no tiles")
    sms = sorted({t["sm"] for t in tiles})
    row = {sm: i for i, sm in enumerate(sms)}
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    fig, ax = plt.subplots(figsize=(14, max(4, len(sms) * 0.06)))
    for t in tiles:
        y, c = row[t["sm"]], colours[t["op"] % len(colours)]
        if t["ready"] > t["taken"]:
            ax.barh(y, t["ready"] - t["taken"], left=t["taken"], height=0.9, color=c, alpha=0.25, linewidth=0)
        ax.barh(y, t["done"] - t["started"], left=t["started"], height=0.9, color=c, linewidth=0.2, edgecolor="white")
    ax.set_xlabel("time since the first ticket (us)")
    ax.set_ylabel("SM")
    ax.set_ylim(-1, len(sms))
    ax.invert_yaxis()
    ax.set_yticks([])
    ops = doc.get("ops", [])
    handles = [Patch(color=colours[i % len(colours)], label=name) for i, name in enumerate(ops)]
    handles.append(Patch(color="grey", alpha=0.25, label="waiting on producers"))
    ax.legend(handles=handles, loc="lower left", fontsize=8)
    case = doc.get("model") or doc.get("shape")  # an FFN's header names its model, a GEMM's its shape
    ax.set_title(f"{case} M={doc.get('m')} [{doc.get('variant') or doc.get('order')}] on {doc.get('gpu')}: "
                 f"tiles span {doc.get('span_us', 0):.1f} us, launch {doc.get('launch_us', 0):.1f} us")
    out = args.out or args.trace.rsplit(".", 1)[0] + ".png"
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
