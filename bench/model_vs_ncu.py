#!/usr/bin/env python3
"""The traffic model against ncu on the GPU (issue 17's validation grid), one command:

    python3 bench/model_vs_ncu.py [--bench build-gpu/bench/bench_model_vs_ncu] [--gpu-preset FILE.json]
                                  [--ms 256,512,1024,2048,4096] [--out bench/results/h200/model_vs_ncu.json]

1. runs the bench: model bytes (simple and partitioned L2) and predicted time for each case, the
   measured time of cold launches (-> model_vs_ncu_timing.json), the search's orders saved;
2. runs it again under ncu (--profile-from-start off: one profiled kernel per case, L2 flushed before
   it) for dram__bytes_read.sum / dram__bytes_write.sum;
3. merges them into model_vs_ncu.json: cases with op, m, order, model_read_bytes, ncu_read_bytes,
   read_error_pct, model_us, measured_us, time_error_pct, and a summary against the bars
   (|read error| <= 10 %, |time error| <= 15 %).
"""
import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def ncu_rows(log_path):
    """ncu's CSV (base units) -> {kernel id: {metric: value}} in launch order."""
    text = open(log_path).read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"model_vs_ncu: no CSV in ncu's log {log_path}:\n{text[-2000:]}")
    kernels = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        try:
            kid = int(row["ID"])
            value = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        kernels.setdefault(kid, {})[row["Metric Name"]] = value
    return [kernels[k] for k in sorted(kernels)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build-gpu/bench/bench_model_vs_ncu")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--gpu-preset", default="", help="preset JSON from bench/l2_probe (default: the built-in one)")
    ap.add_argument("--ms", default="256,512,1024,2048,4096")
    ap.add_argument("--gpu", default="h200", help="results folder under bench/results/")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    results = os.environ.get("TW_RESULTS_DIR", "bench/results")
    out = a.out or os.path.join(results, a.gpu, "model_vs_ncu.json")
    extra = ["--ms", a.ms] + (["--gpu-preset", a.gpu_preset] if a.gpu_preset else [])

    run([a.bench] + extra)
    timing = json.load(open(os.path.join(results, a.gpu, "model_vs_ncu_timing.json")))

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ncu.csv")
        run([a.ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv", "--print-units", "base",
             "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct",
             "--log-file", log, a.bench, "--ncu"] + extra)
        kernels = ncu_rows(log)

    cases = timing["cases"]
    if len(kernels) != len(cases):
        sys.exit(f"model_vs_ncu: ncu profiled {len(kernels)} kernels for {len(cases)} cases")
    merged = []
    for c, k in zip(cases, kernels):
        read, write = k["dram__bytes_read.sum"], k.get("dram__bytes_write.sum", 0.0)
        merged.append({
            "op": c["op"], "shape": c["shape"], "m": c["m"], "order": c["order"], "schedule": c["schedule"],
            "model_read_bytes": c["model_read_bytes"], "ncu_read_bytes": read,
            "read_error_pct": round(100.0 * (c["model_read_bytes"] - read) / read, 2),
            "simple_model_read_bytes": c["simple_model_read_bytes"],
            "simple_read_error_pct": round(100.0 * (c["simple_model_read_bytes"] - read) / read, 2),
            "model_write_bytes": c["model_write_bytes"], "ncu_write_bytes": write,
            "ncu_l2_hit_pct": k.get("lts__t_sector_hit_rate.pct"),
            "model_us": round(c["model_us"], 2), "measured_us": round(c["measured_us"], 2),
            "time_error_pct": round(100.0 * (c["model_us"] - c["measured_us"]) / c["measured_us"], 2),
        })
    worst_read = max(abs(c["read_error_pct"]) for c in merged)
    worst_time = max(abs(c["time_error_pct"]) for c in merged)
    doc = {
        "benchmark": "model_vs_ncu", "gpu": timing["gpu"], "date_utc": timing["date_utc"],
        "floor_read_tbps": timing["floor_read_tbps"], "preset": timing["preset"],
        "method": timing["method"] + "; ncu: --clock-control none, the same schedule launched after two warm-ups "
                  "and an L2 flush, dram__bytes_read.sum / dram__bytes_write.sum",
        "summary": {"cases": len(merged), "max_abs_read_error_pct": worst_read, "max_abs_time_error_pct": worst_time,
                    "read_bar_met": worst_read <= 10 and len(merged) >= 40, "time_bar_met": worst_time <= 15},
        "cases": merged,
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"wrote {out}: {len(merged)} cases, worst read error {worst_read:.1f}%, worst time error {worst_time:.1f}%")


if __name__ == "__main__":
    main()
