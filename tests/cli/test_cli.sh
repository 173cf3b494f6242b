#!/usr/bin/env bash
# The `tileweave` CLI end to end: the main job, every subcommand, --json, and bad input (exactly one
# line on stderr naming the bad value, exit code 2). Usage: tests/cli/test_cli.sh path/to/tileweave
set -uo pipefail
TW=${1:?usage: test_cli.sh path/to/tileweave}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error "<text the message must contain>" args...
expect_error() {
  local want=$1; shift
  timeout 60 "$TW" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 2 ]; then fail "tileweave $* -> exit $rc, want 2 ($(head -c 300 "$tmp/err"))"; return; fi
  if [ "$lines" -ne 1 ]; then fail "tileweave $* -> $lines lines on stderr, want 1"; return; fi
  grep -qF -- "$want" "$tmp/err" || fail "tileweave $* -> '$(cat "$tmp/err")' does not name '$want'"
}
# expect_ok "<text stdout must contain>" args...
expect_ok() {
  local want=$1; shift
  timeout 120 "$TW" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 0 ]; then fail "tileweave $* -> exit $rc: $(head -c 300 "$tmp/err")"; return; fi
  grep -qF -- "$want" "$tmp/out" || fail "tileweave $* -> output lacks '$want'"
}
expect_json() {
  timeout 120 "$TW" "$@" >"$tmp/out" 2>"$tmp/err" || { fail "tileweave $* failed"; return; }
  python3 -m json.tool "$tmp/out" >/dev/null || fail "tileweave $* -> not JSON"
}

# The main job.
expect_ok "prefill" 
grep -q "hilbert" "$tmp/out" || fail "main job lacks the hilbert order"
grep -q "bound compulsory" "$tmp/out" || fail "main job lacks the bounds"

# Subcommands.
expect_ok "model:  DRAM read" step --model tiny-qwen2 --batch 3 --kv 40 --layout paged --page-size 32
expect_json step --model tiny-llama --json
expect_ok "a stage is 256 K columns, one 64 KiB copy" step --model llama-3-8b --batch 1
expect_ok "a stage is 192 K columns, one 48 KiB copy" step --model llama-3-8b --batch 16
expect_ok "split attention pairs merged by o_proj's consumers" step --model llama-3-8b --batch 1
expect_ok "merged by the last attention tile of each" step --model llama-3-8b --batch 2
expect_error "unknown model config 'nope'" step --model nope
expect_error "batch 0" step --model tiny-llama --batch 0
expect_ok "all-reduces of 32.8 KB" step --model llama-3-70b --tp 2
expect_error "num_kv_heads 8 is not divisible by 3" step --model llama-3-70b --tp 3
expect_ok "grouped:8" orders
expect_ok "ticket of each output tile" orders --gemm 64x64x64 --tile 16x16x16 --show hilbert
expect_ok "x bound" sim --model llama3-70b --m 1
expect_ok "chain_half_rows" sim --model chain --m 256 --split-k 2
expect_ok "pebble:gemm" bounds --gemm 4096x4096x4096 --cache 1MiB
expect_ok "optimal orders" search --gemm 48x48x16 --tile 16x16x16 --cache 1536 --p 1 --quiet
expect_ok "heuristic search" search --gemm 512x512x128 --tile 64x64x64 --cache 512KiB --p 8 --time-limit 1 --quiet \
  --save "$tmp/found.json"
