"""What an experiment runs: the rows of Table 3 as variants (each a preset of
`transduce.config.PRESETS`, made smaller by the scale), the recipe they share, and each variant's
`transduce train` command (`train_command`), which the run done here (`train_setup`) equals."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..config import PRESETS, Config, apply_overrides, get_preset
from ..defaults import TABLE3  # Table 3's rows, top to bottom: the default list of variants
from ..errors import UsageError
from ..train.setup import config_for_data
from ..train.trainer import TrainOptions

MIN_DEPTH_SCALE = 0.5
"""The default depth scale's floor: at 0.5 Table 3's N = 2, 4, 6, 8 (C1, C2, base, C3) become 1, 2,
3, 4; at the width scale 0.25 they would become 1, 1, 2, 2, two pairs of identical rows."""

PAPER_STEPS = PRESETS["base"].train.max_steps  # Table 3's "train steps" of every row but big: 100K (big: 300K, 5.2)


def preset_of(name: str) -> str:
    """The preset of a variant name (`base`, `A1` or `table3-A1`, any preset); a UsageError if none."""
    for candidate in (name, f"table3-{name}"):
        if candidate in PRESETS:
            return candidate
    raise UsageError(
        f"unknown variant {name!r}: Table 3's rows are {', '.join(TABLE3)} (or a preset: transduce info --all)"
    )


@dataclass
class Recipe:
    """What every variant shares: the regime, in updates (never minutes: every machine trains the
    same models, only the time differs), and the scale. Defaults are the paper's (5.1-5.3)."""

    updates: int  # Optimizer steps of the base row (the paper: 100K); big trains 3x as long, as in 5.2
    max_tokens: int = 25000  # Source and target tokens per update, each side (5.1: ~25000)
    warmup: int = 4000  # warmup_steps of equation 3 (5.3)
    lr_scale: float = 1.0  # A factor on equation 3 (1.0 is the paper)
    cooldown: float = 0.0  # Not in the paper: the rate decays linearly to 0 over this last fraction of the steps
    save_every: int = 0  # Updates between checkpoints; 0: updates // 72 (6.1: every 10 minutes of a 12-hour run)
    seed: int = 1
    scale: float = 1.0  # Widths (d_model, d_ff, d_k, d_v) times this; 1.0 is the paper's scale
    depth_scale: float | None = None  # N times this (rounded half up, >= 1); None: `scale`, >= MIN_DEPTH_SCALE

    def __post_init__(self) -> None:
        if self.updates < 1 or self.max_tokens < 1 or self.warmup < 1 or self.save_every < 0:
            raise UsageError("need --max-steps, --update-tokens and --warmup of at least 1, --save-every-steps >= 0")
        if not 0 < self.scale <= 1 or not 0 <= self.cooldown < 1 or self.lr_scale <= 0:
            raise UsageError("need 0 < --scale <= 1, 0 <= --cooldown < 1 and --lr-scale > 0")
        self.depth_scale = max(self.scale, MIN_DEPTH_SCALE) if self.depth_scale is None else self.depth_scale
        if not 0 < self.depth_scale <= 1:
            raise UsageError("need 0 < --depth-scale <= 1")
        self.save_every = self.save_every or max(1, self.updates // 72)

    @property
    def reduced(self) -> bool:
        return self.scale != 1 or self.depth_scale != 1

    def scale_note(self) -> str:
        """One line saying the scale: whether these are the paper's sizes."""
        if not self.reduced:
            return "the paper's scale (Table 3's sizes)"
        return (
            f"REDUCED SCALE, not the paper's: every width (d_model, d_ff, d_k, d_v) x {self.scale:g} and every "
            f"depth (N) x {self.depth_scale:g}, rounded; heads, dropout and label smoothing as in Table 3"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Machine:
    """Where and how the runs train (not part of the recipe: a run may continue elsewhere)."""

    device: str = "auto"
    precision: str = "auto"
    threads: int | None = None
    update_freq: int = 1
    nproc: int = 1  # Processes per run (torchrun --nproc_per_node; for --dry-run and Slurm)
    progress: bool = True


@dataclass
class Variant:
    """One row: a preset, made smaller by `sets` (flags `--set`), trained for `max_steps`."""

    name: str
    preset: str
    max_steps: int
    sets: list[str] = field(default_factory=list)

    def run_dir(self, out: Path) -> Path:
        return Path(out) / "runs" / self.name


def scaled_sets(preset: str, scale: float, depth_scale: float) -> list[str]:
    """`--set` overrides that make `preset` smaller: d_model (rounded to an even number), d_ff, d_k
    and d_v times `scale`, N times `depth_scale` (rounded half up, at least 1); the rest, and the
    ratios between Table 3's rows, unchanged."""
    if scale == 1 and depth_scale == 1:
        return []
    m = PRESETS[preset].model

    def width(x: int) -> int:
        return max(1, int(x * scale + 0.5))

    return [
        f"model.n_layers={max(1, int(m.n_layers * depth_scale + 0.5))}",
        f"model.d_model={max(2, 2 * int(m.d_model * scale / 2 + 0.5))}",
        f"model.d_ff={width(m.d_ff)}",
        f"model.d_k={width(m.head_dim_k)}",
        f"model.d_v={width(m.head_dim_v)}",
    ]


def plan(names: list[str], recipe: Recipe) -> list[Variant]:
    """The variants `names` (Table 3's rows by default), in order, each once."""
    variants: list[Variant] = []
    for name in dict.fromkeys(names or TABLE3):
        preset = preset_of(name)
        steps = max(1, recipe.updates * PRESETS[preset].train.max_steps // PAPER_STEPS)
        sets = scaled_sets(preset, recipe.scale, recipe.depth_scale)
        variants.append(Variant(preset.removeprefix("table3-"), preset, steps, sets))  # table3-A1 -> A1
    _refuse_twins(variants, recipe)
    return variants


def _refuse_twins(variants: list[Variant], recipe: Recipe) -> None:
    """A one-line UsageError where the scale makes two rows the same training (the same model and
    regime), e.g. C3's N=8 and base's N=6 both N=2 at --depth-scale 0.25."""
    seen: dict[str, Variant] = {}
    for v in variants:
        config = apply_overrides(get_preset(v.preset), v.sets).to_dict()
        config["model"].pop("name", None)
        key = repr((sorted(config["model"].items()), sorted(config["train"].items(), key=str), v.max_steps))
        if key in seen:
            twin = seen[key]
            m = config["model"]
            raise UsageError(
                f"variants {twin.name} and {v.name} become the same model at --scale {recipe.scale:g} --depth-scale "
                f"{recipe.depth_scale:g} (N={m['n_layers']}, d_model {m['d_model']}, d_ff {m['d_ff']}): "
                f"a larger --depth-scale or --scale keeps them apart ({MIN_DEPTH_SCALE:g} keeps Table 3's depths apart)"
            )
        seen[key] = v


# --- the run of a variant: a `transduce train` command, and the same run in this process ----------


def keep_last(variant: Variant) -> int:
    """Checkpoints kept at the interval: the ones averaged (6.1: 5, big 20)."""
    return PRESETS[variant.preset].train.average_last


def valid_every(variant: Variant) -> int:
    """Validation loss ten times a run (a curve in logs/train.jsonl)."""
    return max(1, variant.max_steps // 10)


def train_command(variant: Variant, recipe: Recipe, data_dir: Path, out: Path, machine: Machine) -> list[str]:
    """The `transduce train` command line of a variant (a torchrun line for several processes)."""
    head = ["transduce"] if machine.nproc == 1 else ["torchrun", f"--nproc_per_node={machine.nproc}", "-m", "transduce"]
    cmd = head + ["train", "--data", str(data_dir), "--run-dir", str(variant.run_dir(out)), "--preset", variant.preset]
    for s in variant.sets + [f"train.max_tokens={recipe.max_tokens}"]:
        cmd += ["--set", s]
    cmd += [
        "--max-steps",
        str(variant.max_steps),
        "--warmup",
        str(recipe.warmup),
        "--lr-scale",
        f"{recipe.lr_scale:g}",
        "--cooldown",
        f"{recipe.cooldown:g}",
        "--seed",
        str(recipe.seed),
        "--save-every-steps",
        str(recipe.save_every),
        "--save-every-minutes",
        "0",
        "--keep-last",
        str(keep_last(variant)),
        "--valid-every",
        str(valid_every(variant)),
        "--device",
        machine.device,
        "--precision",
        machine.precision,
    ]
    if machine.update_freq != 1:
        cmd += ["--update-freq", str(machine.update_freq)]
    if machine.threads:
        cmd += ["--threads", str(machine.threads)]
    return cmd


def train_setup(variant: Variant, recipe: Recipe, meta: dict, machine: Machine) -> tuple[Config, TrainOptions]:
    """The Config and TrainOptions that `train_command` gives `transduce train`, for a run here."""
    config = config_for_data(variant.preset, variant.sets + [f"train.max_tokens={recipe.max_tokens}"], meta)
    t = config.train
    t.max_steps, t.warmup_steps, t.lr_scale, t.checkpoint_minutes = (
        variant.max_steps,
        recipe.warmup,
        recipe.lr_scale,
        0.0,
    )
    options = TrainOptions(
        update_freq=machine.update_freq,
        cooldown=recipe.cooldown,
        precision=machine.precision,
        seed=recipe.seed,
        valid_every=valid_every(variant),
        save_every_steps=recipe.save_every,
        keep_last=keep_last(variant),
        resume=True,
        threads=machine.threads,
        device=machine.device,
        progress=machine.progress,
    )
    return config, options
