"""The learning rate of equation 3 (Section 5.3)."""

from __future__ import annotations


def noam_lr(step: int, d_model: int, warmup_steps: int = 4000, scale: float = 1.0) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)   (equation 3)

    Increases linearly for the first `warmup_steps` steps, then decreases proportionally to the
    inverse square root of the step number. `step` counts from 1 (step 0 is treated as 1).
    `scale` is an optional factor on the whole (1.0 is the paper).
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cooldown_factor(progress: float, fraction: float) -> float:
    """A factor on equation 3 that decays linearly to 0 over the last `fraction` of the run
    (`progress` in [0, 1]: the share of the step budget used). Not in the paper, whose rate only
    decays as step^-0.5: an option (`transduce train --cooldown`, default 0 = off)."""
    if fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / fraction))

