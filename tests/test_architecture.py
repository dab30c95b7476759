"""The structure the README's layout section promises, checked from the source itself:

- layers only look down: no module imports (at its top or inside a function) from a layer above its own;
- no import cycles: no module imports, through others, a module that imports it (imports inside functions
  count; those under `if TYPE_CHECKING:` do not);
- functions are short enough to read at once: none over 80 lines without a stated reason;
- the service's storages only store: each declares the storage contract (`serve/storage.py`) and nothing
  more, and that contract declares no read of the pipeline (search, get, lists are `ToolScout`'s alone).
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# The layer order, lowest first (README "Layout"). A package name covers its submodules unless a more
# specific entry says otherwise; a package's own __init__ is listed by its name with "/__init__".
LAYERS = [
    ("foundation", ["toolscout.errors", "toolscout.registry", "toolscout.defaults", "toolscout.version",
                    "toolscout.artifacts", "toolscout.results", "toolscout.rows", "toolscout.tool",
                    "toolscout.conversation", "toolscout.benchmark_sets", "toolscout.models", "toolscout.llm",
                    "toolscout.feedback", "toolscout.lru", "toolscout.query", "toolscout.deprecation"]),
    ("storage, encoders, parsing, measurement", ["toolscout.store", "toolscout.encoders", "toolscout.ingest",
                                                 "toolscout.eval"]),
    ("retrievers", ["toolscout.retrievers"]),
    ("rerankers", ["toolscout.rerank"]),
    ("learning from use", ["toolscout.learning"]),
    ("pipeline", ["toolscout.pipeline", "toolscout.spec", "toolscout.hits", "toolscout.intents",
                  "toolscout.postgres", "toolscout.pg_pipeline", "toolscout.adapters", "toolscout.relevance"]),
    ("training and data", ["toolscout.train", "toolscout.expand", "toolscout.generate", "toolscout.data"]),
    ("service", ["toolscout.serve"]),
    ("gateway", ["toolscout.gateway"]),
    ("interfaces", ["toolscout.cli", "toolscout.serve.http", "toolscout.serve.mcp", "toolscout.serve.middleware",
                    "toolscout.serve.schemas", "toolscout.serve.ui", "toolscout.serve.__main__",
                    "toolscout.serve/__init__", "toolscout/__init__", "toolscout.__main__",
                    "toolscout.gateway.mcp_server", "toolscout.gateway.http", "toolscout.gateway.runtime",
                    "toolscout.gateway.stdio", "toolscout.gateway.hosts", "toolscout.gateway.bridge"]),
]
LAYER_OF = {name: rank for rank, (_label, names) in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1]) + "/__init__" if parts[-1] == "__init__" else ".".join(parts)


def layer(module: str) -> int:
    """The layer of a module ("a.b.c") or package init ("a.b/__init__"): the most specific entry."""
    if module in LAYER_OF:
        return LAYER_OF[module]
    name = module.removesuffix("/__init__")
    while name:
        if name in LAYER_OF:
            return LAYER_OF[name]
        name = name.rpartition(".")[0]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS here and to the README's layout")


def imports(path: Path, with_typing: bool = True) -> list[tuple[int, str]]:
    """(line, imported toolscout module or package init) for every import in the file, nested ones too;
    `with_typing=False` leaves out those under `if TYPE_CHECKING:` (they never run)."""
    module = module_name(path)
    package = module.removesuffix("/__init__") if module.endswith("/__init__") else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
              for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if not with_typing and id(node) in typing:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module:
                found.append((node.lineno, target))
            else:  # `from . import x`: x is a module of the package
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return [(line, _resolve(name)) for line, name in found if name.split(".")[0] == "toolscout"]


def _resolve(name: str) -> str:
    """An import target as a module file's name: a package resolves to its __init__."""
    path = SRC.joinpath(*name.split("."))
    return f"{name}/__init__" if path.is_dir() else name


SOURCES = sorted((SRC / "toolscout").rglob("*.py"))


def test_every_module_has_a_layer():
    assert [module_name(p) for p in SOURCES if not _has_layer(module_name(p))] == []


def _has_layer(module: str) -> bool:
    try:
        layer(module)
    except AssertionError:
        return False
    return True


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path in SOURCES:
        module = module_name(path)
        for line, target in imports(path):
            if layer(target) > layer(module):
                upward.append(f"{path.relative_to(SRC)}:{line} ({LAYERS[layer(module)][0]}) imports {target} "
                              f"({LAYERS[layer(target)][0]})")
    assert upward == []


def test_the_layer_check_sees_nested_and_relative_imports(tmp_path, monkeypatch):
    """The check itself must catch an upward import written inside a function, relative or absolute."""
    fake = tmp_path / "toolscout" / "store"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("def f():\n    from ..serve.service import ToolService\n"
                                 "def g():\n    import toolscout.cli\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    found = imports(fake / "bad.py")
    assert [(line, name) for line, name in found] == [(2, "toolscout.serve.service"), (4, "toolscout.cli")]
    assert all(layer(name) > layer("toolscout.store.bad") for _line, name in found)


def import_cycles(sources: list[Path]) -> list[list[str]]:
    """The import cycles among `sources`: each strongly connected group of two or more modules (Tarjan)."""
    graph = {module_name(p): {name for _line, name in imports(p, with_typing=False)} for p in sources}
    order, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module] & graph.keys():
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(cycles)


