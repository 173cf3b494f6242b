#!/usr/bin/env bash
# Starts N processes of one program, one per GPU of this machine, for a tensor-parallel step over NCCL
# (tw::NcclRank::from_env): each gets TW_RANK, TW_LOCAL_RANK, TW_WORLD_SIZE and TW_NCCL_ID_FILE (where
# rank 0 writes the NCCL unique id). NVLink multicast stays off in every process (it can take a shared
# host's GPUs out of service). If one rank fails, the others are stopped; the exit status is the first
# failure's.
#   scripts/tp_launch.sh 2 build-gpu/bench/bench_decode_step_tp --model llama-3-70b
set -uo pipefail
if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/tp_launch.sh N PROGRAM [ARGS...]  (N ranks, one per GPU)" >&2
  exit 2
fi
n=$1
shift
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [[ "$gpus" -lt "$n" ]]; then
  echo "tp_launch: $n ranks need $n GPUs; this machine has $gpus" >&2
  exit 2
fi
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export TW_WORLD_SIZE=$n
id_dir=$(mktemp -d)
export TW_NCCL_ID_FILE=$id_dir/nccl_id
trap 'rm -rf "$id_dir"' EXIT
pids=()
for ((r = 0; r < n; ++r)); do
  TW_RANK=$r TW_LOCAL_RANK=$r "$@" &
  pids+=($!)
done
status=0
while [[ ${#pids[@]} -gt 0 ]]; do
  wait -n -p done "${pids[@]}"
  rc=$?
  left=()
  for p in "${pids[@]}"; do [[ $p != "$done" ]] && left+=("$p"); done
  pids=("${left[@]}")  # wait -n on a reaped rank would be an error, not a wait
  if [[ $rc -ne 0 && $status -eq 0 ]]; then
    status=$rc
    echo "tp_launch: a rank exited with status $rc; stopping the others" >&2
    [[ ${#pids[@]} -gt 0 ]] && kill "${pids[@]}" 2>/dev/null
  fi
done
exit $status
