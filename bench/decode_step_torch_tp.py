#!/usr/bin/env python3
"""PyTorch's tensor-parallel decode step (issue 21's baseline): one rank of a Llama / Qwen2 model split tp ways.

  scripts/tp_launch.sh 2 python3 bench/decode_step_torch_tp.py --model llama-3-70b --out DIR [--merge FILE]
      one process per GPU: torch.distributed over NCCL, the all-reduces as functional collectives inside the
      compiled step (torch.compile fullgraph, then one CUDA graph), as bench/decode_step_torch.py times the
      one-GPU step.
  python3 bench/decode_step_torch_tp.py --model llama-3-70b --tp 2 --out DIR [--merge FILE]
      alone: rank 0's step with its collectives left out (what tileweave's bench_decode_step_tp does alone).

A rank holds the shard tileweave's does (tensor_parallel_shard): its query and KV heads, FFN columns and
vocabulary block, the embedding whole; o_proj's and down's outputs are all-reduced before the residual add; the
greedy token is the best of the ranks' (max, index) pairs (an all-gather). The step module, its random weights and
its timing are bench/decode_step_torch.py's (DecodeStep, capture, time_graph).

Output: DIR/decode_step_torch_tp.json {"cases": [{"model", "tp", "batch", "kv_len", "torch_tp_us", "mode"}]};
--merge FILE sets torch_tp_us (and speedup_vs_torch_tp where the entry has step_us) on FILE's cases with the same
model, tp, batch and kv_len.
"""
import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_step_torch as base  # noqa: E402  (sets the compile caches before torch is imported)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


class RankStep(base.DecodeStep):
    """Rank `rank` of `tp`: the shard's step; collectives over the default group when `collectives`."""

    def __init__(self, cfg, tp, rank, batch, s_max, device, collectives):
        for what, v in (("n_kv", cfg.n_kv), ("n_q", cfg.n_q), ("inter", cfg.inter), ("vocab", cfg.vocab)):
            if v % tp:
                raise ValueError(f"{cfg.name}: {what} {v} is not divisible by {tp} ranks")
        shard = dataclasses.replace(cfg, name=f"{cfg.name}/tp{tp}", n_q=cfg.n_q // tp, n_kv=cfg.n_kv // tp,
                                    inter=cfg.inter // tp, vocab=cfg.vocab // tp, tied=False)
        super().__init__(shard, batch, s_max, device)
        self.tp, self.rank, self.collectives = tp, rank, collectives
        self.register_buffer("embed_full", torch.empty(cfg.vocab, cfg.hidden, device=device, dtype=torch.bfloat16))

    def init_random(self, std=0.02, seed=0, **kw):
        super().init_random(std=std, seed=seed + self.rank, **kw)
        self.embed_full.normal_(0.0, std)
        return self

    def _embed_rows(self, tokens):
        return self.embed_full[tokens]

    def _reduce(self, x):
        if not self.collectives:
            return x
        import torch.distributed._functional_collectives as funcol
        return funcol.all_reduce(x, "sum", dist.group.WORLD)

    def _pick(self, logits):
        v, i = logits.float().max(-1)
        i = i + self.rank * self.cfg.vocab
        if not self.collectives:
            return i
        import torch.distributed._functional_collectives as funcol
        vs = funcol.all_gather_tensor(v, 0, dist.group.WORLD).view(self.tp, -1)
        ids = funcol.all_gather_tensor(i, 0, dist.group.WORLD).view(self.tp, -1)
        return ids.gather(0, vs.argmax(0, keepdim=True)).squeeze(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--tp", type=int, default=2, help="ranks (under the launcher: TW_WORLD_SIZE)")
    ap.add_argument("--cases", default="1:1024,1:4096,16:1024,16:4096", help="batch:kv_len,...")
    ap.add_argument("--out", required=True)
    ap.add_argument("--merge", default="")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.model not in base.NAMED and args.model != "llama-3-70b":
        sys.exit(f"unknown model {args.model!r}")
    cfg = base.NAMED.get(args.model) or base.ModelCfg("llama-3-70b", "llama", 128256, 8192, 28672, 80, 64, 8, 128,
                                                      1e-5, 500000.0, None, tied=False, max_pos=8192)
    launched = "TW_WORLD_SIZE" in os.environ
    rank = int(os.environ.get("TW_RANK", 0))
    tp = int(os.environ["TW_WORLD_SIZE"]) if launched else args.tp
    torch.cuda.set_device(int(os.environ.get("TW_LOCAL_RANK", rank)))
    if launched and tp > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=rank, world_size=tp)
    collectives = launched and tp > 1
    mode = "nccl" if collectives else "one_rank_no_collectives"
    rows = []
    for item in args.cases.split(","):
        batch, kv = (int(x) for x in item.split(":"))
        t0 = time.time()
        model = RankStep(cfg, tp, rank, batch, kv, "cuda", collectives).init_random(seed=args.seed)
        tokens = torch.randint(0, cfg.vocab, (batch,), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        pos = torch.full((batch,), kv - 1, dtype=torch.int64, device="cuda")
        with torch.no_grad():
            torch._dynamo.reset()
            cfn = torch.compile(model, mode="default", fullgraph=True, dynamic=False)
            cfn(tokens, pos)
            torch.cuda.synchronize()
            g, _ = base.capture(cfn, tokens, pos)
            us = base.time_graph(g, args.reps)
            del g
        torch._dynamo.reset()
        row = {"model": cfg.name, "tp": tp, "batch": batch, "kv_len": kv, "torch_tp_us": round(us, 1), "mode": mode,
               "weights_bytes": model.cfg.weight_bytes(), "kv_bytes": model.cfg.kv_bytes(batch, kv)}
        rows.append(row)
        if rank == 0:
            print(f"  {cfg.name} tp={tp} B={batch} KV={kv}: {us:.1f} us ({mode}; ready in {time.time() - t0:.0f} s)", flush=True)
        del model, cfn
        torch.cuda.empty_cache()
    if rank != 0:
        return
    os.makedirs(args.out, exist_ok=True)
    doc = {"benchmark": "decode_step_torch_tp", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cases": rows}
    path = os.path.join(args.out, "decode_step_torch_tp.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"-> {path}")
    if args.merge:
        with open(args.merge) as f:
            target = json.load(f)
        for c in target.get("cases", []):
            for r in rows:
                if (c.get("model"), c.get("tp"), c.get("batch"), c.get("kv_len")) == (r["model"], r["tp"], r["batch"], r["kv_len"]):
                    c["torch_tp_us"] = r["torch_tp_us"]
                    c["torch_tp_mode"] = mode
                    if c.get("step_us"):
                        c["speedup_vs_torch_tp"] = round(r["torch_tp_us"] / c["step_us"], 3)
        with open(args.merge, "w") as f:
            json.dump(target, f, indent=2)
            f.write("\n")
        print(f"merged into {args.merge}")
    if collectives:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
