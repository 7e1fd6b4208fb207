"""Fine-tune a pretrained backbone on TFRecords in two phases, then export a SavedModel.

    photoclf train                       # the built-in demo, end to end
    photoclf train --data data/ --out runs/flowers --backbone efficientnet_b0
    TF_CONFIG='{...}' photoclf train --data gs://bucket/data --out /shared/runs/x   # on each worker

Phase 1 trains a new head on the frozen backbone; phase 2 unfreezes the top blocks at a low
learning rate. Re-running the same command resumes an interrupted run. Every config key can be
set in a TOML file (--config, examples in configs/) or with --set key=value; flags override both.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("train")
