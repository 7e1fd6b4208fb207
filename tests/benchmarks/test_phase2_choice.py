"""The phase-2 choice benchmark: what each rule keeps, and one real run whose candidates it scores."""

from __future__ import annotations

import pytest

from app.config import TrainConfig
from benchmarks.phase2_choice import DEFAULT_RULE, Candidate, Scored, train_scored


def _scored() -> Scored:
    """Phase 1 at val loss 0.50 and accuracy 0.80; phase 2's epochs: one that beats its loss with
    fewer right answers (the best loss of all), one that beats it with as many, one that does not."""
    phase1 = Candidate(0.50, 0.80, test_accuracy=0.70)
    epochs = [
        Candidate(0.40, 0.78, test_accuracy=0.75),
        Candidate(0.45, 0.80, test_accuracy=0.72),
        Candidate(0.55, 0.90, test_accuracy=0.71),
    ]
    return Scored("set backbone", 0, phase1, epochs)


def test_each_rule_keeps_what_validation_says_of_the_candidates():
    scored = _scored()
    assert scored.choice("val_loss").test_accuracy == 0.75  # the best loss that beats phase 1's
    assert scored.choice("guard").test_accuracy == 0.72  # ... among those that keep phase 1's val accuracy
    assert scored.choice("phase 2").test_accuracy == 0.75
    assert scored.choice("last").test_accuracy == 0.71
    assert scored.choice("latest").test_accuracy == 0.72  # the last that beats phase 1's loss


def test_where_no_epoch_beats_phase_1_the_rules_that_compare_keep_phase_1():
    scored = _scored()
    scored.phase1 = Candidate(0.30, 0.80, test_accuracy=0.70)
    assert all(scored.choice(rule) is scored.phase1 for rule in ("val_loss", "guard", "latest"))
    assert scored.choice("phase 2").test_accuracy == 0.75  # phase 2's own best, whatever phase 1 scored


@pytest.mark.slow  # a tiny run, both phases, and a test pass per candidate
def test_a_run_scores_phase_1_and_every_phase_2_epoch_and_its_own_rule_is_what_it_kept(tiny_config: TrainConfig):
    cfg = tiny_config.replace(phase2_mode="images", epochs_finetune=3, early_stopping_patience=5)
    found: list[Scored] = []
    scored = train_scored(cfg, "demo tiny", found)
    assert found == [scored] and len(scored.epochs) == 3
    candidates = [scored.phase1, *scored.epochs]
    assert all(0.0 <= c.test_accuracy <= 1.0 and c.weights == [] for c in candidates)
    assert scored.choice(DEFAULT_RULE).test_accuracy == pytest.approx(scored.kept_test)  # the run's own rule
