"""Do the side features pay? A run with side features checks its kept weights' val accuracy
against a logistic regression on phase 1's frozen image features alone, and says so when the
columns cost accuracy.

The side path's direct columns move the logits as fast as all the image features together
(app/models/classifier.py): that is how one informative column is learnt in a few epochs, and on
columns that carry little about the class it moves them as fast at random. On small datasets
that costs accuracy (benchmarks/README.md, "Side features"), so the run warns instead of
leaving the user to find out.
"""

from __future__ import annotations

import numpy as np

from app.training.frozen import Phase1Features

MIN_GAP = 0.03  # the probe ahead by at least 3 points of val accuracy...
MIN_PHOTOS = 3  # ...and by at least 3 val photos: on a small val split one photo is several points
MAX_TRAIN_ROWS = 20_000  # a large set's views are sampled: the probe's memory and seconds stay bounded


def image_only_val_accuracy(features: Phase1Features, num_classes: int, seed: int = 0) -> float:
    """Val accuracy of a logistic regression on phase 1's image features (its views; at most
    MAX_TRAIN_ROWS of them, drawn at random), side features left out."""
    from app.training.backbone_probe import fit_probe

    count = len(features.train_labels)
    rows = np.sort(np.random.default_rng(seed).permutation(count)[:MAX_TRAIN_ROWS])  # rows on disk: read these only
    val = (features.val_features[:], features.val_labels)
    return fit_probe(features.train_features[rows], features.train_labels[rows], {"val": val}, num_classes)["val"][0]


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
