"""Do the side features pay? Judged twice in a run with side features.

The side path's direct columns move the logits as fast as all the image features together
(app/models/classifier.py): that is how one informative column is learnt in a few epochs, and on
columns that carry little about the class it moves them as fast at random, which costs a small
dataset accuracy (benchmarks/README.md, "Side features"). So before phase 1's first step,
`SidePath` compares logistic regressions on phase 1's cached image features without and with
the encoded side features, and leaves the side features out where they do not pay. After
training, a run that kept them compares its kept weights with the image-only regression and
warns where they cost val accuracy all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from app.models.layers import SideFeatureEncoding
from app.training.context import Context
from app.training.frozen import Phase1Features
from app.training.phase import PhaseInputs

log = logging.getLogger(__name__)

MIN_GAP = 0.03  # the probe ahead by at least 3 points of val accuracy...
MIN_PHOTOS = 3  # ...and by at least 3 val photos: on a small val split one photo is several points
MAX_TRAIN_ROWS = 20_000  # a large set's views are sampled: the probe's memory and seconds stay bounded
MIN_LOG_LOSS_GAIN = 0.02  # the side features stay where they lower the probe's val log loss by 2%


def val_probe(features: Phase1Features, num_classes: int, encode: Callable | None = None) -> tuple[float, float]:
    """(val accuracy, val log loss) of a logistic regression on phase 1's image features (its views;
    at most MAX_TRAIN_ROWS of them, drawn at random), with the side features beside them where
    `encode` (raw side rows → the side branch's encoding) is given."""
    from app.training.backbone_probe import fit_probe

    count = len(features.train_labels)
    rows = np.sort(np.random.default_rng(0).permutation(count)[:MAX_TRAIN_ROWS])  # rows on disk: read these only
    train_x, val_x = features.train_features[rows], features.val_features[:]
    if encode is not None:
        train_x = np.hstack([train_x, encode(features.train_side[rows])])
        val_x = np.hstack([val_x, encode(features.val_side)])
    return tuple(
        fit_probe(train_x, features.train_labels[rows], {"val": (val_x, features.val_labels)}, num_classes)["val"]
    )


def side_features_warning(with_side: float, image_only: float, val_photos: int) -> str | None:
    """What to say when the image features alone did better on val than the kept weights with the side features."""
    gap = image_only - with_side
    if gap < MIN_GAP or round(gap * val_photos) < MIN_PHOTOS:  # both accuracies are counts of val photos
        return None
    return (
        f"the side features cost val accuracy: {with_side:.4f} with them, {image_only:.4f} for a logistic regression"
        " on phase 1's image features alone; columns that say little about the class cost accuracy on small"
        " datasets (docs/side-features.md): compare a run converted without --feature-columns"
    )


class SidePath:
    """Whether a run's side features reach its head, judged once on phase 1's cached features
    before its first step: logistic regressions on the image features without and with the
    encoded side features. Where the side features do not lower the val log loss by
    MIN_LOG_LOSS_GAIN, the encoding's gate closes: the head sees zeros in their place, and the
    weights files carry that to phase 2, a resume and the export."""

    def __init__(self, encoding: SideFeatureEncoding, num_classes: int) -> None:
        self.encoding, self.num_classes = encoding, num_classes
        self.probes: dict[str, tuple] | None = None  # {"image_only", "with_side"}: (val accuracy, val log loss)

    @classmethod
    def of_run(cls, ctx: Context) -> SidePath | None:
        """The run's side path where it is judged: side features, a single-label head, `side_path = auto`."""
        if not ctx.info.side_features or ctx.info.multi_label:
            return None
        encoding = ctx.clf.head_model.get_layer("side_encoding")
        if ctx.cfg.side_path == "on":
            encoding.gate.assign(1.0)  # whatever an --init-from run decided
            return None
        return cls(encoding, len(ctx.info.classes))

    def judging(self, features: Callable[[], Phase1Features], inputs: PhaseInputs) -> PhaseInputs:
        """`inputs` whose training iterator judges the side path on `features()` once gathered."""

        def train_iterator():
            iterator = inputs.train_iterator()  # gathers the features
            self.judge(features())
            return iterator

        return PhaseInputs(train_iterator=train_iterator, val_dataset=inputs.val_dataset)

    def judge(self, features: Phase1Features) -> None:
        """Open or close the gate from the probes on `features`, and log which."""
        fresh = SideFeatureEncoding(self.encoding.columns, dtype="float32")  # its gate open, whatever a resume restored
        encode = lambda rows: np.asarray(fresh(rows))  # noqa: E731
        self.probes = {"image_only": val_probe(features, self.num_classes),
                       "with_side": val_probe(features, self.num_classes, encode)}  # fmt: skip
        without, with_side = self.probes["image_only"][1], self.probes["with_side"][1]
        self.encoding.gate.assign(1.0 if with_side <= without * (1 - MIN_LOG_LOSS_GAIN) else 0.0)
        log.info("side features %s (logistic regressions on phase 1's features, val log loss: %.4f without them, %.4f"
                 " with them)", "kept" if self.open else "left out", without, with_side)  # fmt: skip

    @property
    def open(self) -> bool:
        """The gate as the weights hold it: judged in this process, or restored by a resume past phase 1."""
        return float(self.encoding.gate.numpy()) > 0.0  # .numpy(): a distributed variable has no float()

    def left_out(self) -> str:
        """What to say of side features the run left out."""
        why = "judged before phase 1 of this run, which resumed past it"
        if self.probes:
            (acc_without, without), (acc_with, with_side) = self.probes["image_only"], self.probes["with_side"]
            why = (f"a logistic regression on phase 1's image features reached val log loss {without:.4f} (accuracy"
                   f" {acc_without:.4f}) without them and {with_side:.4f} ({acc_with:.4f}) with them, not"
                   f" {MIN_LOG_LOSS_GAIN:.0%} lower")  # fmt: skip
        return (
            "the side features were left out of the model (it still takes them and ignores them; predict and"
            f" evaluate take photos alone): {why}; side_path = on keeps them (docs/side-features.md)"
        )

    def record(self) -> dict:
        """metrics.json's `side_path`: open or not, and the probes where this process judged them."""
        names = ("val_accuracy", "val_log_loss")
        return {"open": self.open, **{k: dict(zip(names, v, strict=True)) for k, v in (self.probes or {}).items()}}
