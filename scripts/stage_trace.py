#!/usr/bin/env python3
"""Where an attention stage's time goes in the decode step (the TW_STAGE_TRACE diagnostic build).

  python3 scripts/stage_trace.py DIR [--ghz 1.80]

DIR holds the stage_<model>_<batch>_<kv>.bin files that `bench_decode_step --trace` writes in a
build with -DTW_STAGE_TRACE=<block> (src/ops/decode_step_stage_trace.cuh): SM cycle stamps of one
block's attention stages. The SM clock under the step's load was ~1.80 GHz on the H200 (clock64 against
the trace's globaltimer), the default of --ghz. For each file it prints, as medians over the middle
layers' tiles of each stage's median (us):
  period       the producer's time per stage after `ready`
  slot wait    the producer waiting for a free ring slot (the consumers or the memory set the pace)
  issue        its stage's chunk, barrier and copies (copies: the copies alone, where recorded);
               walk: its next stage's walk
  issue->seen  from the copies to the first consumer warp past the stage's data wait
  seen->freed  from there to the last warp's release of the slot
and one tile's stages in detail. When slot wait is small and issue + walk is the period, the
producer's one thread is the pace.
"""
import argparse
import glob
import os

import numpy as np

OPS, STAGES, WORDS = 256, 192, 28
TILE = STAGES - 1


def tiles(a):
    for op in range(OPS):
        h = a[op, TILE]
        n = int(h[2])
        if h[0] == 0 or not 2 <= n < TILE:
            continue
        s = a[op, :n]
        post = s[:, 0] >= h[0]  # stages issued after `ready`
        if post.sum() < 2:
            continue
        # Warps that did not take a stage leave its words zero (a tile run a segment per warp: only
        # the owner does), so the per-stage extremes are over the warps that recorded one.
        w4, w5, w6 = (np.where(s[:, k::3][:, :8] > 0, s[:, k::3][:, :8], np.nan) for k in (4, 5, 6))
        seen, freed, waited = np.nanmin(w5, 1), np.nanmax(w6, 1), np.nanmin(w5 - w4, 1)
        yield dict(op=op, n=n, pre=int((~post).sum()), h=h, s=s,
                   period=(s[post, 2][-1] - s[post, 2][0]) / (post.sum() - 1),
                   slot=np.median((s[:, 1] - s[:, 0])[post]), issue=np.median((s[:, 2] - s[:, 1])[post]),
                   copies=np.median((s[:, 2] - s[:, 3])[post]) if (s[post, 3] > 0).all() else np.nan,
                   walk=np.median((s[1:, 0] - s[:-1, 2])[post[1:]]), lat=np.median((seen - s[:, 2])[post]),
                   hold=np.median((freed - seen)[post]), cwait=np.median(np.maximum(waited[post], 0)),
                   tile=h[5] - h[4], slot_sum=(s[:, 1] - s[:, 0])[post].sum(),
                   warp=np.nanmedian(w6 - w5, axis=0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--ghz", type=float, default=1.80, help="SM clock (GHz) to turn cycles into us")
    args = ap.parse_args()
    us = lambda c: c / args.ghz / 1000
    for path in sorted(glob.glob(os.path.join(args.dir, "stage_*.bin"))):
        a = np.fromfile(path, dtype=np.uint64).astype(np.int64).reshape(OPS, STAGES, WORDS)
        rows = list(tiles(a))
        if not rows:
            print(f"== {os.path.basename(path)}: no attention tile with stages after ready")
            continue
        mid = rows[1:-1] if len(rows) > 3 else rows
        med = lambda k: us(np.median([r[k] for r in mid]))
        print(f"== {os.path.basename(path)}: {len(rows)} attention tiles, {mid[0]['n']} stages each "
              f"({mid[0]['pre']} before ready)")
        print(f"  period {med('period'):.3f} | producer slot wait {med('slot'):.3f}, issue {med('issue'):.3f}, "
              f"(copies {med('copies'):.3f}), walk {med('walk'):.3f} | issue->seen {med('lat'):.3f}, seen->freed {med('hold'):.3f}, "
              f"consumer wait {med('cwait'):.3f} | tile {med('tile'):.1f}, slot wait in all {med('slot_sum'):.1f}")
        print("  per warp, data seen -> its release:", " ".join(f"{us(x):.2f}" for x in np.median([r["warp"] for r in mid], axis=0)))
        r = mid[len(mid) // 2]
        s, t0 = r["s"], r["h"][0]
        print(f"  op {r['op']}, us after ready: stage, slot free, issued, seen, freed")
        for j in list(range(min(10, r["n"]))) + list(range(max(10, r["n"] - 3), r["n"])):
            f, e = s[j, 5::3][:8], s[j, 6::3][:8]
            print(f"   {j:3d} {us(s[j, 1] - t0):8.2f} {us(s[j, 2] - t0):8.2f} {us(f[f > 0].min() - t0):8.2f} "
                  f"{us(e[e > 0].max() - t0):8.2f}")


if __name__ == "__main__":
    main()
