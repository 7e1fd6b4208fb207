"""The export's "none of these" score, fitted after training on the kept weights' pooled features.

Feature statistics come from the training split (its augmented views where the frozen backbone
kept their activations), standardisation and threshold from the validation split, where `accept`
of its photos pass; the mix of the score's two parts is chosen by holding classes out of the
same features (app/models/ood_choice.py). The scores themselves are app/models/ood.py's.
"""

from __future__ import annotations

import logging

from app.evaluation.metrics import softmax
from app.models import ood
from app.models.ood_choice import MixChoice, choose_mix
from app.training.calibration import validation_logits
from app.training.context import Context
from app.training.frozen import FrozenBackbone
from app.training.phase import KeptPhases

log = logging.getLogger(__name__)


def fit_ood_score(
    ctx: Context, phases: KeptPhases, temperature: float, frozen: FrozenBackbone, accept: float = ood.DEFAULT_ACCEPT
) -> tuple[ood.ShippedScore, str, MixChoice]:
    """The shipped score for the kept weights, what it was fitted on, and its mix."""
    phase2 = phases.get(2)
    unchanged = phase2 is None or phase2.best_epoch == 0  # 0: phase 2 kept phase 1's weights
    train_x, train_y, train_from = frozen.pooled_features("train", unchanged)
    val_x, val_y, _ = frozen.pooled_features("val", unchanged)
    logits, _ = validation_logits(ctx, phases)
    choice = choose_mix((train_x, train_y), (val_x, val_y), ctx.cfg.seed)
    probabilities = softmax(logits / temperature)
    score = ood.fit_shipped(train_x, train_y, val_x, probabilities, accept, choice.mix, logits, temperature)
    return score, f"{len(train_x)} {train_from}, {len(val_x)} val photos", choice


def fit_and_record(
    ctx: Context, phases: KeptPhases, calibration: dict | None, frozen: FrozenBackbone
) -> tuple[dict, ood.ShippedScore]:
    """Fits the score, writes its statistics into the run dir and logs it; returns what
    metrics.json records of it, and the score for the export."""
    temperature = (calibration or {}).get("temperature", 1.0)
    score, fitted_on, choice = fit_ood_score(ctx, phases, temperature, frozen, ctx.cfg.unknown_accept)
    ctx.run.write_ood_score(score)
    found = {"method": ood.SHIPPED, "accept": score.accept, "threshold": score.threshold, "fitted_on": fitted_on,
             "mix": choice.to_dict()}  # fmt: skip
    log.info(
        'unknown: %s score (distance share %g) over %.4f answers "none of these" (%.0f%% of val accepted);'
        " fitted on %s; the share: %s",
        found["method"],
        choice.mix,
        found["threshold"],
        100 * found["accept"],
        fitted_on,
        choice.reason,
    )
    return found, score
