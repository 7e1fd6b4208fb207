"""Evaluate an exported model on a TFRecord split or an image folder: table, metrics, figures, HTML.

    photoclf evaluate runs/demo --data datasets/demo/tfrecords --split test
    photoclf evaluate exports/shapes/3 --data ~/new_photos --label-map names.json

MODEL_DIR is a run dir (its newest export), EXPORT_DIR/<name> (newest version) or a version
folder. The model is called through its serving signature on raw image bytes: what is measured
is what is deployed.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("evaluate")