expect_ok "x bound" sim --gemm 512x512x128 --tile 64x64x64 --cache 512KiB --p 8 --order-file "$tmp/found.json"
expect_json sim --gemm 256x256x64 --tile 64x64x64 --json --trace
expect_json search --gemm 48x48x16 --tile 16x16x16 --cache 2048 --p 1 --json --quiet
expect_json bounds --json
expect_json orders --json
expect_json orders --model chain --m 32 --tile 16x128x64 --show chain_rows:1 --json
expect_ok "decode attention" sim --attention 16x4096
expect_ok "too large to draw" orders --attention 1x4096 --show kslices/col_major
expect_ok "heuristic search" search --attention 2x300 --time-limit 1 --quiet
expect_json bounds --attention 1x4096 --split-k 8 --json
# The partitioned L2 model, predicted time, the fusion report (issue 17).
expect_ok "pred. us" sim --m 256 --l2-model partitioned
expect_ok "partitioned L2 (2 x 128 B lines, 16 ways" sim --m 256 --l2-model partitioned --order col_major
expect_ok "chain:" sim --gemm 512x512x512 --order row_major
grep -q "compute" "$tmp/out" || fail "sim of one order lacks the per-op bound"
expect_ok "fully associative" sim --m 64 --l2-model partitioned --l2-ways 0 --l2-jitter 0 --l2-skew 0 --l2-far-copies 0 \
  --l2-partitions 1 --order col_major
expect_json sim --m 64 --l2-model partitioned --json
grep -q '"fused_us"' "$tmp/out" || fail "sim --json lacks the predicted time"
echo '{"base": "h100", "name": "h100-probed", "l2": {"ways": 8, "far_copies": false}}' >"$tmp/preset.json"
expect_ok "h100-probed" sim --gpu "$tmp/preset.json" --m 16 --order col_major --l2-model partitioned
expect_ok "many-to-many" graph --m 256 --d 512 --ffn 1024
# The validation grid on the CPU: model columns alone, then against a measured file of one case.
expect_ok "8b-down      256 kslices/col_major" validate --only 8b-down --ms 256
echo '{"cases": [{"op": "gemm", "shape": "8b-down", "m": 256, "order": "col_major", "schedule": "col_major",
  "ncu_read_bytes": 129100000, "measured_us": 78.9}]}' >"$tmp/mvn.json"
expect_ok "gemm 8b-down" validate --measured "$tmp/mvn.json"
expect_json validate --measured "$tmp/mvn.json" --json
echo '{"cases": [{"op": "ffn", "shape": "llama3-70b", "m": 256, "order": "col_major"}]}' >"$tmp/bad.json"
expect_error "unknown validation shape 'llama3-70b'" validate --measured "$tmp/bad.json"
expect_error "malformed JSON" validate --measured /dev/null
expect_ok "reorganize" graph --decode-step tiny-llama --batch 2 --kv 40
expect_json graph --attention 2x300 --json
grep -q '"class"' "$tmp/out" || fail "graph --json lacks the edge classes"

