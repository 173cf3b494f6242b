#!/usr/bin/env python3
"""The peers of bench_dit_attention (issue 20): prefill self-attention, bf16, on the same cases.

  python3 bench/dit_attention_torch.py [--cases H:d:L[:c][:bN],...] [--reps N] [--quick]
                                       [--merge bench/results/h200/dit_attention.json | --out DIR]

Peers, each timed alone: torch SDPA with one backend forced (sdpa_kernel: FLASH_ATTENTION = FA2,
CUDNN_ATTENTION, EFFICIENT_ATTENTION), q/k/v [B, H, L, d]; and, when `import flashinfer` works,
FlashInfer's single_prefill_with_kv_cache with backend "fa2" and "fa3", q/k/v [L, H, d] (NHD; one
sequence only, so batch > 1 leaves them out). A peer that refuses a shape is recorded as null, its
error in peer_notes. Inputs: uniform noise of unit variance (as bench_dit_attention), one input set
(compute-bound, not rotated, as there). Time: warmed up outside capture, one call captured in a CUDA
graph, the median of --reps per-replay event pairs. TFLOP/s uses bench_dit_attention's count:
4 d H x (query, key) pairs the mask lets through (L^2, or L(L+1)/2 causal), times the batch.

Each case gets peers {name: {"us", "tflops"} | null}, peer_best, peer_best_tflops. --merge PATH
updates the cases of PATH (bench_dit_attention's file) with the same op, dtype, H, d, L, causal and
batch in place (adding cases it lacks, which a later bench_dit_attention run fills in), and sets
speedup = the best peer's us / our us where the case has our us. Without --merge: DIR/dit_attention_torch.json.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

# FlashInfer compiles its kernels on first use; keep them beside the other torch caches so a warm
# machine reuses them (the GPU machine has no network and starts bare).
_CACHE_DIR = os.environ.get("TW_TORCH_CACHE_DIR",
                            os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build-gpu", "torch-cache"))
os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", os.path.join(_CACHE_DIR, "flashinfer"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_step_torch import time_graph as replay_median_us  # noqa: E402  (per-replay event pairs, median)

# The peer table and bars, then the spread of H, d and odd L (same as bench_dit_attention.cu).
DEFAULT_CASES = ("24:128:4608,24:128:8704,24:128:14034,24:64:4429,40:128:32760,8:128:1024,48:128:8192,"
                 "24:64:16384,16:128:4097,24:128:8704:c,24:64:4429:c")
QUICK_CASES = "24:128:4608,24:64:4429,24:128:8704:c"
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


def parse_cases(spec):
    """'H:d:L[:c][:bN],...' -> [dict(H, d, L, causal, batch)]."""
    cases = []
    for s in filter(None, (t.strip() for t in spec.split(","))):
        f = s.split(":")
        try:
            c = {"H": int(f[0]), "d": int(f[1]), "L": int(f[2]), "causal": False, "batch": 1}
            for x in f[3:]:
                if x == "c":
                    c["causal"] = True
                elif x.startswith("b"):
                    c["batch"] = int(x[1:])
                else:
                    raise ValueError(x)
            if min(c["H"], c["d"], c["L"], c["batch"]) < 1:
                raise ValueError(s)
        except (ValueError, IndexError):
            sys.exit(f"bad case {s!r}: want H:d:L[:c][:bN] (c: causal, bN: N packed sequences)")
        cases.append(c)
    return cases


def flops(c):
    L = c["L"]
    pairs = L * (L + 1) // 2 if c["causal"] else L * L
    return 4.0 * c["d"] * c["H"] * pairs * c["batch"]


def case_key(c):
    return (c.get("op", ""), c.get("dtype", ""), c.get("H"), c.get("d"), c.get("L"), bool(c.get("causal", False)),
            c.get("batch", 1))


def gpu_slug():
    name = torch.cuda.get_device_name()
    return next((s.lower() for s in ("H200", "H100", "A100", "L40S", "A40", "B200") if s in name), "other")


STEADY_S = 0.3


def time_graph(fn, reps, warmup=5):
    """Median us of one captured call of fn: warmed on a side stream first (JIT builds, workspaces)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    # Replays for STEADY_S first: bench_dit_attention.cu's kSteadyMs says why (clocks at the power limit).
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < STEADY_S:
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    us = replay_median_us(g, reps, warmup)
    del g
    return us


def peer_calls(c, flashinfer):
    """{name: zero-argument call} for the case; inputs made here, kept alive by the closures."""
    B, H, L, d = c["batch"], c["H"], c["L"], c["d"]
    noise = lambda *shape: torch.empty(*shape, device="cuda", dtype=torch.bfloat16).uniform_(-1.7320508, 1.7320508)  # noqa: E731
    q, k, v = noise(B, H, L, d), noise(B, H, L, d), noise(B, H, L, d)
    calls = {}
    for name, backend in SDPA_BACKENDS.items():
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"])
        calls[name] = sdpa
    if flashinfer is not None and B == 1:
        qn, kn, vn = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))  # [L, H, d]
        for backend in ("fa2", "fa3"):
            calls[f"flashinfer_{backend}"] = lambda backend=backend: flashinfer.single_prefill_with_kv_cache(
                qn, kn, vn, causal=c["causal"], kv_layout="NHD", backend=backend)
    return calls


