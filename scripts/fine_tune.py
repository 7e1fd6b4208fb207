"""Fine-tune a pretrained backbone on TFRecords in two phases, then export a SavedModel.

    python scripts/fine_tune.py                  # the built-in demo, end to end
    python scripts/fine_tune.py --data data/ --out runs/flowers

The same command as `photoclf train` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("train")