# Bad input.
expect_error "got 0" sim --m 0
expect_error "-5" sim --m=-5
expect_error "99999999999" sim --m 99999999999
expect_error "abc" sim --m abc
expect_error "M must be positive, got 0" sim --gemm 0x16x16
expect_error "10x10" sim --gemm 10x10
expect_error "length L must be positive, got 0" sim --attention 1x0
expect_error "not of the form AxB" sim --attention 16
expect_error "--tile does not apply" sim --attention 16x4096 --tile 16x16x16
expect_error "split_k 17" sim --attention 1x4096 --split-k 17
expect_error "absurd" sim --gemm 2000000000x64x64
expect_error "K-steps is absurd" sim --gemm 1048576x1048576x1048576 --tile 1024x1024x1024
expect_error "BM 128 is larger than M 64" sim --gemm 64x64x64 --tile 128x16x16
expect_error "smaller than one line" sim --cache 16
expect_error "12XB" sim --cache 12XB
expect_error "line size 0" sim --line 0
expect_error "-1" sim --p=-1
expect_error "sets 0" sim --sets 0
expect_error "split-k 0" sim --split-k 0
expect_error "zigzag" sim --order zigzag
expect_error "swizzle:0" sim --order swizzle:0
expect_error "v100" sim --gpu v100
expect_error "llama2" bounds --model llama2
echo '[0, 1' >"$tmp/bad.json"
expect_error "malformed JSON" sim --gemm 32x32x16 --tile 16x16x16 --order-file "$tmp/bad.json"
echo '[3, 2, 1]' >"$tmp/short.json"
expect_error "has 3 tiles" sim --gemm 32x32x16 --tile 16x16x16 --order-file "$tmp/short.json"
echo '{"order": [[1, 0, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [1, 1, 0]]}' >"$tmp/dep.json"
expect_error "dependency tile 0" sim --model chain --m 32 --d 16 --ffn 32 --tile 16x16x16 --order-file "$tmp/dep.json"
expect_ok "chain_rows:1" sim --model chain --m 32 --d 16 --ffn 32 --tile 16x16x16 --p 1 --cache 4KiB
expect_error "hidden size --d" sim --d=-3
expect_error "missing.json" sim --order-file "$tmp/missing.json"
expect_error "foo" search --method foo
expect_error "-1" search --time-limit=-1
expect_error "P = 8" search --gemm 32x32x16 --tile 16x16x16 --method exact --p 8
expect_error "unknown L2 model 'lru'" sim --l2-model lru
expect_error "need --l2-model partitioned" sim --l2-ways 4
expect_error "partitions must be 1 or 2, got 3" sim --l2-model partitioned --l2-partitions 3
expect_error "--l2-far-copies 2" sim --l2-model partitioned --l2-far-copies 2
expect_error "jitter 1.5" sim --l2-model partitioned --l2-jitter 1.5
expect_error "cannot read GPU preset file" sim --gpu "$tmp/none.json"
echo '{"l2": {"ways": -3}}' >"$tmp/badpreset.json"
expect_error "'ways' = -3" sim --gpu "$tmp/badpreset.json"
expect_error "exact search replays the simple" search --gemm 48x48x16 --tile 16x16x16 --p 1 --method exact --l2-model partitioned
expect_error "unknown model config 'nope'" graph --decode-step nope
# plan: the executor's plan and the ranked candidates (ffn gated and plain, gemm, --json), bad values.
expect_ok "Executor's plan (FusedFfn's default options)" plan ffn --m 16 --d 1024 --f 2048
grep -q "<- executor" "$tmp/out" || fail "plan ffn lacks the executor's row"
grep -q "model's best" "$tmp/out" || fail "plan ffn lacks the model's best"
expect_ok "plain MLP M=37" plan ffn --m 37 --d 1024 --f 2048 --plain
# An op of more tiles than SMs with a partial last wave: only that wave in K slices (whole waves).
expect_ok "2352 tiles in 636 tickets, 4.82 waves of 132, order waves:132/kslices/col_major" plan ffn --m 512 --d 11520 --f 8704
expect_ok "GEMM M=16 N=256 K=1024" plan gemm --m 16 --n 256 --k 1024
grep -q "split=auto kslices/col_major" "$tmp/out" || fail "plan gemm lacks the executor's knobs"
expect_json plan gemm --m 256 --n 1024 --k 2048 --json
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['executor']['executor'] and d['candidates'] and d['best']['ratio_to_executor'] <= 1.0 and sum(c['executor'] for c in d['candidates']) == 1" "$tmp/out" ||
  fail "plan --json lacks the executor, the candidates or the best"
expect_error "M must be positive, got 0" plan ffn --m 0 --d 4096 --f 14336
expect_error "M must be positive, got -3" plan gemm --m -3 --n 256 --k 1024
expect_error "M = 100000 is over" plan ffn --m 100000 --d 4096 --f 14336
expect_error "K = 1001 must be a multiple of 8" plan gemm --m 16 --n 256 --k 1001
expect_error "unknown op 'conv'" plan conv --m 16
# plan attention: DecodeAttention's planner (the op's own) with its bytes, merges, the cost model's
# time and the candidates it weighed.
expect_ok "128 tiles, 1 per SM, 8 warps each; 8 pairs" plan attention --len 32768 --heads 32/8
grep -q "widest over 16 tiles" "$tmp/out" || fail "plan attention lacks the merges"
grep -q "<- the plan" "$tmp/out" || fail "plan attention does not mark the plan among the candidates"
expect_ok "4 warps each" plan attention --lens 3764,1990,1624,1285 --heads 14/2 --dim 256 --page-size 16
grep -q "chosen by the cost model: the rules' plan (132 tiles" "$tmp/out" || fail "plan attention: d = 256 ragged should leave the rules' 132 tiles"
expect_json plan attention --batch 64 --len 512 --heads 32/8 --json
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['plan']['split_pairs'] == 0 and d['model']['us'] > 0 and len(d['candidates']) > 1" "$tmp/out" ||
  fail "plan attention --json: whole pairs expected at B = 64, L = 512"
