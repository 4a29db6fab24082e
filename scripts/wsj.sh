#!/usr/bin/env bash
# transduce's parsing job (Section 6.3, Table 4): WSJ constituency parsing on a 2-core CPU.
#
# The recipe is defined by updates, not minutes, so that every machine trains the same model
# and only the time differs:
#   prepare  the Penn Treebank WSJ from the mirror (licensed: <data-dir>/ptb-wsj, never
#            downloaded): 02-21 train, 22 dev, 23 test; source = the words (16K BPE pieces, as
#            in 6.3), target = Vinyals et al.'s linearized tree with the part-of-speech tags kept
#            (tensor2tensor's variant: 103 symbols; TAGS=0 for the paper's XX, 59 symbols)
#   train    preset `parse-cpu` (N=4, d_model=256, d_ff=1024, h=4, dropout 0.1 on sub-layers
#            and attention weights, untied vocabularies, pre-norm), batches of 4096 tokens, warmup 600,
#            peak rate 2.04e-3, 5,500 updates (about 57 minutes on 2 Intel AMX cores in bf16), the rate
#            decaying linearly to 0 over the last 20% (COOLDOWN 0.2, not the paper's schedule);
#            a checkpoint every SAVE_STEPS (250) updates
#   average  the last K checkpoints, for each K in AVERAGE (default "1 5": the last one alone, and 6.1's average of 5)
#   choose   K and the length penalty alpha for beam 21 on section 22 (EVALB F1, gold tags put
#            back): alpha among 0.3 (the paper's), 0.6, 1.0, 1.5, with the constrained search
#            that the last line below reports (CONSTRAINED=0: the paper's unconstrained search)
#   evaluate section 23 with EVALB (COLLINS.prm), gold tags put back (the publication
#            convention): greedy; beam 21 with alpha 0.3 (the paper's settings, input + 300);
#            beam 21 with the chosen alpha; the same with constrained decoding (only well-formed
#            trees; not in the paper)
#
# Environment:
#   RUN         run directory (default runs/wsj)
#   TAGS        1 (default): the target keeps the POS tags (the model tags as it parses: each tag
#               needs its word, which teaches the encoder-decoder attention to align within the
#               hour); 0: XX, as Vinyals et al. and the paper
#   STEPS       updates (default: the preset's, 5500 for parse-cpu)
#   MINUTES     an optional cap on training time (the model is then not the recipe's)
#   PRECISION   auto (default), fp32 or bf16, for training and decoding
#   THREADS     CPU threads (default: all cores)
#   WORKERS     decoding workers: batches decoded at once, the threads divided among them
#               (default: THREADS, one thread each: the parser is small; docs/speed.md)
#   CONSTRAINED 1 (default): alpha chosen on section 22 with constrained decoding; 0: without
#   SAVE_STEPS  a checkpoint every N updates (default 250)
#   AVERAGE     the numbers of last checkpoints to average, chosen among on section 22 ("1 5")
#   ALPHAS      the length penalties tried on section 22 ("0.3 0.6 1.0 1.5")
#   COOLDOWN    train --cooldown (default 0.2; 0 is the paper's schedule)
#   SEED        train --seed (default 1)
#   PRESET      default parse-cpu (parse-wsj is the paper's model, for a GPU)
#   SETS        more config settings for train --set, space-separated
#   BEAM, MAX_LEN_OFFSET  decoding (default 21 and 300, the paper's; smaller only for smoke tests)
#   CURVE=1     also the F1 curve: each checkpoint, greedy, on section 22 ($RUN/curve/)
#   EVAL_ONLY=1 skip prepare and training: evaluate RUN again
#   TRANSDUCE_DATA_DIR  the dataset mirror (../shared/data is found automatically)
#   PYTHON      the interpreter (default: the active virtual environment's, else .venv, else python3)
# An interrupted run continues where its last checkpoint left it when the command is run again.
set -euo pipefail
source "$(dirname "$0")/python.sh"  # PYTHON: the environment's interpreter (.venv by scripts/setup.sh); `transduce` through it
require_transduce
RUN=${RUN:-runs/wsj}
THREADS=${THREADS:-$(nproc)}
PRECISION=${PRECISION:-auto}
COOLDOWN=${COOLDOWN:-0.2}
SAVE_STEPS=${SAVE_STEPS:-250}
AVERAGE=${AVERAGE:-1 5}
ALPHAS=${ALPHAS:-0.3 0.6 1.0 1.5}
PRESET=${PRESET:-parse-cpu}
SEED=${SEED:-1}
read -r -a SETS <<< "${SETS:-}"
OPTIONAL=()
if [ -n "${STEPS:-}" ]; then OPTIONAL+=(--max-steps "$STEPS"); fi
if [ -n "${MINUTES:-}" ]; then OPTIONAL+=(--max-minutes "$MINUTES"); fi
BEAM=${BEAM:-21}
WORKERS=${WORKERS:-$THREADS}
if [ "${CONSTRAINED:-1}" = 1 ]; then CHOOSE=(--constrained); ALPHA_DIR=$RUN/alpha-constrained; else CHOOSE=(); ALPHA_DIR=$RUN/alpha; fi
COMMON=(--precision "$PRECISION" --threads "$THREADS" --workers "$WORKERS" --max-len-offset "${MAX_LEN_OFFSET:-300}" --quiet)
# One decoding precision for every score: `auto` is resolved by the first evaluation's probe (or
# read from an evaluation already in RUN), then kept for every other.
keep_precision() {  # FILE: an evaluation's --json
  if [ "${COMMON[1]}" = auto ] && [ -f "$1" ]; then
    COMMON[1]=$("$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1]))['decoding']['precision'])" "$1")
    echo "decoding in ${COMMON[1]} (--precision auto, as chosen by the measurement of $1; kept for every other)"
  fi
}

