"""Every package the library's code imports is declared in pyproject.toml (its dependencies or an extra),
not left to arrive as something else's dependency (issue 35 item 5: `httpx2` was imported and not declared)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "toolscout"


def imported_modules() -> dict[str, str]:
    """Top-level name of every absolute import in src/toolscout (nested ones too) -> a file that imports it."""
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    """Normalised names of the distributions pyproject.toml declares, in its dependencies and every extra."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    if tomllib is None:
        pytest.skip("needs tomllib (Python 3.11+)")
    project = tomllib.loads(text)["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {normalise(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_package_is_declared():
    distributions = packages_distributions()
    wanted = declared() | {"toolscout"}
    missing = []
    for module, where in sorted(imported_modules().items()):
        if module in sys.stdlib_module_names or module == "toolscout":
            continue
        owners = {normalise(d) for d in distributions.get(module, [])}
        if not owners:
            continue  # not installed here (an optional package of an extra this venv lacks): nothing to map
        if not owners & wanted:
            missing.append(f"{module} (from {', '.join(sorted(owners))}; imported in {where})")
    assert missing == [], "imported, not declared in pyproject.toml: " + "; ".join(missing)
