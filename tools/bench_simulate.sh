#!/usr/bin/env bash
# Whole-program timing of `tessel simulate` (process start to exit: preset parsing, workload lowering,
# schedule, graph build, engine run, critical path, summary) for GPT-3 175B, tp8 pp8 interleaved vpp 3,
# by data-parallel size and micro-batches. Prints a markdown table (wall seconds and peak RSS).
# usage: tools/bench_simulate.sh [path/to/tessel]   (default build/tools/tessel)
set -euo pipefail
exe=${1:-build/tools/tessel}
[ -x "$exe" ] || { echo "no tessel at $exe (pass its path)" >&2; exit 2; }
echo "| GPUs | dp | micro-batches | fidelity | events | wall s (whole program) | peak RSS MiB |"
echo "|---:|---:|---:|---|---:|---:|---:|"
for cfg in "16 96 cluster" "64 96 cluster" "4 96 cluster" "8 96 cluster" "32 96 cluster" "16 24 cluster" "16 48 cluster" \
           "16 192 cluster" "16 96 replica" "64 96 replica"; do
  set -- $cfg
  dp=$1 m=$2 fid=$3
  gbs=$((dp * m))
  out=$( { /usr/bin/time -f "TIME %e %M" "$exe" simulate --model gpt3-175b --system dgx-a100 --tp 8 --pp 8 --dp "$dp" \
           --vpp 3 --schedule interleaved --gbs "$gbs" --mbs 1 --fidelity "$fid" --json; } 2>&1 )
  events=$(printf '%s\n' "$out" | python3 -c 'import sys,json; t=sys.stdin.read(); print(json.loads(t[:t.rindex("}")+1])["events"])')
  read -r _ wall rss < <(printf '%s\n' "$out" | grep '^TIME')
  echo "| $((dp * 64)) | $dp | $m | $fid | $events | $wall | $((rss / 1024)) |"
done

# DeepSeek-V3 on 2,048 H800 as DeepSeek ran it (PP16 EP64, issue 24's target: under 1 s in cluster fidelity):
# 3.3 M events, 7,680 expert all-to-all flows of 64 members. Three runs each, to show the machine's spread.
echo
echo "| DeepSeek-V3, 2,048 GPUs | events | wall s (three runs) | peak RSS MiB |"
echo "|---|---:|---|---:|"
for fid in cluster replica; do
  walls="" events="" rss=0
  for _ in 1 2 3; do
    out=$( { /usr/bin/time -f "TIME %e %M" "$exe" simulate --model deepseek-v3 --system h800 --gpus 2048 --gbs 15360 \
             --seq 4096 --layout "tp1 pp16 dp128 ep64 mbs1 1f1b zero1 full" --fidelity "$fid" --json; } 2>&1 )
    events=$(printf '%s\n' "$out" | python3 -c 'import sys,json; t=sys.stdin.read(); print(json.loads(t[:t.rindex("}")+1])["events"])')
    read -r _ wall r < <(printf '%s\n' "$out" | grep '^TIME')
    walls="$walls${walls:+, }$wall"
    rss=$(( r > rss ? r : rss ))
  done
  echo "| $fid | $events | $walls | $((rss / 1024)) |"
done