if [ "${EVAL_ONLY:-0}" != 1 ]; then
  if [ ! -f "$RUN/data/data.json" ]; then
    if [ "${TAGS:-1}" = 1 ]; then tags=(--keep-tags); else tags=(); fi
    transduce prepare --dataset ptb-wsj ${tags[@]+"${tags[@]}"} --out "$RUN/data"
  fi
  transduce train --data "$RUN/data" --run-dir "$RUN" --preset "$PRESET" \
    ${SETS[@]+"${SETS[@]/#/--set=}"} ${OPTIONAL[@]+"${OPTIONAL[@]}"} --precision "$PRECISION" --threads "$THREADS" \
    --cooldown "$COOLDOWN" --valid-every 500 --save-every-steps "$SAVE_STEPS" \
    --save-every-minutes 0 --keep-last 0 --seed "$SEED"
fi

# The F1 curve against updates: every checkpoint, greedy, on section 22.
if [ "${CURVE:-0}" = 1 ]; then
  mkdir -p "$RUN/curve"
  for ckpt in "$RUN"/checkpoints/step_*; do
    step=$(basename "$ckpt")
    [ -f "$RUN/curve/$step.json" ] || transduce evaluate "$RUN" --checkpoint "$step" --dataset ptb-wsj --split 22 \
      --greedy "${COMMON[@]}" --json "$RUN/curve/$step.json" > /dev/null
    keep_precision "$RUN/curve/$step.json"
    "$PYTHON" - "$RUN/curve/$step.json" "$step" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["scores"]["evalb_gold_tags"]["all"]
print(f"{sys.argv[2]}: section 22, greedy: F1 {s['f1']:.2f}")
PY
  done
fi

# The number of averaged checkpoints and alpha for beam 21 (BEAM), chosen together on section 22, never on 23.
mkdir -p "$ALPHA_DIR"
n=$("$PYTHON" -c "import sys; from transduce.checkpoint.run_dir import list_checkpoints, on_interval
print(sum(on_interval(p) for _, p in list_checkpoints(sys.argv[1])))" "$RUN")  # the checkpoints transduce average counts
n=$(( n > 0 ? n : 1 ))  # none at the interval (a run shorter than its interval): average takes the last one
AVERAGE=$(for k in $AVERAGE; do echo $((k < n ? k : n)); done | sort -nu | tr '\n' ' ')
for k in $AVERAGE; do
  transduce average "$RUN" --average "$k" --out "$RUN/avg_last$k"
  for a in $ALPHAS; do
    [ -f "$ALPHA_DIR/22.avg$k.alpha$a.json" ] || transduce evaluate "$RUN/avg_last$k" --dataset ptb-wsj --split 22 \
      --beam "$BEAM" --length-penalty "gnmt:$a" ${CHOOSE[@]+"${CHOOSE[@]}"} "${COMMON[@]}" --json "$ALPHA_DIR/22.avg$k.alpha$a.json" > /dev/null
    keep_precision "$ALPHA_DIR/22.avg$k.alpha$a.json"
  done
done
read -r K ALPHA < <("$PYTHON" - "$ALPHA_DIR" $AVERAGE <<'PY'
import json, sys
from pathlib import Path
scores = {}
for k in sys.argv[2:]:
    for p in Path(sys.argv[1]).glob(f"22.avg{k}.alpha*.json"):
        r = json.loads(p.read_text())
        scores[int(k), r["decoding"]["alpha"]] = r["scores"]["evalb_gold_tags"]["all"]["f1"]
for (k, a), s in sorted(scores.items()):
    print(f"section 22, average of the last {k}, alpha {a}: F1 {s:.2f}", file=sys.stderr)
# Ties: the fewer checkpoints, then the alpha nearest the paper's 0.3.
k, a = max(scores, key=lambda ka: (scores[ka], -ka[0], -abs(ka[1] - 0.3)))
print(k, a)
PY
)
[ -n "${ALPHA:-}" ] || { echo "wsj.sh: no section 22 scores in $ALPHA_DIR" >&2; exit 1; }
if [ "$K" = 1 ]; then what="the last checkpoint"; else what="the average of the last $K checkpoints"; fi
echo "chosen on section 22: $what, beam $BEAM, alpha $ALPHA"

searches=(greedy "beam$BEAM-alpha0.3")
if [ "$ALPHA" != 0.3 ]; then searches+=("beam$BEAM-alpha$ALPHA"); fi
searches+=("beam$BEAM-alpha$ALPHA-constrained")
for search in "${searches[@]}"; do
  case $search in
    greedy) flags=(--greedy) ;;
    *-constrained) flags=(--beam "$BEAM" --length-penalty "gnmt:$ALPHA" --constrained) ;;
    "beam$BEAM-alpha0.3") flags=(--beam "$BEAM" --length-penalty gnmt:0.3) ;;
    *) flags=(--beam "$BEAM" --length-penalty "gnmt:$ALPHA") ;;
  esac
  [ -f "$RUN/23.avg$K.$search.json" ] || transduce evaluate "$RUN/avg_last$K" --dataset ptb-wsj --split 23 "${flags[@]}" \
    "${COMMON[@]}" --json "$RUN/23.avg$K.$search.json" --out "$RUN/23.avg$K.$search.trees" > /dev/null
done
for search in "${searches[@]}"; do
  echo "== section 23, $search"
  transduce evaluate --hyp "$RUN/23.avg$K.$search.trees" --dataset ptb-wsj --split 23
done
