#!/usr/bin/env bash
# transduce's main job: Multi30k En->De (Elliott et al. 2016) on a laptop CPU.
#
#   prepare  shared 8k BPE vocabulary, memory-mapped token arrays (from the mirror or downloaded)
#   train    the paper's architecture at laptop size (preset `small`: N=3, d_model=256, d_ff=1024,
#            h=4), bf16 autocast, MINUTES of wall-clock training. Settings for a 45-minute budget
#            (chosen on the validation split, never on test): P_drop 0.1 (0.3 left the model
#            underfit: training perplexity stayed below validation's), warmup 300 steps with
#            scale 0.4 (equation 3 peaks at 1.4e-3), batches of 4096 tokens; a checkpoint every
#            3 minutes, all kept (the BLEU-vs-minutes curve)
#   average  the last 5 checkpoints (6.1)
#   evaluate test_2016_flickr: sacreBLEU (cased, detokenized), chrF, and the literature's
#            lowercased tokenized BLEU; greedy and beam 4
#
# Environment: RUN (run directory, default runs/multi30k-en-de), MINUTES (default 45),
# THREADS (default: all cores), TRANSDUCE_DATA_DIR (a local dataset mirror; ../shared/data is
# found automatically).
set -euo pipefail
RUN=${RUN:-runs/multi30k-en-de}
MINUTES=${MINUTES:-45}
THREADS=${THREADS:-$(nproc)}

if [ ! -f "$RUN/data/data.json" ]; then
  transduce prepare --dataset multi30k --src en --tgt de --vocab-size 8000 --out "$RUN/data"
fi

transduce train --data "$RUN/data" --run-dir "$RUN" --preset small \
  --set model.dropout=0.1 --precision bf16 --threads "$THREADS" \
  --max-tokens 4096 --max-minutes "$MINUTES" --max-steps 1000000 \
  --warmup 300 --lr-scale 0.4 --valid-every 500 --save-every-minutes 3 --keep-last 0

transduce average "$RUN" --last 5 --out "$RUN/avg_last5"

for search in greedy beam4; do
  if [ "$search" = greedy ]; then flags=(--greedy); else flags=(--beam 4 --alpha 0.6); fi
  transduce evaluate "$RUN/avg_last5" --dataset multi30k --src en --tgt de --split test_2016_flickr \
    "${flags[@]}" --threads "$THREADS" --json "$RUN/test_2016_flickr.$search.json" \
    --save-hyp "$RUN/test_2016_flickr.$search.de"
done
for search in greedy beam4; do
  echo "== test_2016_flickr, $search"
  transduce evaluate --hyp "$RUN/test_2016_flickr.$search.de" --dataset multi30k --src en --tgt de \
    --split test_2016_flickr
done
