"""transduce's benchmarks: tools a user or maintainer runs, each a script with its own `--help`,
run from the repository's root as modules of this package (`python -m benchmarks.bench ...`), which
import each other as `benchmarks.NAME`:

bench (training and decoding speed against peers), decode_speed (beam search against Hugging Face
and CTranslate2), gpu (the CUDA path), table1 and table1_report (Table 1), serve_load (serving
under load, and its memory soak), prepare_memory (data preparation's memory), int8_error (what
int8 costs in accuracy), precision_table (the measurements behind `--precision auto`), engines
(transduce and CTranslate2 on Multi30k) and machine (what a figure's machine line says). Figures
and commands: docs/RESULTS.md; methods: docs/speed.md.
"""