expect_ok "few-token path: 16 blocks, one per (sequence, KV head) pair" plan attention --batch 16 --len 13 --heads 8/1 --dim 64 --page-size 64
expect_ok "128 tiles" plan attention --len 32768 --heads 32/8
grep -q "few-token" "$tmp/out" && fail "plan attention: a long pair should keep the stream-K plan"
expect_error "group size 17" plan attention --len 100 --heads 34/2
expect_error "head_dim 96 is not 64, 128 or 256" plan attention --len 100 --dim 96
expect_error "--heads '32' is not Q/KV" plan attention --len 100 --heads 32
expect_error "--len (every sequence) or --lens" plan attention --heads 32/8
expect_error "--lens item 'x' is not an integer" plan attention --lens 5,x
expect_error "--m/--d/--f/--n/--k do not apply" plan attention --len 5 --m 3
# The attention half of a DiT block as one tile graph: its fusion report and the orders' traffic.
expect_ok "qkv -> attention via qkv: many-to-many" graph --dit 4x1000
expect_ok "op attention        prefill_attention" graph --dit 24x4608
expect_ok "col_major" sim --dit 24x4608
expect_error "--dit and --gemm / --attention name two problems" sim --dit 24x4608 --gemm 64x64x64
expect_error "--tile and --split-k do not apply to --dit" sim --dit 24x4608 --tile 64x64x64
# plan prefill: PrefillAttention's plan and the traffic model's DRAM bytes for the kernel's order and
# the other: at H 24, L 14034 the kernel's (head by head) reads K/V once, query tile by tile many times.
expect_ok "items of 128 query rows x 1 head, K/V tiles of 160 keys; 2640 items" plan prefill --heads 24/24 --len 14034
grep -qE "heads .* 1.00x .*\(the kernel.s\)" "$tmp/out" || fail "plan prefill: the kernel's order should read the minimum"
grep -q "every item whole (a split tail would not end sooner)" "$tmp/out" || fail "plan prefill: L 14034 fills 20 rounds"
# The last round split over key ranges (plan_prefill_work): 864 items, the last 72 a stream-K tail.
expect_ok "the last 72 items as a tail of 132 units (72 split over key ranges" plan prefill --heads 24/24 --len 4608
expect_ok "K/V tiles of 64 keys" plan prefill --heads 16/8 --dim 256 --len 3000
expect_ok "K/V tiles of 192 keys" plan prefill --heads 24/24 --lens 4096,1000,3 --causal --fp8
expect_json plan prefill --heads 16/4 --len 4097 --json
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); o=d['orders']; assert o[0]['kernel'] and o[0]['order'] == 'heads' and d['plan']['block_n'] == 160 and d['predicted_us'] > 0, d" "$tmp/out" ||
  fail "plan prefill --json: the kernel's order first, 160-key tiles"
expect_error "fp8 attention takes head_dim 128, got 64" plan prefill --heads 8/8 --dim 64 --len 100 --fp8
expect_error "--heads '24' is not Q/KV" plan prefill --heads 24 --len 100
expect_error "--plain and --page-size do not apply" plan prefill --heads 8/8 --len 100 --page-size 16
expect_error "--f is required" plan ffn --m 16 --d 4096
expect_error "--n does not apply" plan ffn --m 16 --d 4096 --f 14336 --n 5
expect_error "nosuch" nosuch
expect_error "--bogus" sim --bogus

if [ "$fails" -ne 0 ]; then echo "$fails CLI checks failed"; exit 1; fi
echo "all CLI checks passed"
