"""The learning rate of equation 3 (Section 5.3), and the one option on it."""

from __future__ import annotations


def learning_rate(
    step: int, d_model: int, warmup_steps: int = 4000, scale: float = 1.0, *, cooldown: float = 0.0, max_steps: int = 1
) -> float:
    """The rate of optimizer step `step` (counted from 1; step 0 is treated as 1):

        lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)   (equation 3)

    which increases linearly for the first `warmup_steps` steps, then decreases proportionally to
    the inverse square root of the step number; `scale` is a factor on the whole (1.0 is the
    paper). `cooldown` (not in the paper, whose rate only decays as step^-0.5: `transduce train
    --cooldown`, default 0 = off) decays it linearly to 0 over the last `cooldown` fraction of
    `max_steps` steps."""
    step = max(step, 1)
    rate = scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
    if cooldown <= 0:
        return rate
    return rate * min(1.0, max(0.0, (1.0 - (step - 1) / max(max_steps, 1)) / cooldown))