def run_case(c, flashinfer, reps):
    row = {"op": "attention", "H": c["H"], "d": c["d"], "L": c["L"], "causal": c["causal"], "batch": c["batch"],
           "dtype": "bf16", "flops": flops(c)}
    peers, notes = {}, {}
    for name, fn in peer_calls(c, flashinfer).items():
        try:
            us = time_graph(fn, reps)
            peers[name] = {"us": us, "tflops": row["flops"] / us * 1e-6}
        except Exception as e:  # noqa: BLE001 -- a backend refusing the shape (or failing to build) is a result
            peers[name] = None
            notes[name] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
            torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if flashinfer is not None and c["batch"] > 1:
        peers.update({"flashinfer_fa2": None, "flashinfer_fa3": None})
        notes["flashinfer"] = "single_prefill_with_kv_cache takes one sequence"
    best = max((n for n in peers if peers[n]), key=lambda n: peers[n]["tflops"], default=None)
    row.update({"peers": peers, "peer_best": best, "peer_best_tflops": peers[best]["tflops"] if best else None})
    if notes:
        row["peer_notes"] = notes
    return row


def merge(doc, rows):
    """Puts the peer fields of rows into doc's matching cases (appending missing ones); returns the matched count."""
    cases = doc.setdefault("cases", [])
    by_key = {case_key(x): x for x in cases}
    hits = 0
    for r in rows:
        c = by_key.get(case_key(r))
        if c is None:
            c = {k: r[k] for k in ("op", "H", "d", "L", "causal", "batch", "dtype")}
            cases.append(c)
        else:
            hits += 1
        c.pop("speedup", None)
        c.update({k: r[k] for k in ("peers", "peer_best", "peer_best_tflops", "peer_notes") if k in r})
        if "peer_notes" not in r:
            c.pop("peer_notes", None)
        if isinstance(c.get("us"), (int, float)) and r["peer_best"]:
            c["speedup"] = r["peers"][r["peer_best"]]["us"] / c["us"]
    return hits


def print_table(cases):
    names = sorted({n for c in cases for n in c.get("peers", {})})
    print(f"{'H':>3} {'d':>4} {'L':>6} {'mask':<6} {'b':>2} " + " ".join(f"{n[:15]:>15}" for n in names)
          + f" | {'best':<15} {'ours':>6} {'speedup':>7}   (TFLOP/s)")
    for c in cases:
        if "peers" not in c:
            continue
        cells = " ".join(f"{c['peers'][n]['tflops']:15.0f}" if c["peers"].get(n) else f"{'-':>15}" for n in names)
        ours = f"{c['tflops']:6.0f}" if isinstance(c.get("tflops"), (int, float)) else f"{'-':>6}"
        sp = f"{c['speedup']:6.2f}x" if "speedup" in c else f"{'-':>7}"
        print(f"{c['H']:3d} {c['d']:4d} {c['L']:6d} {'causal' if c['causal'] else 'full':<6} {c.get('batch', 1):2d} "
              f"{cells} | {str(c.get('peer_best')):<15} {ours} {sp}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--cases", default=None, help="H:d:L[:c][:bN],... (default: bench_dit_attention's cases)")
    ap.add_argument("--reps", type=int, default=None, help="graph replays per time (default 50, --quick 10)")
    ap.add_argument("--quick", action="store_true", help="three cases, 10 replays")
    ap.add_argument("--out", default=None, help="folder for dit_attention_torch.json (default bench/results/<gpu>)")
    ap.add_argument("--merge", default=None, help="dit_attention.json to put the peers into (instead of --out)")
    args = ap.parse_args()
    cases = parse_cases(args.cases or (QUICK_CASES if args.quick else DEFAULT_CASES))
    reps = max(args.reps or (10 if args.quick else 50), 5)
    if not torch.cuda.is_available():
        sys.exit("dit_attention_torch.py: needs a CUDA GPU")
    try:
        import flashinfer
        fi_version = getattr(flashinfer, "__version__", "?")
    except Exception as e:  # noqa: BLE001 -- any import failure means: no FlashInfer peers
        flashinfer, fi_version = None, None
        print(f"note: FlashInfer not importable ({type(e).__name__}: {e}); its fa2/fa3 peers are skipped")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"FlashInfer {fi_version or '-'}", flush=True)

    path = args.merge or os.path.join(args.out or os.path.join("bench", "results", gpu_slug()), "dit_attention_torch.json")
    doc = {}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    if not args.merge:
        doc.update({"gpu": torch.cuda.get_device_name(),
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})
    doc["peers_run"] = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "flashinfer": fi_version,
                        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "method": "bench/dit_attention_torch.py: torch SDPA with one backend forced, q/k/v [B, H, L, "
                                  "d]; FlashInfer single_prefill_with_kv_cache fa2/fa3, NHD (batch 1 only); bf16 "
                                  "uniform noise, one input set; one call per CUDA-graph replay after 300 ms of warm-up replays, median of "
                                  f"{reps} per-replay event pairs; tflops over 4 d H x unmasked (query, key) pairs"}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    hits = 0
    for i, c in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] H={c['H']} d={c['d']} L={c['L']} {'causal' if c['causal'] else 'full'} "
              f"b={c['batch']}", flush=True)
        row = run_case(c, flashinfer, reps)
        notes = row.get("peer_notes", {})
        for n, p in row["peers"].items():
            why = notes.get(n) or notes.get("flashinfer")
            print(f"  {n:<16} " + (f"{p['us']:10.1f} us {p['tflops']:6.0f} TFLOP/s" if p else f"refused ({why})"), flush=True)
        hits += merge(doc, [row])
        # written after every case: a run cut short (the GPU machine's 10-minute limit) keeps what it measured
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
    print(f"\nwrote {path}" + (f" ({hits} of {len(cases)} cases already there)" if args.merge else ""))
    print_table(doc["cases"])


if __name__ == "__main__":
    main()
