#!/usr/bin/env bash
# The pictures and numbers of docs/attention.md and docs/masks.md: `transduce attention` on a
# Multi30k En->De model, with the sentences of the paper's Figures 3-5, and the masks picture.
#
#   MODEL=runs/m30k-e12b6f7 OUT=attention-out bash scripts/attention_figures.sh
#
# MODEL: a run directory (the average of its last checkpoints) or a model directory.
# Writes OUT/paper.{json,html}, the PNGs, OUT/heads.txt (scripts/attention_heads.py's summary)
# and OUT/masks.png.
set -euo pipefail
source "$(dirname "$0")/python.sh"  # PYTHON: the environment's interpreter; `transduce` through it
require_transduce
MODEL=${MODEL:?give MODEL=run-or-model-dir}
OUT=${OUT:-attention-figures}
LAYER=${LAYER:-}   # the layer of the per-layer figures (default: the last)
mkdir -p "$OUT"
FIG3="It is in this spirit that a majority of American governments have passed new laws since 2009 making the registration or voting process more difficult ."
FIG45="The Law will never be perfect , but its application should be just - this is what we are missing , in my opinion ."
layer=${LAYER:+--layer $LAYER}

# Both sentences, the model's own translations (beam 4, alpha 0.6): the page and the JSON.
transduce attention "$MODEL" "$FIG3" "$FIG45" --json "$OUT/paper.json" --html "$OUT/paper.html"
{
  "$PYTHON" scripts/attention_heads.py "$OUT/paper.json" --sentence 1 --link making:difficult --link making:more
  "$PYTHON" scripts/attention_heads.py "$OUT/paper.json" --sentence 2 --link its:Law --link its:application
} > "$OUT/heads.txt"

# Figure 3: encoder self-attention from "making" alone, all heads, every layer.
L=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['n_layers'])" "$OUT/paper.json")
for l in $(seq 1 "$L"); do
  transduce attention "$MODEL" "$FIG3" --png "$OUT/fig3-making-layer$l.png" --layout rows --layer "$l" --query making
  # Figure 4 (bottom): from "its" alone.
  transduce attention "$MODEL" "$FIG45" --png "$OUT/fig4-its-layer$l.png" --layout rows --layer "$l" --query its
done
# Figures 4 (top) and 5: every query of one head, in the last layer (or LAYER).
H=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['n_heads'])" "$OUT/paper.json")
for h in $(seq 1 "$H"); do
  transduce attention "$MODEL" "$FIG45" --png "$OUT/fig5-head$h.png" --layout rows $layer --heads "$h"
done
transduce attention "$MODEL" "$FIG45" --png "$OUT/fig45-heatmap.png" --figure heatmap $layer
transduce attention "$MODEL" "$FIG45" --png "$OUT/fig45-cross-heatmap.png" --figure heatmap --type decoder-cross $layer

# An in-domain sentence (a Multi30k-style caption) with an "its" whose antecedent is "dog".
IN="A brown dog is running through the grass with a ball in its mouth ."
transduce attention "$MODEL" "$IN" --json "$OUT/caption.json" --png "$OUT/caption-cross-heatmap.png" --figure heatmap \
  --type decoder-cross $layer
"$PYTHON" scripts/attention_heads.py "$OUT/caption.json" --link its:dog --link its:ball --link running:dog >> "$OUT/heads.txt"
for l in $(seq 1 "$L"); do
  transduce attention "$MODEL" "$IN" --png "$OUT/caption-its-layer$l.png" --layer "$l" --query its
done

# docs/masks.md: the masks of a small padded batch.
transduce attention "$MODEL" "A dog runs ." "Two young children are playing in the water ." \
  --target-text "Ein Hund rennt ." --target-text "Zwei kleine Kinder spielen im Wasser ." --figure masks --png "$OUT/masks.png"
echo "wrote $OUT" >&2
