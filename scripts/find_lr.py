"""Find learning rates for both phases: a short exponential sweep on your data and model.

    photoclf find-lr --data data/ --out runs/flowers        # → runs/flowers-lr-find/lr_find.png
    photoclf train --data data/ --out runs/flowers --set lr_head=3e-3 --set lr_finetune=2e-4

Phase 1 (the head, on the frozen backbone) is swept from --lr-min to --lr-max over --steps
batches; then phase 1 is trained with lr_head and phase 2 (the unfrozen top) is swept the same
way. Prints each suggestion with its rule (fastai's "valley": halfway along the longest stretch
where the smoothed loss keeps falling), and writes
lr_find.png (loss against learning rate) and lr_find.json beside the run dir. Takes the same
config as fine_tune.py (--config, --set); nothing is written into the run dir itself.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("find-lr")
