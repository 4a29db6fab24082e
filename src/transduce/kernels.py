"""The old home of the CPU speed-ups, kept for the callers not yet moved: decoding's are in
`transduce.fast.decode`, training's in `transduce.fast.train`."""

from .fast.decode import apply, can_pack, decode_attention, pack_weights, unpack_weights  # noqa: F401
from .fast.train import BitDropout, autocast_attention, fast_attention, fast_dropout, keep_freed_memory  # noqa: F401
