"""Small modules with one job and short functions (the style guide's bounds): a module over 400
lines or a function over 50 is where a newcomer stops reading, so both are caught here rather
than in review."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
MODULE_LINES = 400
FUNCTION_LINES = 50


def _modules() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of each function or method longer than FUNCTION_LINES, decorators left out."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > FUNCTION_LINES:
                found.append((node.name, lines))
    return found


def test_the_check_counts_a_functions_lines_from_def_to_its_last_line():
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    assert long_functions(f"def fits():\n{body[: body.rindex('    x')]}") == []
    assert long_functions(f"def one_over():\n{body}") == [("one_over", FUNCTION_LINES + 1)]


def test_no_module_of_app_is_over_400_lines():
    over = {str(p.relative_to(APP)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert over == {}


def test_no_function_of_app_is_over_50_lines():
    over = {f"{p.relative_to(APP)}:{name}": n for p in _modules() for name, n in long_functions(p.read_text())}
    assert over == {}
