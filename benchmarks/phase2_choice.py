"""Which of phase 2's weights a run should keep, judged on held-out photos: every candidate of one
run scored on its test split, so the rules are compared on the same training, paired.

    python -m benchmarks.phase2_choice --shared ../shared
    python -m benchmarks.phase2_choice --shared ../shared --sets food10 --backbones efficientnet_lite0 --seeds 0,1

Each run is the default `photoclf train` on a suite set (cut as `benchmarks.suite` cuts it), in
this process and without its export. It also holds phase 1's kept weights and every phase-2
epoch's, and before the run's own test pass scores each of them on the test split (through the
layers above phase 2's cut, as the run's own test pass does). The rules, each a choice among those
candidates by what validation said of them:

- `guard`: the best val_loss of the phase-2 epochs that beat phase 1's val_loss without falling
  under its val_accuracy; phase 1's weights where none does;
- `val_loss`: the best val_loss of the phase-2 epochs that beat phase 1's; phase 1's where none does;
- `phase 2`: phase 2's best val_loss epoch, whatever phase 1 scored;
- `last`: phase 2's last epoch, whatever phase 1 scored;
- `latest`: the latest phase-2 epoch that beats phase 1's val_loss; phase 1's where none does
  (what `photoclf train` keeps of phase 2's whole schedule on images).

Prints a line per run, then per rule its mean test accuracy and its difference from the run's own
kept weights (the default rule) per set, and a JSON line. Test chose nothing; validation chose every
rule's weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from app.cli import int_list, lasting_imports, run_cli
from app.errors import UserError
from app.table import format_table

RULES = ("guard", "val_loss", "phase 2", "last", "latest")
DEFAULT_RULE = "latest"


@dataclass
class Candidate:
    val_loss: float
    val_accuracy: float
    test_accuracy: float = float("nan")
    weights: list = field(default_factory=list, repr=False)


@dataclass
class Scored:
    """One run's candidates: phase 1's kept weights and each phase-2 epoch's, and what it kept."""

    where: str
    seed: int
    phase1: Candidate
    epochs: list[Candidate]
    kept_test: float = float("nan")

    def choice(self, rule: str) -> Candidate:
        p1, epochs = self.phase1, self.epochs
        if rule == "last":
            return epochs[-1]
        if rule == "phase 2":
            return min(epochs, key=lambda c: c.val_loss)
        floor = p1.val_accuracy if rule == "guard" else float("-inf")
        beating = [c for c in epochs if c.val_loss < p1.val_loss - 1e-7 and c.val_accuracy >= floor - 1e-9]
        if not beating:
            return p1
        return beating[-1] if rule == "latest" else min(beating, key=lambda c: c.val_loss)


@contextlib.contextmanager
def scoring(found: list[Scored], where: str, seed: int) -> Iterator[None]:
    """Within the block, a run holds phase 1's kept weights and every phase-2 epoch's, and scores
    them on its test split before its own test pass; each run's candidates land in `found`."""
    from app.run_dir import read_history
    from app.training import phase as phase_module
    from app.training import train as train_module

    run_phase, run_epoch, evaluate_test = (phase_module.run_phase, phase_module._run_epoch, train_module._evaluate_test)
    current: dict = {}

    def held_run_phase(phase):
        if phase.spec.phase == 2:
            base = phase.baseline
            current["scored"] = Scored(where, seed, Candidate(base.val_loss, base.val_accuracy,
                                                              weights=phase.model.get_weights()), [])  # fmt: skip
        return run_phase(phase)

    def held_epoch(phase, state, iterator, start):
        run_epoch(phase, state, iterator, start)
        if phase.spec.phase == 2:
            row = read_history(phase.history.path)[-1]  # the epoch's validation, as the run recorded it
            current["scored"].epochs.append(Candidate(float(row["val_loss"]), float(row["val_accuracy"]),
                                                      weights=phase.model.get_weights()))  # fmt: skip

    def scored_test(ctx, frozen, on_images):
        scored = current.get("scored")
        if scored is not None:
            kept = ctx.clf.model.get_weights()
            for candidate in [scored.phase1, *scored.epochs]:
                ctx.clf.model.set_weights(candidate.weights)
                candidate.test_accuracy = evaluate_test(ctx, frozen, on_images).accuracy
                candidate.weights = []
            ctx.clf.model.set_weights(kept)
        result = evaluate_test(ctx, frozen, on_images)
        if scored is not None:
            scored.kept_test = result.accuracy
            found.append(scored)
        return result

    with contextlib.ExitStack() as patches:
        held = ((phase_module, "run_phase", held_run_phase), (phase_module, "_run_epoch", held_epoch),
                (train_module, "run_phase", held_run_phase), (train_module, "_evaluate_test", scored_test))  # fmt: skip
        for module, name, replacement in held:
            patches.enter_context(mock.patch.object(module, name, replacement))
        yield


