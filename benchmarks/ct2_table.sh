#!/usr/bin/env bash
# RESULTS.md's CPU decoding table in one command: beam-4 decoding, transduce against CTranslate2, the
# small and base presets, in one process of two threads (W=1) and in two one-thread workers each
# (W=2: transduce --workers 2 against CTranslate2's inter_threads=2), natively and held to AVX2.
#
#   bash benchmarks/ct2_table.sh OUT                 # native, then AVX2
#   bash benchmarks/ct2_table.sh OUT native          # one class only
#   DATA_DIR=../shared/data bash benchmarks/ct2_table.sh OUT
#
# Each cell is benchmarks/decode_speed.py (random weights, beam 4 forced to the reference lengths
# of newstest2014's first 512 (small) / 256 (base) sentences, batches of 32, each system in a
# process of its own, best of 2 rounds); its header names the CPU and each library's ISA. "avx2" is
# an imitation of an AVX2-only CPU: every library held to AVX2 (oneDNN, ATen, MKL, fbgemm,
# CTranslate2's kernels) and CTranslate2's GEMMs on oneDNN as on an AMD CPU (CT2_USE_MKL=0; on
# Intel it would take its bundled MKL). About 25 minutes on 2 cores: run it on a quiet machine.
# Raw results: OUT/ISA-WW-PRESET.json and .log; the summary at the end is OUT/table.md.
set -euo pipefail
OUT=${1:?give an output directory}
shift
CLASSES=${*:-native avx2}
for isa in $CLASSES; do
  case $isa in native|avx2) ;; *) echo "ct2_table.sh: error: unknown class '$isa' (native or avx2)" >&2; exit 2 ;; esac
done
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
AVX2_ENV="MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 CT2_FORCE_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 CT2_USE_MKL=0"
for isa in $CLASSES; do
  case $isa in
    native) env_=""; precisions=fp32,bf16,int8 ;;
    avx2) env_=$AVX2_ENV; precisions=fp32,int8 ;;
  esac
  for workers in 1 2; do
    for preset in small base; do
      n=512; [ "$preset" = base ] && n=256
      name=$isa-W$workers-$preset
      echo "$(date -u +%H:%M:%S) $name"
      # shellcheck disable=SC2086
      env OMP_NUM_THREADS=2 $env_ python -m benchmarks.decode_speed --presets "$preset" --systems transduce,ct2 \
        --precisions "$precisions" --n-sentences "$n" --batch-size 32 --threads 2 --workers "$workers" \
        --repeats 2 ${DATA_DIR:+--data-dir "$DATA_DIR"} --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
        || { echo "decode_speed.py failed: see $OUT/$name.log" >&2; exit 1; }
    done
  done
done
python - "$OUT" <<'EOF' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| preset | ISA | W | transduce fp32 / bf16 / int8 | CT2 fp32 / int8 | best / CT2 best |")
print("|---|---|---|---|---|---|")
for f in sorted(out.glob("*-W*-*.json"), key=lambda p: (p.stem.split("-")[0] != "native", p.stem)):
    isa, w, preset = f.stem.split("-")
    rows = json.loads(f.read_text())["results"]
    speed = {(r["system"], r["precision"]): r["sentences_per_s"] for r in rows}
    mine = [speed.get(("transduce", p)) for p in ("fp32", "bf16", "int8")]
    theirs = [speed.get(("ct2", p)) for p in ("fp32", "int8")]
    cell = lambda xs: " / ".join("–" if x is None else f"{x:.2f}" for x in xs)
    ratio = max(x for x in mine if x) / max(x for x in theirs if x)
    print(f"| {preset} | {isa} | {w[1:]} | {cell(mine)} | {cell(theirs)} | {ratio:.2f}x |")
EOF