def test_no_import_cycles():
    assert import_cycles(SOURCES) == []


def test_the_cycle_check_sees_cycles_through_nested_imports_and_not_typing_ones(tmp_path, monkeypatch):
    fake = tmp_path / "toolscout" / "store"
    fake.mkdir(parents=True)
    (fake / "a.py").write_text("from . import b\n")
    (fake / "b.py").write_text("def f():\n    from .c import x\n")
    (fake / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import y\n"
                               "def g():\n    from .a import z\n")
    (fake / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import w\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    found = import_cycles(sorted(fake.glob("*.py")))
    assert found == [["toolscout.store.a", "toolscout.store.b", "toolscout.store.c"]]


MAX_LINES = 80
REASON = "# long:"  # on the line above a function (or its first decorator): why it is allowed to be long


def long_functions(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - node.lineno + 1
            stated = start >= 2 and lines[start - 2].strip().startswith(REASON)
            if length > MAX_LINES and not stated:
                out.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_is_over_80_lines_without_a_stated_reason():
    assert [entry for path in SOURCES for entry in long_functions(path)] == []


@pytest.mark.parametrize("reason", [True, False])
def test_the_length_check_counts_lines_and_honours_a_reason(tmp_path, reason):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    source = (f"{REASON} a generated table\n" if reason else "") + f"def big():\n{body}\n"
    path = tmp_path / "toolscout" / "m.py"
    path.parent.mkdir()
    path.write_text(source)
    found = [line.split(" ", 1)[1] for line in _long_in(tmp_path, path)]
    assert found == ([] if reason else [f"big ({MAX_LINES + 1} lines)"])


def _long_in(root: Path, path: Path) -> list[str]:
    global SRC
    saved, SRC = SRC, root
    try:
        return long_functions(path)
    finally:
        SRC = saved


# ------------------------------------------------------------------------- the service's middle layers
# A storage stores: it hands the service its tenant's pipeline (`ToolScout`), which the service reads itself,
# and makes writes durable. Reads are declared once, on the pipeline; a storage that forwarded them again
# (search, get, a page, a count) would be a layer of verbs with nothing of its own.

STORAGE_CONTRACT = SRC / "toolscout" / "serve" / "storage.py"
STORAGES = [SRC / "toolscout" / "serve" / "directory.py", SRC / "toolscout" / "serve" / "pg_storage.py"]
PIPELINE = SRC / "toolscout" / "pipeline.py"
DURABLE = {"learn", "forget", "rollback", "set_learning"}  # pipeline verbs a storage makes durable first


def methods(path: Path) -> dict[str, set[str]]:
    """class name -> the names of the methods and annotated attributes it declares (not inherited)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name: {item.name if not isinstance(item, ast.AnnAssign) else item.target.id
                        for item in node.body if isinstance(item, (ast.FunctionDef, ast.AnnAssign))}
            for node in tree.body if isinstance(node, ast.ClassDef)}


def _public(names: set[str]) -> set[str]:
    """What callers may call: names without a leading underscore, and dunders (`__len__` is a read too)."""
    return {n for n in names if not n.startswith("_") or (n.startswith("__") and n != "__init__")}


def test_the_storage_contract_declares_no_read_of_the_pipeline():
    contract = methods(STORAGE_CONTRACT)
    pipeline = _public(methods(PIPELINE)["ToolScout"])
    shared = {name: _public(contract[name]) & pipeline for name in ("Storage", "TenantStorage")}
    assert shared == {"Storage": set(), "TenantStorage": DURABLE}


def test_every_storage_declares_its_contract_and_nothing_more():
    contract = methods(STORAGE_CONTRACT)
    allowed = set().union(*(_public(contract[name]) for name in ("Storage", "TenantStorage", "Compacts", "Retrains",
                                                                     "ProbesServer")))
    extra = {f"{path.name}: {cls}": sorted(_public(names) - allowed - {"open"})
             for path in STORAGES for cls, names in methods(path).items() if not cls.startswith("_")}
    assert {where: names for where, names in extra.items() if names} == {}
    assert len(extra) == 3  # DirectoryStorage, PgStorage, PgTenantStorage: a storage that moves is still checked


def test_the_verb_check_sees_a_forwarded_read(tmp_path):
    fake = tmp_path / "storage.py"
    fake.write_text("class Store:\n    kind: str\n    def search(self, queries): ...\n    def _own(self): ...\n"
                    "    def __len__(self): ...\n")
    assert _public(methods(fake)["Store"]) == {"kind", "search", "__len__"}


def test_no_source_file_has_an_invalid_escape_sequence():
    # pytest's configuration hides this warning (ranx's modules raise it when first compiled), so it is
    # checked here for toolscout's own files, as an error
    import warnings

    root = SRC.parent
    files = [p for folder in ("src", "tests", "benchmarks", "scripts", "examples") for p in (root / folder).rglob("*.py")]
    assert len(files) > 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in files:
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
