"""Evaluate an exported model on a TFRecord split or an image folder: table, metrics, figures, HTML.

    photoclf evaluate runs/demo --data datasets/demo/tfrecords --split test

The same command as `photoclf evaluate` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("evaluate")
