"""Python callables as tools: `load_tools([f, g])`, `"package.module:attr"` or `"path/to/tools.py"`.

From a module (file or import path) the tools are its `TOOLS` list when it has one, else its public
module-level functions (defined there with `def`, not imported; names not starting with `_`), in source
order; a lambda assigned at module level is left out with a warning.
`module:attr` may name one callable, a list of them, or a module. Loading a file runs it, as any import does.

Per callable: name = `__name__`; description = the docstring's first paragraph; per-parameter
descriptions from Google (`Args:`), NumPy (`Parameters` + dashes) or reST (`:param x:`) sections;
`returns` = the return annotation's schema plus the `Returns` text; `examples` = an `Examples` section;
parameters from `inspect.signature` and the type hints (see `docstrings.py` and `pytypes.py`).
A parameter with a default is not required and its JSON-able default is kept. `raw` is the callable.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from ..errors import CatalogError
from ..tool import Tool
from .common import Context, Entry, LoadReport, at, collect, make_tool
from .docstrings import Docstring, parse_docstring
from .guard import check_tree
from .pytypes import HintTooDeep, jsonable_default, self_contained, type_schema

MODULE_ATTR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def parse(obj: Any, ctx: Context) -> list[Entry]:
    items = [obj] if callable(obj) else obj
    if not isinstance(items, (list, tuple)):
        raise ctx.error("", f"expected a list of Python callables, got {type(obj).__name__}")
    ctx.empty_hint = "a module's tools are its TOOLS list, else the public functions it defines"
    return collect(ctx, ((f"[{i}]", fn) for i, fn in enumerate(items)), lambda pos, fn: _tool(ctx, pos, fn))


# ------------------------------------------------------------------------------------ finding them

def callables_from_module(module: ModuleType, source: str, report: LoadReport) -> list[Callable]:
    tools = getattr(module, "TOOLS", None)
    if tools is not None:
        if not isinstance(tools, (list, tuple)):
            raise CatalogError(f"{source}: TOOLS must be a list of callables, got {type(tools).__name__}")
        return list(tools)
    found = []
    for name, value in vars(module).items():
        if not inspect.isfunction(value) or value.__module__ != module.__name__ or name.startswith("_"):
            continue
        if value.__name__ == "<lambda>":  # a helper assigned at module level, not a function the module defines
            report.warn(source, f"{name} is a lambda, not a function defined with def: not taken as a tool")
            continue
        found.append(value)
    return found


def import_callables(spec: str, report: LoadReport) -> list[Callable]:
    """`package.module:attr` (a callable, a list of them, or a module) or a module path alone."""
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # the user's module: any import-time error (or exit) is theirs to see
        raise CatalogError(f"{spec}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from None
    for part in filter(None, attr.split(".")):
        if not hasattr(target, part):
            raise CatalogError(f"{spec}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if isinstance(target, ModuleType):
        return callables_from_module(target, spec, report)
    return [target] if callable(target) else target


def load_file(path: Path, source: str, report: LoadReport) -> list[Callable]:
    """Import a .py file under a private module name and take its tools."""
    name = "toolscout_user_" + re.sub(r"\W", "_", str(path.resolve()))
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CatalogError(f"{source}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and typing look the module up while it runs
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # sys.exit() at import must not end the caller's process
        sys.modules.pop(name, None)
        raise CatalogError(f"{source}: running the module failed ({type(exc).__name__}: {exc})") from None
    return callables_from_module(module, source, report)


# ------------------------------------------------------------------------------------ one callable

def _callable_name(fn: Any) -> str | None:
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)  # partials
    if name is None and callable(fn):
        name = type(fn).__name__  # a callable object
    return name if isinstance(name, str) and name and name != "<lambda>" else None


def _tool(ctx: Context, position: str, fn: Any) -> Tool:
    if not callable(fn):
        raise ctx.error(position, f"expected a callable, got {type(fn).__name__}")
    name = _callable_name(fn)
    if name is None:
        raise ctx.error(position, "a lambda has no name to call it by", "define it with def, or wrap it")
    position = f"{position} ({name})"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ctx.error(position, f"cannot read the signature of {name!r} ({exc})") from None
    hints = _type_hints(ctx, fn, position)
    doc = parse_docstring(inspect.getdoc(fn) or "")
    parameters = _parameters(ctx, position, signature, hints, doc)
    returns = _returns(ctx, position, hints.get("return", signature.return_annotation), doc.returns)
    for key, schema in (("parameters", parameters), ("returns", returns)):  # the bounds of any catalog schema
        check_tree(schema, ctx.source, json_only=True, position=at(position, key))
    return make_tool(ctx, position, ctx.namespace, name, description=doc.description, parameters=parameters, returns=returns,
                     examples=doc.examples, raw=fn)


def _parameters(ctx: Context, position: str, signature: inspect.Signature, hints: dict[str, Any],
                doc: Docstring) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue  # *args/**kwargs have no schema an agent could fill
        schema = _hint_schema(ctx, f"{position}.parameters.properties.{pname}", hints.get(pname, param.annotation))
        if pname in doc.params and "description" not in schema:
            schema = {**schema, "description": doc.params[pname]}
        if param.default is param.empty:
            required.append(pname)
        else:
            ok, default = jsonable_default(param.default)
            if ok:
                schema = {**schema, "default": default}
        properties[pname] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return self_contained(parameters)


def _hint_schema(ctx: Context, where: str, hint: Any) -> dict[str, Any]:
    try:
        return type_schema(hint)
    except HintTooDeep as exc:
        raise ctx.error(where, str(exc), "a tool's argument types are far shallower") from None


def _type_hints(ctx: Context, fn: Any, position: str) -> dict[str, Any]:
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "func", type(fn).__call__)
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception as exc:  # an unresolvable forward reference: fall back to untyped parameters
        ctx.warn(f"{position}: type hints could not be resolved ({exc}); those parameters are untyped")
        return {}


def _returns(ctx: Context, position: str, annotation: Any, text: str) -> dict[str, Any] | None:
    if annotation is None or annotation is type(None):
        return {"description": text} if text else None
    schema = self_contained(_hint_schema(ctx, at(position, "returns"), annotation))
    if text:
        schema = {**schema, "description": text}
    return schema or None
