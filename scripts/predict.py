"""Predict labels for unlabelled photos with an exported model: CSV or JSONL, one row per file.

    photoclf predict runs/demo ~/new_photos                      # → predictions.csv
    photoclf predict runs/demo/export/demo "shots/**/*.jpg" --output out.jsonl
    photoclf predict exports/pets/3 paths.txt --top-k 1          # .txt/.csv list of paths

MODEL_DIR is a run dir (its newest export), EXPORT_DIR/<name> (newest version) or a version
folder. INPUT is a folder (searched recursively), a glob (quote it) or a .txt/.csv file of
paths. Rows: path, label_1, score_1, ..., error. Files that cannot be read, are not images or
are over the model's pixel limit get their reason in `error` and never stop the run; they are
also listed at the end. The output appears only when complete.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("predict")
