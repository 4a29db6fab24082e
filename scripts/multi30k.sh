#!/usr/bin/env bash
# transduce's main job: Multi30k En->De (Elliott et al. 2016) on a laptop CPU.
#
# The recipe is defined by updates, not minutes, so that every machine trains the same model
# and only the time differs:
#   prepare  shared 8k BPE vocabulary, memory-mapped token arrays (from the mirror or downloaded)
#   train    preset `multi30k`: the paper's architecture at laptop size (N=3, d_model=256,
#            d_ff=1024, h=4, P_drop 0.1), batches of 2048 tokens, equation 3 with warmup 600 and
#            scale 0.4 (peak 1.0e-3), 5,200 updates, the rate decaying linearly to 0 over the last
#            20% (COOLDOWN 0.2: not the paper's schedule; chosen on validation); the precision
#            chosen from the hardware (--precision auto: bf16 where the CPU computes it natively
#            and faster, else fp32; the choice and its reason are printed); a checkpoint every
#            SAVE_STEPS (325) updates
#   average  the last K checkpoints (6.1), for each K in AVERAGE (default "5")
#   choose   K and the length penalty alpha for beam 4, jointly on the validation split (6.1:
#            "chosen after experimentation on the development set"); alpha among 0.6 (the
#            paper's WMT value) ... 1.5
#   evaluate test_2016_flickr: sacreBLEU (cased, detokenized), chrF, the paper's tokenized BLEU
#            and the literature's lowercased tokenized BLEU; greedy, beam 4 with alpha 0.6, and
#            beam 4 with the validation-chosen alpha
#
# Environment:
#   RUN         run directory (default runs/multi30k-en-de)
#   STEPS       updates (default: the preset's, 5200 for multi30k)
#   MINUTES     an optional cap on training time; when it binds before STEPS the trainer says so
#               and the model is not the recipe's (continue it with the same command: it resumes)
#   PRECISION   auto (default), fp32 or bf16, for training and decoding
#   THREADS     CPU threads (default: all cores)
#   SAVE_STEPS  a checkpoint every N updates (default 325)
#   AVERAGE     the numbers of last checkpoints to average, chosen among on validation ("5")
#   COOLDOWN    train --cooldown: the last fraction of STEPS over which the rate decays linearly
#               to 0 (default 0.2; 0 is the paper's schedule)
#   SEED        train --seed (default 1)
#   PRESET      default multi30k (`tiny` is the literature's Transformer-Tiny); DROPOUT, WARMUP, LR_SCALE override the preset's values
#   BATCH_TOKENS  train --batch-tokens: padded tokens per micro-batch (default: the preset's)
#   SETS        more config settings for train --set, space-separated, e.g. "model.n_layers=3"
#   VARIANT     raw (default: cased, untokenized text, scored by sacreBLEU) or tok (the literature's
#               lowercased, Moses-tokenized text, scored and chosen by lowercased tokenized BLEU)
#   VOCAB       the shared SentencePiece vocabulary size (default 8000)
#   EVAL_ONLY=1 skip prepare and training: evaluate RUN again
#   TRANSDUCE_DATA_DIR  a local dataset mirror (../shared/data is found automatically)
#   PYTHON      the interpreter (default: the active virtual environment's, else .venv, else python3)
# An interrupted run continues where its last checkpoint left it when the command is run again (the same
# settings: another training config is refused, naming what differs).
set -euo pipefail
source "$(dirname "$0")/python.sh"  # PYTHON: the environment's interpreter (.venv by scripts/setup.sh); `transduce` through it
require_transduce
RUN=${RUN:-runs/multi30k-en-de}
THREADS=${THREADS:-$(nproc)}
PRECISION=${PRECISION:-auto}
COOLDOWN=${COOLDOWN:-0.2}
SAVE_STEPS=${SAVE_STEPS:-325}
AVERAGE=${AVERAGE:-5}
PRESET=${PRESET:-multi30k}
SEED=${SEED:-1}
VARIANT=${VARIANT:-raw}
read -r -a SETS <<< "${SETS:-}"
if [ -n "${DROPOUT:-}" ]; then SETS+=("model.dropout=$DROPOUT"); fi
OPTIONAL=()
if [ -n "${STEPS:-}" ]; then OPTIONAL+=(--max-steps "$STEPS"); fi
if [ -n "${MINUTES:-}" ]; then OPTIONAL+=(--max-minutes "$MINUTES"); fi
if [ -n "${WARMUP:-}" ]; then OPTIONAL+=(--warmup "$WARMUP"); fi
if [ -n "${LR_SCALE:-}" ]; then OPTIONAL+=(--lr-scale "$LR_SCALE"); fi
BATCH_TOKENS=${BATCH_TOKENS:-}
if [ -n "$BATCH_TOKENS" ]; then OPTIONAL+=(--batch-tokens "$BATCH_TOKENS"); fi

