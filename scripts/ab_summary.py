#!/usr/bin/env python3
"""The comparison of a decode-step A/B (scripts/step_ab.sh): RES/{base,new}/rN/<gpu>/decode_step.json.

  scripts/ab_summary.py RES [--name NAME --method TEXT --out FILE.json]

Prints, per case, the median step time of each side over the rounds, the change and every round. With
--out it writes a result file: floor_read_tbps is the lowest floor any run measured (floor_valid: at
least 4.6 TB/s, DESIGN.md section 5), the per-run floors beside it, and per case both sides' rounds,
medians and change, with the share of the floor only where the floor is valid."""
import argparse, collections, datetime, glob, json, statistics

ap = argparse.ArgumentParser()
ap.add_argument("res")
ap.add_argument("--name")
ap.add_argument("--method", default="")
ap.add_argument("--out")
a = ap.parse_args()

runs = collections.defaultdict(lambda: collections.defaultdict(list))
floors, gpu, floor_us, rows = collections.defaultdict(list), None, {}, {}
for side in ("base", "new"):
    for path in sorted(glob.glob(f"{a.res}/{side}/r*/*/decode_step.json")):
        doc = json.load(open(path))
        floors[side].append(round(doc["floor_read_tbps"], 3))
        gpu = doc["gpu"]
        for c in doc["cases"]:
            key = (c["model"], c["batch"], c["kv_len"])
            runs[key][side].append(round(c["step_us"], 1))
            floor_us[key], rows[key] = c["floor_us"], c.get("act_rows")
if not runs:
    raise SystemExit(f"ab_summary.py: no decode_step.json under {a.res}/base or {a.res}/new")
low = min(min(v) for v in floors.values())
print(f"floors (TB/s): {dict(floors)}" + ("" if low >= 4.6 else f"  -- under 4.6: the shares of the floor are not claims"))
cases = []
for key, sides in runs.items():
    if not sides["base"] or not sides["new"]:
        continue
    b, n = statistics.median(sides["base"]), statistics.median(sides["new"])
    change = 100 * (n / b - 1)
    print(f"{key[0]:14s} B={key[1]:<3d} KV={key[2]:<6d} base {b:9.1f} us new {n:9.1f} us {change:+6.2f}%  "
          f"rounds base {' '.join(f'{x:.0f}' for x in sides['base'])} new {' '.join(f'{x:.0f}' for x in sides['new'])}")
    cases.append({"model": key[0], "batch": key[1], "kv_len": key[2], "act_rows": rows[key],
                  "base_us_rounds": sides["base"], "new_us_rounds": sides["new"], "base_us": round(b, 1),
                  "new_us": round(n, 1), "change_pct": round(change, 2)})
    if low >= 4.6:  # a share of a floor under 4.6 TB/s would be inflated (DESIGN.md section 3)
        cases[-1].update(base_pct_floor=round(100 * floor_us[key] / b, 1), new_pct_floor=round(100 * floor_us[key] / n, 1))
if a.out:
    doc = {"benchmark": a.name or "decode_step_ab", "gpu": gpu, "date_utc": datetime.date.today().isoformat(),
           "floor_read_tbps": low, "floor_read_tbps_runs": floors, "floor_valid": low >= 4.6,
           "floor_note": "floor_read_tbps: the lowest of the floors the runs measured (floor_read_tbps_runs, one a "
                         "bench_decode_step run)",
           "method": a.method, "cases": cases}
    json.dump(doc, open(a.out, "w"), indent=1)
    print(f"-> {a.out} ({len(cases)} cases)")
