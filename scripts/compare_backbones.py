"""Which backbone for your photos? Ranks candidates by a linear probe on their frozen features.

    photoclf compare-backbones data/ --backbones mobilenet_v2,efficientnet_b0,convnext_tiny
    photoclf compare-backbones data/ --backbones mobilenet_v2,mobilenet_v2@none   # is pretraining paying?

DATA is a make_tfrecords.py folder. Each backbone runs once over every split (evaluation
preprocessing, no augmentation); a logistic regression on its pooled features is fitted on
train and scored on val (and test). Ranked by val accuracy: what phase 1 of a run can get out
of that backbone, in minutes per backbone on a CPU instead of a fine-tune each. A candidate
takes its weights after '@' (auto | imagenet | none | PATH; default auto, as fine_tune.py).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("compare-backbones")
