"""`python -m transduce SUBCOMMAND ...`, the same as the `transduce` command; also what
torchrun starts: `torchrun --nproc_per_node 8 -m transduce train ...`."""

import sys

from transduce.cli import main

if __name__ == "__main__":
    sys.exit(main())
