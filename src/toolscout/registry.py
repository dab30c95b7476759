"""Registries map a name to "module:attribute", imported on first use so `import toolscout` stays light."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from .errors import UnknownName


def lookup(what: str, name: str, table: Mapping[str, str]) -> Any:
    """The object registered as `name` in `table`; an unknown name fails with the known ones listed."""
    if name not in table:
        raise UnknownName(what, name, list(table))
    module, _, attr = table[name].partition(":")
    return getattr(importlib.import_module(module), attr)
