"""What the frozen backbone produces, behind one door: `FrozenBackbone(ctx)`.

A run decides once (decide.py) whether phase 1 trains on cached features, where phase 2's cut
is, what is kept there and whether those rows are held in memory or on disk (rows.py); the door
then hands out phase 1's inputs, phase 2's inputs, the test split's activations and the pooled
features of a split. Inside: the pass over the photos that gathers features and activations
together (gather.py), the store that keeps them across runs by photo content (store.py), the
passes every frozen forward pass shares (passes.py), and phase 2's layers below its cut on fresh
images (below.py).

Code outside imports this package, never its modules (an import-linter contract in
pyproject.toml).
"""

from app.training.frozen.backbone import FrozenBackbone
from app.training.frozen.decide import ROWS_IN_MEMORY, Decision, cache_limit, phase1_bytes, phase1_mode
from app.training.frozen.passes import eval_images, model_outputs, split_features, splits_features
from app.training.frozen.rows import ActivationRows, DiskRows, Phase1Features, RowSink
from app.training.frozen.store import FeatureStore, load_or_compute, store_root, weights_fingerprint

__all__ = [
    "ROWS_IN_MEMORY",
    "RowSink",
    "ActivationRows",
    "Decision",
    "DiskRows",
    "FeatureStore",
    "FrozenBackbone",
    "Phase1Features",
    "cache_limit",
    "eval_images",
    "load_or_compute",
    "model_outputs",
    "phase1_bytes",
    "phase1_mode",
    "split_features",
    "splits_features",
    "store_root",
    "weights_fingerprint",
]
