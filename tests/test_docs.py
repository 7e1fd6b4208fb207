"""The front door stays true: README.md, docs/ and benchmarks/README.md name only commands, flags,
modules and scripts that exist, and hold no machine's paths, commit hashes or run history."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from app.commands import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:home|work|root|Users|mnt|tmp)/")
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
HISTORY = re.compile(
    r"an earlier version|the default then|a later session|before this (?:change|session)|"
    r"earlier session|previous version|this session",
    re.IGNORECASE,
)


def text_of(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths_commit_hashes_or_history(document: Path):
    text = text_of(document)
    assert not MACHINE_PATH.findall(text), f"{document.name}: a path of this machine"
    assert not COMMIT_HASH.findall(text), f"{document.name}: commit hash(es) {COMMIT_HASH.findall(text)[:3]}"
    assert not HISTORY.findall(text), f"{document.name}: a history of earlier runs {HISTORY.findall(text)[:3]}"


def test_readme_is_a_front_door_of_at_most_250_lines():
    assert len(text_of(ROOT / "README.md").splitlines()) <= 250


def command_uses(text: str) -> list[tuple[str, list[str]]]:
    """Each `photoclf COMMAND ...` written in a document, with the flags it passes."""
    uses = []
    for match in re.finditer(r"\bphotoclf ([a-z][a-z-]*)([^`\n|]*)", text):
        uses.append((match.group(1), re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", match.group(2))))
    return uses


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_photoclf_command_and_flag_written_exists(document: Path):
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    for command, flags in command_uses(text_of(document)):
        assert command in COMMANDS, f"{document.name}: photoclf {command} is not a command"
        known = subparsers[command]._option_string_actions
        unknown = [flag for flag in flags if flag not in known]
        assert not unknown, f"{document.name}: photoclf {command} has no {unknown}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_benchmark_module_and_script_written_exists(document: Path):
    text = text_of(document)
    for module in re.findall(r"python -m (benchmarks\.[a-z0-9_]+)", text):
        assert importlib.util.find_spec(module) is not None, f"{document.name}: no module {module}"
    for script in re.findall(r"\b(scripts/[a-z_]+\.py)", text):
        assert (ROOT / script).exists(), f"{document.name}: no {script}"
    for link in re.findall(r"\]\(([\w./-]+)(?:#[\w-]*)?\)", text):
        assert (document.parent / link).exists(), f"{document.name}: broken link {link}"


def test_no_module_of_the_package_is_a_benchmark():
    names = [p.relative_to(ROOT).as_posix() for p in (ROOT / "app").rglob("*.py") if "benchmark" in p.name]
    assert names == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_written_exists(document: Path):
    """A guide that names `app/training/some_module.py` after a move sends a reader nowhere."""
    for path in re.findall(r"\b(app/[\w/]+\.(?:py|html))", text_of(document)):
        assert (ROOT / path).exists(), f"{document.name}: no {path}"


# A time, a size or a speed-up in prose: "0.7 s", "12 ms", "750 MB", "2.2x", "3×" after a number.
MEASURED = re.compile(r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|s|MB|GB|KB)\b|\b\d+(?:\.\d+)?x\b")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the module's comments and docstrings."""
    import ast
    import io
    import tokenize

    source = text_of(path)
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]  # fmt: skip
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def test_no_measured_figure_in_the_package_s_or_the_scripts_docstrings_or_comments():
    """Figures go stale where no benchmark reprints them: they live in benchmarks/README.md."""
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {match.group(0)}"
        for path in sorted([*(ROOT / "app").rglob("*.py"), *(ROOT / "scripts").glob("*.py")])
        for line, text in _prose(path)
        for match in MEASURED.finditer(text)
    ]
    assert hits == []
