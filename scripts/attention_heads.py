"""What each head of a `transduce attention --json` file does, in numbers.

    python scripts/attention_heads.py attention.json [--link making:difficult] [--sentence 1]

For every layer and head of each attention type: the share of query rows whose strongest key is
the previous position, the same position, the next position, the end of sentence (</s>) or the
final "."; the mean of each row's largest weight (1.0: one key only; 1/n: spread evenly). With
`--link A:B` (words of the source, split into pieces or not): for encoder self-attention, the
weight from the first piece of A to all the pieces of B, per layer and head, strongest first,
next to what a head spreading its weight evenly would give. In encoder-decoder attention the two
sides' positions do not correspond: there, previous, same and next mean nothing; read the </s>,
"." and peak columns.
"""

from __future__ import annotations

import argparse
import json


def word_pieces(pieces: list[str], word: str) -> list[int]:
    """Positions of the pieces of the first occurrence of `word` (pieces start a word with ▁)."""
    starts = [i for i, p in enumerate(pieces) if p.startswith(("\u2581", "<"))] + [len(pieces)]
    for a, b in zip(starts, starts[1:]):
        if "".join(pieces[a:b]).lstrip("\u2581") == word:
            return list(range(a, b))
    raise SystemExit(f"{word!r} is not a word of the source: {' '.join(pieces)}")


def summary(w, labels_k) -> dict:
    n, counts, peak = len(w), dict(prev=0, self=0, next=0, eos=0, period=0), 0.0
    for i, row in enumerate(w):
        j = max(range(len(row)), key=row.__getitem__)
        peak += row[j]
        if j == i - 1:
            counts["prev"] += 1
        elif j == i and labels_k[j] != "</s>":
            counts["self"] += 1
        elif j == i + 1:
            counts["next"] += 1
        if labels_k[j] == "</s>":
            counts["eos"] += 1
        if labels_k[j] in (".", "\u00b7."):
            counts["period"] += 1
    return {k: v / n for k, v in counts.items()} | {"peak": peak / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--sentence", type=int, default=1)
    ap.add_argument("--link", action="append", default=[], metavar="A:B")
    ap.add_argument("--top", type=int, default=6)
    args = ap.parse_args()
    with open(args.json, encoding="utf-8") as f:
        data = json.load(f)
    s = data["sentences"][args.sentence - 1]
    print(f"source: {' '.join(s['source'])}\ntarget: {' '.join(s['target'])}  ({s.get('target_from', '')})")
    for kind in data["types"]:
        k = s["target"] if kind == "decoder_self" else s["source"]
        print(f"\n{data['type_names'][kind]}: share of rows whose strongest key is ...; mean largest weight")
        print("layer head   prev  self  next  </s>   '.'   peak")
        for layer, heads in enumerate(s["attention"][kind]):
            for h, w in enumerate(heads):
                r = summary(w, k)
                print(
                    f"{layer + 1:5} {h + 1:4}  "
                    + "  ".join(f"{r[x]:4.2f}" for x in ("prev", "self", "next", "eos", "period", "peak"))
                )
    for link in args.link:
        a, b = link.split(":")
        qa, kb = word_pieces(s["source_pieces"], a)[0], word_pieces(s["source_pieces"], b)
        even = len(kb) / len(s["source"])
        rows = []
        for layer, heads in enumerate(s["attention"]["encoder"]):
            for h, w in enumerate(heads):
                row = w[qa]
                best = max(range(len(row)), key=row.__getitem__)
                rows.append((sum(row[j] for j in kb), layer + 1, h + 1, s["source"][best], row[best]))
        rows.sort(reverse=True)
        print(
            f"\nencoder self-attention from {s['source'][qa]!r} (position {qa + 1}) to {b!r} "
            f"(pieces {', '.join(s['source'][j] for j in kb)}; spread evenly: {even:.3f}):"
        )
        for total, layer, h, best, wb in rows[: args.top]:
            print(f"  layer {layer} head {h}: {total:.3f}   (its strongest key: {best!r} {wb:.3f})")


if __name__ == "__main__":
    main()
