#!/usr/bin/env bash
# The GPU path in one command, for a fresh CUDA machine with this repository copied (PyTorch,
# transformers, sentencepiece, safetensors, sacrebleu, sacremoses, tqdm, pytest installed; no network
# needed; no `pip install` of transduce: PYTHONPATH=src). About ten minutes on a recent GPU with
# GPU_ARGS="--decode-batch 64 --decode-sentences 512".
#
#   scripts/gpu_check.sh "$OUT"          # on the GPU; every figure lands in $OUT
#   scripts/gpu_check.sh --dry dry-run   # the same steps, tiny, on the CPU (a minute or two)
#
# 1. correctness: tests/test_cuda.py (model vs CPU, cached decoding vs full recomputation, beam
#    search vs CPU, training steps in fp32/bf16/fp16 lowering the loss, flash vs math attention),
#    tests/test_device.py's CUDA test and tests/test_fast_step.py (the flat decoding step that
#    `fast.decode.apply` installs there, bit for bit the model's), on the GPU -> tests.log, tests.xml
# 2. a short real training run (`transduce train`, bf16, the reverse task written as a prepared
#    directory) whose loss must fall                               -> train_check.log, train.jsonl
# 3. benchmarks/gpu.py: base and big training throughput and MFU (bf16, bf16 with the math
#    attention kernel, fp16 with loss scaling, bf16 + torch.compile), beam-4 decoding against
#    Hugging Face generate                                         -> gpu.json, gpu.md, gpu.log
# GPU_ARGS: more arguments for benchmarks/gpu.py (e.g. "--decode-batch 64"); SKIP_TESTS=1 leaves part 1 out.
# Exit status: 0 when every part passed; the summary is in $OUT/summary.md.
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry" ]; then DRY=1; shift; fi
OUT=${1:-${OUT:-gpu-results}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=()

{ date -u; git rev-parse --short HEAD 2>/dev/null || true; nvidia-smi 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), platform.processor())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ $DRY = 1 ]; then
  export TRANSDUCE_TEST_DEVICE=cpu DEVICE=cpu STEPS=150 DIM=32 DRYFLAG=--dry OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  export DEVICE=cuda STEPS=600 DIM=256 DRYFLAG=
fi

echo "== 1. tests on $DEVICE"
[ "${SKIP_TESTS:-0}" = 1 ] && echo "(skipped: SKIP_TESTS=1)" > "$OUT/tests.log" || \
$PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_device.py tests/test_fast_step.py --junitxml="$OUT/tests.xml" 2>&1 | tee "$OUT/tests.log"
status+=("tests: exit ${PIPESTATUS[0]}")

echo "== 2. a short real training run on $DEVICE (bf16): its loss must fall"
WORK=$(mktemp -d)
train_check() {
  $PY -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; from train_data import make_data; \
make_data(Path('$WORK/data'), n_train=20000, n_valid=100)" || return 1
  $PY -m transduce train --data "$WORK/data" --run-dir "$WORK/run" --preset base --set model.n_layers=2 \
    --set model.d_model=$DIM --set model.d_ff=$((4 * DIM)) --set model.n_heads=4 --set model.dropout=0.0 \
    --device $DEVICE --precision bf16 --max-steps $STEPS --batch-tokens 4000 --warmup 50 --log-every 10 \
    --valid-every 0 --save-every-steps 0 --quiet --no-tensorboard || return 1
  cp "$WORK/run/logs/train.jsonl" "$OUT/train.jsonl"
  $PY -c "
import json, sys
losses = [r['loss'] for r in map(json.loads, open('$OUT/train.jsonl')) if r.get('type') == 'train']
first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
print(f'training loss: first logged {first:.3f}, last {last:.3f} ({len(losses)} records)')
sys.exit(0 if last < 0.75 * first else 1)  # a clear fall"
}
train_check 2>&1 | tee "$OUT/train_check.log"
status+=("training run: exit ${PIPESTATUS[0]}")
rm -rf "$WORK"

echo "== 3. throughput, MFU and decoding"
$PY -m benchmarks.gpu --out "$OUT" $DRYFLAG ${GPU_ARGS:-} 2>&1 | tee "$OUT/gpu.log"
status+=("benchmarks/gpu.py: exit ${PIPESTATUS[0]}")
# --profile (in GPU_ARGS) writes one table per setting: one archive travels better than a dozen files
if ls "$OUT"/profile_*.txt >/dev/null 2>&1; then
  tar -czf "$OUT/profiles.tgz" -C "$OUT" $(cd "$OUT" && ls profile_*.txt) && rm -f "$OUT"/profile_*.txt
fi

{ echo "# scripts/gpu_check.sh $([ $DRY = 1 ] && echo --dry)"; echo; for s in "${status[@]}"; do echo "- $s"; done
  echo; tail -n 3 "$OUT/tests.log"; echo; grep "training loss" "$OUT/train_check.log"; echo; cat "$OUT/gpu.md" 2>/dev/null
} > "$OUT/summary.md"
cat "$OUT/summary.md"
case "${status[*]}" in *"exit 1"*|*"exit 2"*|*"exit 3"*|*"exit 4"*|*"exit 5"*) exit 1 ;; esac
