#!/usr/bin/env bash
# Training throughput against Hugging Face with each system's own allocator setting.
#
#   bash benchmarks/train_allocators.sh OUT [ROUNDS] [PRECISION] [PRESET]      # defaults: 3 bf16 base
#   ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 bash benchmarks/train_allocators.sh OUT 3 fp32
#   STEPS=8 bash benchmarks/train_allocators.sh OUT 3 bf16 small   # longer rounds: the small model's 2 steps last ~1.3 s
#
# transduce's CPU trainer sets glibc to keep freed memory for reuse (transduce.fast.train.keep_freed_memory);
# Hugging Face leaves glibc's default, which maps every large block afresh and returns it when
# freed. The setting is process-wide, so benchmarks/bench.py runs once per system and setting, in
# processes of their own, alternating within each round: transduce keep, HF return, HF keep,
# transduce return. Three pairings come out, each as its per-round ratios and their median:
# "as shipped" (transduce keep / HF return), both keep, both return. Raw results: OUT/*.json.
# About a minute per process for base on 2 cores.
set -euo pipefail
OUT=${1:?give an output directory}
ROUNDS=${2:-3}
PRECISION=${3:-bf16}
PRESET=${4:-base}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for run in transduce:keep hf:return hf:keep transduce:return; do
    system=${run%%:*} memory=${run##*:}
    python -m benchmarks.bench --presets "$PRESET" --precisions "$PRECISION" --systems "$system" --steps "${STEPS:-2}" \
      --repeats 2 --warmup 1 --decode-sentences 0 --threads "${THREADS:-2}" --freed-memory "$memory" \
      --json "$OUT/$system-$memory-$r.json" > "$OUT/$system-$memory-$r.log" 2>&1 \
      || { echo "bench.py failed: see $OUT/$system-$memory-$r.log" >&2; exit 1; }
    echo "round $r: $system ($memory) $(grep -m1 '^train' "$OUT/$system-$memory-$r.log" | grep -o '[0-9,.]* tgt tok/s')"
  done
done
python - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def train(system, memory, r):
    rows = json.load(open(f"{out}/{system}-{memory}-{r}.json"))
    rows = rows if isinstance(rows, list) else rows["results"]
    return next(x for x in rows if x.get("kind") == "train")

for name, a, b in (("as shipped", "keep", "return"), ("both keep", "keep", "keep"), ("both return", "return", "return")):
    t = [train("transduce", a, r) for r in range(1, rounds + 1)]
    h = [train("hf", b, r) for r in range(1, rounds + 1)]
    ratios = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(t, h)]
    mfu = lambda rows: statistics.median(x["mfu"] or 0 for x in rows) * 100
    print(f"{name:12s} transduce {statistics.median(x['tokens_per_s'] for x in t):7.1f} tok/s ({a}, MFU {mfu(t):.1f}%)"
          f"  HF {statistics.median(x['tokens_per_s'] for x in h):7.1f} ({b}, MFU {mfu(h):.1f}%)"
          f"  ratio per round {', '.join(f'{x:.2f}' for x in ratios)}: median {statistics.median(ratios):.2f}x")
EOF
