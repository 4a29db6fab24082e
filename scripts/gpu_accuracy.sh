#!/usr/bin/env bash
# Two accuracy jobs on one GPU: Table 4's parser (PRESET=parse-wsj) and Multi30k's Transformer-Tiny
# (PRESET=tiny), side by side on one GPU, within one command of at most 10 minutes.
#
#   scripts/gpu_accuracy.sh OUT_DIR     # on the GPU machine, repository root
#
# Needs prepared data copied beside the repository (nothing is downloaded there):
#   .gpu/wsj-xx     `transduce prepare --dataset ptb-wsj --out .gpu/wsj-xx` (the paper's XX tags)
#   .gpu/m30k-data  `transduce prepare --dataset multi30k --src en --tgt de --vocab-size 8000 --out ...`
#   .gpu/data       the dataset mirror (TRANSDUCE_DATA_DIR) for evaluation's references, copied
#                   with `cp -rL` (the mirror's files may be symbolic links, which travel as links)
#   .gpu/wsj-tags   the same with --keep-tags, for WSJ_PRESET=parse-cpu
#
# Multi30k runs scripts/multi30k.sh unchanged (PRESET=tiny: 8,000 updates, the last 10 checkpoints
# averaged, alpha chosen on the validation split) in the background. The parser trains for
# WSJ_MINUTES (default 4) of wall-clock time: the preset's model, batches, rate scale and dropout,
# with WSJ_SETS (default train.warmup_steps=2000; the preset's 16,000 is beyond the steps such a
# budget allows), no cooldown (equation 3 alone), a checkpoint every 250 updates, the last 5 averaged.
# Then it decodes with the paper's search fixed in advance (6.3: beam 21, alpha 0.3, input + 300;
# nothing is tuned, so section 23 is scored directly), each search bounded by DEADLINE_S (default
# 540 s from the start): section 23 unconstrained (the paper's), section 22 the same, section 23
# constrained, section 23 greedy. Logs and scores land in OUT_DIR.
#
# The CPU recipe's parser beside it (pre-norm, tags kept, word positions; docs/parsing.md):
#   WSJ_PRESET=parse-cpu WSJ_DATA=.gpu/wsj-tags WSJ_SETS= WSJ_MINUTES=2 M30K=0 scripts/gpu_accuracy.sh OUT_DIR
set -uo pipefail
OUT=${1:?usage: scripts/gpu_accuracy.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-540}
WSJ_MINUTES=${WSJ_MINUTES:-4}
WSJ_PRESET=${WSJ_PRESET:-parse-wsj}
WSJ_DATA=${WSJ_DATA:-.gpu/wsj-xx}
WSJ_SETS=${WSJ_SETS-train.warmup_steps=2000}
read -r -a SETS <<< "$WSJ_SETS"
WORK=${WORK:-/tmp/gpu-accuracy}
mkdir -p "$WORK/bin"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRANSDUCE_DATA_DIR=$PWD/.gpu/data
PY=${PYTHON:-python3}
printf '#!/bin/sh\nexec %s -m transduce "$@"\n' "$PY" > "$WORK/bin/transduce"
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > "$WORK/bin/python"
chmod +x "$WORK/bin/transduce" "$WORK/bin/python"
export PATH="$WORK/bin:$PATH"
left() { echo $((DEADLINE_S - ($(date +%s) - START))); }

# Multi30k, Transformer-Tiny: the main job's script, in the background.
M30K_PID=
if [ "${M30K:-1}" = 1 ]; then
mkdir -p "$WORK/m30k"
[ -d "$WORK/m30k/data" ] || cp -r .gpu/m30k-data "$WORK/m30k/data"
(RUN=$WORK/m30k PRESET=tiny SAVE_STEPS=100 AVERAGE=10 THREADS=4 PRECISION=bf16 \
  timeout $((DEADLINE_S - 10)) bash scripts/multi30k.sh > "$OUT/m30k.log" 2>&1; echo "multi30k.sh exit $?" >> "$OUT/m30k.log") &
M30K_PID=$!
fi

# Table 4: parse-wsj.
RUN=$WORK/wsj
mkdir -p "$RUN"
[ -d "$RUN/data" ] || cp -r "$WSJ_DATA" "$RUN/data"
transduce train --data "$RUN/data" --run-dir "$RUN" --preset "$WSJ_PRESET" ${SETS[@]+"${SETS[@]/#/--set=}"} \
  --max-minutes "$WSJ_MINUTES" --precision bf16 --valid-every 500 --save-every-steps 250 --save-every-minutes 0 \
  --keep-last 5 --quiet --no-tensorboard --log-every 100 > "$OUT/wsj.log" 2>&1
echo "train exit $?" >> "$OUT/wsj.log"
n=$(python -c "import sys; from transduce.checkpoint.run_dir import list_checkpoints, on_interval
print(sum(on_interval(p) for _, p in list_checkpoints(sys.argv[1])))" "$RUN")  # the checkpoints transduce average counts
MODEL=$RUN/model  # the last step's, where no checkpoint was written on the interval
if [ "$n" -gt 0 ] && transduce average "$RUN" --average $((n < 5 ? n : 5)) --out "$RUN/avg" >> "$OUT/wsj.log" 2>&1; then
  MODEL=$RUN/avg
fi
COMMON=(--dataset ptb-wsj --beam 21 --length-penalty gnmt:0.3 --max-len-offset 300 --batch-size 128 --precision bf16 --workers 1 --quiet)
for search in 23 22 23-constrained 23-greedy; do
  t=$(left)
  [ "$t" -gt 15 ] || { echo "== $search: not run (deadline)" >> "$OUT/wsj.log"; continue; }
  case $search in
    23) flags=(--split 23) ;;
    22) flags=(--split 22) ;;
    23-constrained) flags=(--split 23 --constrained) ;;
    23-greedy) flags=(--split 23 --greedy) ;;
  esac
  s0=$(date +%s)
  timeout "$t" transduce evaluate "$MODEL" "${COMMON[@]}" "${flags[@]}" --json "$RUN/eval.$search.json" \
    >> "$OUT/wsj.log" 2>&1
  echo "== $search: exit $?, $(( $(date +%s) - s0 )) s" >> "$OUT/wsj.log"
done
[ -z "$M30K_PID" ] || wait "$M30K_PID"
cp "$RUN/logs/train.jsonl" "$OUT/wsj.train.jsonl" 2>/dev/null
cp "$WORK/m30k/logs/train.jsonl" "$OUT/m30k.train.jsonl" 2>/dev/null
tar -czf "$OUT/scores.tgz" -C "$WORK" $(cd "$WORK" && ls wsj/eval.*.json m30k/alpha/*.json m30k/test_2016_flickr.*.json 2>/dev/null) 2>/dev/null
$PY - "$WORK" <<'PY'
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
for p in sorted(w.glob("wsj/eval.*.json")):
    s = json.loads(p.read_text())["scores"]
    f1 = s.get("evalb_gold_tags", s.get("evalb", {})).get("all", {}).get("f1")
    print(f"WSJ {p.stem[5:]}: EVALB F1 (gold tags put back) {f1}")
for p in sorted(w.glob("m30k/test_2016_flickr.*.json")):
    print(f"Multi30k {p.stem}: " + ", ".join(f"{k} {v['score']:.2f}" for k, v in json.loads(p.read_text())["scores"].items()
                                             if isinstance(v, dict) and "score" in v))
PY
echo "elapsed $(( $(date +%s) - START )) s"
