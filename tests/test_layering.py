"""The import-linter contracts (pyproject.toml, checked by `lint-imports` in CI) name modules one by
one: a module added to the frozen backbone's package must join them, or the one door and the
package's order would hold for every module but the new one, and lint-imports would not say so."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FROZEN = ROOT / "app" / "training" / "frozen"


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _frozen_modules() -> set[str]:
    return {path.stem for path in FROZEN.glob("*.py") if path.stem != "__init__"}


def test_every_module_of_the_frozen_package_is_behind_its_door():
    door = next(c for c in _contracts() if c["type"] == "forbidden" and "app.training.frozen.backbone" in
                c["forbidden_modules"])  # fmt: skip
    behind = {name.removeprefix("app.training.frozen.") for name in door["forbidden_modules"]}
    assert behind == _frozen_modules()


def test_every_module_of_the_frozen_package_has_its_place_in_the_packages_order():
    order = next(c for c in _contracts() if c.get("containers") == ["app.training.frozen"])
    placed = {name.strip() for layer in order["layers"] for name in layer.split("|")}
    assert placed == _frozen_modules()
