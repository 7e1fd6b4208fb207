"""Learning-rate finder: a short exponential sweep on the real data and model (Smith 2015; fastai's
`lr_find`), for phase 1 (the head) and phase 2 (the unfrozen top, after phase 1 has trained).

Each step trains one batch at a learning rate `ratio` times the previous one, from `lr_min` to
`lr_max`, and records the training loss; the sweep stops early once the smoothed loss exceeds
`diverge` × its minimum. The suggestion is fastai's "valley" rule (its default since v2.5): the
longest stretch of the curve over which the smoothed loss keeps falling, and the rate about
halfway along it; how close it lands to a grid's best, against fastai v1's "the minimum / 10",
is measured in docs/training.md ("Learning rates"). The weights are restored after each sweep,
so a sweep never changes the model it measured.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import keras
import numpy as np

from app import storage
from app.models.classifier import freeze_backbone, unfreeze_top
from app.training.builders import make_optimizer, make_steps
from app.training.context import Context
from app.training.frozen import FrozenBackbone
from app.training.inputs import image_inputs

log = logging.getLogger(__name__)
RULE = "fastai's valley: halfway along the longest stretch where the smoothed loss keeps falling"
FLAT_START_SHARE = 20  # a minimum within the sweep's first 1/20 of steps: nothing in the sweep lowered the loss


@dataclass
class Sweep:
    phase: int
    learning_rates: list[float]
    losses: list[float]  # training loss of each step's batch
    smoothed: list[float]  # bias-corrected exponential moving average (beta 0.98), as fastai plots
    suggestion: float
    rule: str = RULE

    def summary(self) -> str:
        finite = np.asarray(self.smoothed, dtype=float)
        lowest = int(np.argmin(np.where(np.isfinite(finite), finite, np.inf)))  # a diverged last step is NaN
        low = self.learning_rates[lowest]
        said = (
            f"phase {self.phase}: suggested learning rate {self.suggestion:.2g} ({self.rule}; minimum at {low:.2g},"
            f" {len(self.losses)} steps from {self.learning_rates[0]:.1g} to {self.learning_rates[-1]:.2g})"
        )
        if lowest < max(1, len(self.smoothed) // FLAT_START_SHARE):  # the valley is then a stretch of noise
            said += "; WEAK: the loss was lowest at the sweep's start, so no rate in it lowered the loss"
        return said


def smooth(losses: list[float], beta: float = 0.98) -> list[float]:
    average, out = 0.0, []
    for i, loss in enumerate(losses, start=1):
        average = beta * average + (1 - beta) * loss
        out.append(average / (1 - beta**i))
    return out


def suggest(learning_rates: list[float], smoothed: list[float]) -> float:
    """The valley rule: the longest decreasing subsequence of the smoothed loss (O(n²), n ≤ a few
    hundred steps); the rate at its start plus half its length."""
    n = len(smoothed)
    longest = [1] * n  # longest[i]: the longest decreasing subsequence ending at step i
    end = 0
    for i in range(1, n):
        for j in range(i):
            if smoothed[i] < smoothed[j] and longest[i] < longest[j] + 1:
                longest[i] = longest[j] + 1
        if longest[i] > longest[end]:
            end = i
    start = end - longest[end] + 1
    third = (end - start) / 3
    return float(learning_rates[start + int(third) + int(third / 2)])


def sweep(
    ctx: Context,
    phase: int,
    model: keras.Model,
    inputs,
    *,
    lr_min: float = 1e-7,
    lr_max: float = 1.0,
    steps: int = 100,
    diverge: float = 4.0,
) -> Sweep:
    """Train `steps` batches at exponentially rising rates; the weights are put back afterwards."""
    ratio = (lr_max / lr_min) ** (1 / max(1, steps - 1))
    schedule = keras.optimizers.schedules.ExponentialDecay(lr_min, decay_steps=1, decay_rate=ratio)
    saved = [w.copy() for w in model.get_weights()]
    train = make_steps(ctx, model, make_optimizer(ctx, schedule, model, phase), phase)  # phase 2's own per-block rates
    iterator, rates, losses = inputs.train_iterator(), [], []
    try:
        for step in range(steps):
            totals = train.train(iterator, 1).numpy()
            rates.append(lr_min * ratio**step)
            losses.append(float(totals[0] / max(totals[2], 1)))
            smoothed = smooth(losses)
            if not np.isfinite(losses[-1]) or (step > 10 and smoothed[-1] > diverge * min(smoothed)):
                break
    finally:
        model.set_weights(saved)
    finite = [(r, s) for r, s in zip(rates, smooth(losses)) if np.isfinite(s)]
    rates_ok, smoothed_ok = [r for r, _ in finite], [s for _, s in finite]
    return Sweep(phase, rates, losses, smooth(losses), suggest(rates_ok, smoothed_ok))


def head_sweep(ctx: Context, **options) -> Sweep:
    freeze_backbone(ctx.clf)
    frozen = FrozenBackbone.phase1_only(ctx)
    cached = frozen.decision.phase1_cached
    model = ctx.clf.head_model if cached else ctx.clf.logits_model
    return sweep(ctx, 1, model, frozen.phase1_inputs() if cached else image_inputs(ctx, 1), **options)


def finetune_sweep(ctx: Context, **options) -> Sweep:
    """Call with phase 1 trained: the top of the backbone is swept under the trained head."""
    unfreeze_top(ctx.clf, ctx.cfg.unfreeze)
    return sweep(ctx, 2, ctx.clf.logits_model, image_inputs(ctx, 2), **options)


def plot_sweeps(sweeps: list[Sweep], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4), squeeze=False)
    for ax, s in zip(axes[0], sweeps):
        ax.plot(s.learning_rates, s.losses, color="0.75", lw=1, label="loss per step")
        ax.plot(s.learning_rates, s.smoothed, color="C0", lw=2, label="smoothed")
        ax.axvline(s.suggestion, color="C3", ls="--", label=f"suggested {s.suggestion:.2g}")
        ax.set(xscale="log", xlabel="learning rate", ylabel="training loss", title=f"phase {s.phase}")
        top = min(max(s.smoothed[: max(1, len(s.smoothed) - 1)]) * 1.2, 4 * min(s.smoothed))
        ax.set_ylim(min(s.losses) * 0.9, top)
        ax.legend()
    fig.tight_layout()
    with storage.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    return path


def write_sweeps(sweeps: list[Sweep], folder: Path) -> tuple[Path, Path]:
    png = plot_sweeps(sweeps, folder / "lr_find.png")
    data = folder / "lr_find.json"
    storage.write_json_atomic(data, {f"phase{s.phase}": asdict(s) for s in sweeps})
    return png, data


def read_suggestions(folder: Path) -> dict[str, float]:
    return {f"phase{s.phase}": s.suggestion for s in _read_sweeps(folder)}


def report_dir(cfg_out: str) -> Path:
    """Beside the run dir (not inside it: the run dir belongs to fine_tune.py's resume checks)."""
    out = Path(cfg_out)
    return out.parent / f"{out.name}-lr-find"


def _read_sweeps(folder: Path) -> list[Sweep]:
    path = Path(folder) / "lr_find.json"
    return [Sweep(**v) for v in storage.read_json_object(path).values()] if path.exists() else []


def resolve_rate(ctx: Context, phase: int) -> float:
    """For `lr_head = auto` / `lr_finetune = auto`: sweep now (or reuse this run's earlier sweep,
    on resume), log the suggestion and its rule, write lr_find.{png,json} into the run dir, and
    return the suggested rate; config.json keeps "auto". A configured rate is returned as it is."""
    key = "lr_head" if phase == 1 else "lr_finetune"
    if getattr(ctx.cfg, key) != "auto":
        return getattr(ctx.cfg, key)
    known = read_suggestions(ctx.run.root).get(f"phase{phase}")
    if known is None:
        found = head_sweep(ctx) if phase == 1 else finetune_sweep(ctx)
        earlier = _read_sweeps(ctx.run.root)
        if ctx.chief:
            write_sweeps([s for s in earlier if s.phase != phase] + [found], ctx.run.root)
        known = found.suggestion
        log.info("%s=auto: %s", key, found.summary())
    else:
        log.info("%s=auto: %.2g, from this run's earlier sweep (lr_find.json)", key, known)
    return known
