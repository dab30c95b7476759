"""Exceptions users see. Each message says what was wrong, where, and what to do."""


class ToolScoutError(Exception):
    """Base class for toolscout's own errors."""


class CatalogError(ToolScoutError, ValueError):
    """A catalog file or object could not be read as tools."""


class MissingDependency(ToolScoutError, ImportError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, feature: str, extra: str | None = None):
        hint = f"pip install 'toolscout[{extra}]'" if extra else f"pip install {package}"
        super().__init__(f"{feature} needs the '{package}' package: {hint}")


class UnknownName(ToolScoutError, KeyError):
    """A registry lookup failed."""

    def __init__(self, what: str, name: str, known: list[str]):
        self.message = f"unknown {what} {name!r}; known: {', '.join(sorted(known))}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message
