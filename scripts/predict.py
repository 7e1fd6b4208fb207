"""Predict labels for unlabelled photos with an exported model: CSV, JSONL or JSON, one row per file.

    photoclf predict runs/demo ~/new_photos                      # → predictions.csv

The same command as `photoclf predict` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("predict")