def train_scored(cfg, where: str, found: list[Scored]) -> Scored:
    """`cfg`'s run (a TrainConfig), without its export, its candidates scored into `found`."""
    from app.export import run_export
    from app.training.train import train

    skipped = {"missing": "not written: benchmarks.phase2_choice"}
    savedmodel_only = mock.patch.object(
        run_export, "_files_beside", lambda *_: {"litert": {}, "openvino": skipped, "onnx": skipped}
    )
    with savedmodel_only, scoring(found, where, cfg.seed):
        train(cfg, overwrite=True)
    return found[-1]


def tables(found: list[Scored]) -> str:
    wheres = list(dict.fromkeys(s.where for s in found))
    rows = []
    for rule in RULES:
        row = [rule]
        for where in wheres:
            runs = [s for s in found if s.where == where]
            diff = statistics.mean(100 * (s.choice(rule).test_accuracy - s.kept_test) for s in runs)
            row.append(f"{statistics.mean(s.choice(rule).test_accuracy for s in runs):.4f} ({diff:+.1f})")
        rows.append(row)
    return format_table([["rule", *wheres], *rows])


def describe(s: Scored) -> str:
    chosen = ", ".join(f"{rule} {s.choice(rule).test_accuracy:.4f}" for rule in RULES)
    return f"{s.where} seed {s.seed}: kept {s.kept_test:.4f}; {chosen}"


def main() -> int:
    from app.config import TrainConfig
    from benchmarks.suite import SETS, WEIGHTS, prepare

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shared", type=Path, required=True, help="the shared folder (weights/, data/)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "photoclf-suite",
                   help="where the suite's sets are converted (shared with benchmarks.suite)")  # fmt: skip
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated suite sets (default all)")
    p.add_argument("--backbones", default=",".join(WEIGHTS), help="comma-separated (default both)")
    p.add_argument("--seeds", type=int_list, default=(0,), help="comma-separated (default 0)")
    args = p.parse_args()
    unknown = [s for s in args.sets.split(",") if s not in SETS] + [
        b for b in args.backbones.split(",") if b not in WEIGHTS
    ]
    if unknown:
        raise UserError(f"--sets/--backbones: unknown {unknown}")
    with lasting_imports():
        import app.training.train  # noqa: F401
    found: list[Scored] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name in args.sets.split(","):
                records = prepare(args.shared, args.work, name, quick=False)
                for backbone in args.backbones.split(","):
                    cfg = TrainConfig(data=str(records), out=str(Path(tmp) / "run"), backbone=backbone,
                                      weights=str(args.shared / WEIGHTS[backbone]), seed=seed)  # fmt: skip
                    print(describe(train_scored(cfg, f"{name} {backbone}", found)), flush=True)
    print(tables(found))
    print(json.dumps([{"where": s.where, "seed": s.seed, "kept": s.kept_test,
                       **{r: s.choice(r).test_accuracy for r in RULES}} for s in found]))  # fmt: skip
    return 0


if __name__ == "__main__":
    run_cli(main)
