"""Find learning rates for both phases: a short exponential sweep on your data and model.

    photoclf find-lr --data data/ --out runs/flowers        # → runs/flowers-lr-find/lr_find.png

The same command as `photoclf find-lr` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("find-lr")