if [ "${EVAL_ONLY:-0}" != 1 ]; then
  if [ ! -f "$RUN/data/data.json" ]; then
    transduce prepare --dataset multi30k --src en --tgt de --vocab-size "${VOCAB:-8000}" --variant "$VARIANT" --out "$RUN/data"
  fi
  transduce train --data "$RUN/data" --run-dir "$RUN" --preset "$PRESET" \
    ${SETS[@]+"${SETS[@]/#/--set=}"} ${OPTIONAL[@]+"${OPTIONAL[@]}"} --precision "$PRECISION" --threads "$THREADS" \
    --cooldown "$COOLDOWN" --valid-every 500 --save-every-steps "$SAVE_STEPS" \
    --save-every-minutes 0 --keep-last 0 --seed "$SEED"
fi


# The number of averaged checkpoints and the length penalty for beam 4, chosen together on the
# validation split (sacreBLEU), never on test.
# A short run (STEPS=500) has fewer checkpoints than K: it averages all it has.
mkdir -p "$RUN/alpha"
n=$("$PYTHON" -c "import sys; from transduce.checkpoint.run_dir import list_checkpoints, on_interval
print(sum(on_interval(p) for _, p in list_checkpoints(sys.argv[1])))" "$RUN")  # the checkpoints transduce average counts
n=$(( n > 0 ? n : 1 ))  # none at the interval (a run shorter than SAVE_STEPS): average takes the last one
AVERAGE=$(for k in $AVERAGE; do echo $((k < n ? k : n)); done | sort -nu | tr '\n' ' ')
# One decoding precision for every score: `auto` is resolved by the first evaluation's probe, then kept.
DECODING=$PRECISION
for k in $AVERAGE; do
  transduce average "$RUN" --average "$k" --out "$RUN/avg_last$k"
  for a in 0.6 0.8 1.0 1.2 1.5; do
    transduce evaluate "$RUN/avg_last$k" --dataset multi30k --src en --tgt de --split val --variant "$VARIANT" --beam 4 \
      --length-penalty "gnmt:$a" --precision "$DECODING" --threads "$THREADS" --quiet --json "$RUN/alpha/val.avg$k.alpha$a.json" > /dev/null
    if [ "$DECODING" = auto ]; then
      DECODING=$("$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1]))['decoding']['precision'])" \
        "$RUN/alpha/val.avg$k.alpha$a.json")
      echo "decoding in $DECODING (--precision auto, chosen by the first evaluation's measurement; kept for every other)"
    fi
  done
done
read -r K ALPHA < <("$PYTHON" - "$RUN/alpha" "$VARIANT" $AVERAGE <<'PY'
import json, sys
from pathlib import Path
scores = {}
metric = "multi30k_lc_tok_bleu" if sys.argv[2] == "tok" else "sacrebleu"
for k in sys.argv[3:]:
    for p in Path(sys.argv[1]).glob(f"val.avg{k}.alpha*.json"):
        r = json.loads(p.read_text())
        scores[int(k), r["decoding"]["alpha"]] = r["scores"][metric]["score"]
for (k, a), s in sorted(scores.items()):
    print(f"validation, average of the last {k}, beam 4, alpha {a}: {metric} {s:.2f}", file=sys.stderr)
# Ties: the fewer checkpoints, then the alpha nearest the paper's 0.6.
k, a = max(scores, key=lambda ka: (scores[ka], -ka[0], -abs(ka[1] - 0.6)))
print(k, a)
PY
)
[ -n "${ALPHA:-}" ] || { echo "multi30k.sh: no validation scores in $RUN/alpha" >&2; exit 1; }
if [ "$K" = 1 ]; then what="the last checkpoint"; else what="the average of the last $K checkpoints"; fi
echo "chosen on the validation split: $what, alpha $ALPHA (translate with --length-penalty gnmt:$ALPHA)"

searches=(greedy beam4 "beam4-alpha$ALPHA")
for search in "${searches[@]}"; do
  case $search in
    greedy) flags=(--greedy) ;;
    beam4) flags=(--beam 4 --length-penalty gnmt:0.6) ;;
    *) flags=(--beam 4 --length-penalty "gnmt:$ALPHA") ;;
  esac
  transduce evaluate "$RUN/avg_last$K" --dataset multi30k --src en --tgt de --split test_2016_flickr --variant "$VARIANT" \
    "${flags[@]}" --precision "$DECODING" --threads "$THREADS" --quiet --json "$RUN/test_2016_flickr.$search.json" \
    --out "$RUN/test_2016_flickr.$search.de" > /dev/null
done
for search in "${searches[@]}"; do
  echo "== test_2016_flickr, $search"
  transduce evaluate --hyp "$RUN/test_2016_flickr.$search.de" --dataset multi30k --src en --tgt de \
    --split test_2016_flickr --variant "$VARIANT"
done
