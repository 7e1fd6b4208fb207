"""`photoclf find-lr`: sweep phase 1's rate, train phase 1, sweep phase 2's, in a scratch run dir.

The sweeps themselves are app/training/lr_finder.py's; this is the job around them, which needs
a trained phase 1 and so the training code.
"""

from __future__ import annotations

import logging
import shutil
import tempfile

from app.run_dir import release_run_dirs
from app.training.context import setup
from app.training.lr_finder import Sweep, finetune_sweep, head_sweep, report_dir, write_sweeps
from app.training.train import run_phase1

log = logging.getLogger(__name__)


def find_lr(
    cfg, *, steps: int = 100, lr_min: float = 1e-7, lr_max: float = 1.0, phases: tuple[int, ...] = (1, 2)
) -> list[Sweep]:
    """Sweep phase 1, then (after training phase 1 with cfg.lr_head) phase 2, in a scratch run dir;
    write lr_find.png and lr_find.json to report_dir(cfg.out)."""
    scratch = tempfile.mkdtemp(prefix="photoclf-lr-find-")
    options = {"steps": steps, "lr_min": lr_min, "lr_max": lr_max}
    try:
        ctx = setup(cfg.replace(out=scratch), overwrite=True)
        sweeps = [head_sweep(ctx, **options)] if 1 in phases else []
        if 2 in phases and cfg.epochs_finetune:
            if cfg.epochs_head:
                log.info("training phase 1 (lr_head %.2g) so that phase 2 is swept under a trained head", cfg.lr_head)
                run_phase1(ctx)
            sweeps.append(finetune_sweep(ctx, **options))
    finally:
        release_run_dirs()
        shutil.rmtree(scratch, ignore_errors=True)
    folder = report_dir(cfg.out)
    folder.mkdir(parents=True, exist_ok=True)
    write_sweeps(sweeps, folder)
    return sweeps
