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

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from app.cli import finite_float, lasting_imports

HELP = "find learning rates for both phases: a short exponential sweep on your data and model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help="TFRecord folder (default: the built-in demo)")
    p.add_argument(
        "--out", default=None, help="the run dir you will train into; the sweep goes beside it (default runs/demo)"
    )
    p.add_argument("--config", type=Path, default=None, help="TOML file with config keys, as for photoclf train")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key; repeatable"
    )
    p.add_argument("--steps", type=int, default=100, help="batches per sweep (default 100)")
    p.add_argument("--lr-min", type=finite_float, default=1e-7, help="first learning rate (default 1e-7)")
    p.add_argument("--lr-max", type=finite_float, default=1.0, help="last learning rate (default 1)")
    p.add_argument("--phase", choices=["1", "2", "both"], default="both", help="which phase to sweep (default both)")


def run(args: argparse.Namespace) -> None:
    from app.errors import UserError

    if args.steps < 10:  # said before TensorFlow's seconds of import
        raise UserError(f"--steps must be >= 10, got {args.steps}")
    if not 0 < args.lr_min < args.lr_max:
        raise UserError(f"--lr-min {args.lr_min:g} and --lr-max {args.lr_max:g}: need 0 < --lr-min < --lr-max")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with lasting_imports():
        from app.config import load_config, parse_set
        from app.data.demo import ensure_demo_records
        from app.training.lr_find_job import find_lr
        from app.training.lr_finder import report_dir

    flags = {k: v for k, v in (("data", args.data), ("out", args.out)) if v is not None}
    cfg = load_config(args.config, parse_set(args.set), flags)
    if not cfg.data:
        cfg = cfg.replace(data=str(ensure_demo_records()))
    phases = (1, 2) if args.phase == "both" else (int(args.phase),)
    sweeps = find_lr(cfg, steps=args.steps, lr_min=args.lr_min, lr_max=args.lr_max, phases=phases)
    for s in sweeps:
        key = "lr_head" if s.phase == 1 else "lr_finetune"
        print(f"{s.summary()}\n  apply with: --set {key}={s.suggestion:.2g}")
    print(f"plot: {report_dir(cfg.out) / 'lr_find.png'}")
