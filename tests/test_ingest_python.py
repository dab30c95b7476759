"""Python callables → tools: signatures, type hints, docstrings (Google, NumPy, reST), module sources."""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypedDict, Union

import pytest

from toolscout.errors import CatalogError
from toolscout.ingest import LoadReport, load_tools, parse_tools
from toolscout.ingest.docstrings import parse_docstring
from toolscout.ingest.pytypes import type_schema

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


@pytest.fixture(scope="module")
def module_tools():
    return {t.name: t for t in load_tools(FIXTURES / "tools_module.py")}


def test_module_file_gives_its_public_functions_in_order(module_tools):
    assert list(module_tools) == ["get_forecast", "search_flights", "convert"]  # no _private, no imported


def test_google_docstring_signature_enum_and_defaults(module_tools):
    tool = module_tools["get_forecast"]
    assert tool.id == "get_forecast" and tool.namespace is None
    assert tool.description == "Get the weather forecast for a city."  # first paragraph only
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": 'Name of the city, e.g. "Paris".'},
            "days": {"type": "integer", "description": "How many days ahead.", "default": 3},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit.",
                     "default": "celsius"},
            "hourly": {"type": "boolean", "default": False},
        },
        "required": ["city"],
    }
    assert tool.returns == {"type": "object", "additionalProperties": {"type": "number"},
                            "description": "Temperatures by date."}
    assert tool.examples == ('get_forecast("Paris", days=2)',)
    assert callable(tool.raw) and tool.raw.__name__ == "get_forecast"


def test_numpy_docstring_optional_literal_and_pep604(module_tools):
    tool = module_tools["search_flights"]
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "origin": {"type": "string", "description": "Departure airport code."},
            "destination": {"type": "string", "description": "Arrival airport code."},
            "max_stops": {"type": ["integer", "null"], "description": "Most stops allowed.", "default": None},
            "cabin": {"type": "string", "enum": ["economy", "business"], "default": "economy"},
            "airlines": {"type": ["array", "null"], "items": {"type": "string"}, "default": None},
        },
        "required": ["origin", "destination"],
    }
    assert tool.returns is None  # no annotation, no Returns section


def test_rest_docstring_and_var_args_skipped(module_tools):
    tool = module_tools["convert"]
    assert tool.parameters == {
        "type": "object",
        "properties": {"amount": {"type": "number", "description": "The amount to convert."},
                       "rates": {"type": "object", "additionalProperties": {"type": "number"},
                                 "description": "Exchange rates by currency code."}},
        "required": ["amount", "rates"]}
    assert tool.returns == {"description": "nothing"}  # `-> None` with a :returns: text


def greet(name: str, times: int = 1) -> str:
    """Say hello."""
    return name * times


def test_list_of_callables_and_namespace():
    report = LoadReport()
    [tool] = load_tools([greet], namespace="demo", report=report)
    assert (tool.id, tool.name, tool.namespace, tool.description) == ("demo.greet", "greet", "demo", "Say hello.")
    assert tool.returns == {"type": "string"}
    assert report.format == "python"


def test_module_attr_source(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    sys.modules.pop("tools_module", None)
    one = load_tools("tools_module:convert")
    assert [t.name for t in one] == ["convert"]
    whole = load_tools("tools_module", format="python")
    assert [t.name for t in whole] == ["get_forecast", "search_flights", "convert"]


def test_tools_list_in_a_module_wins(tmp_path):
    path = tmp_path / "mytools.py"
    path.write_text("def a():\n    '''A.'''\n\ndef b():\n    '''B.'''\n\nTOOLS = [b]\n")
    assert [t.name for t in load_tools(path)] == ["b"]


def test_partial_and_bound_method():
    class Store:
        def find(self, sku: str, limit: int = 5) -> list[str]:
            """Find products."""
            return []

    tools = parse_tools([Store().find, functools.partial(greet, times=2)], format="python")
    assert [t.name for t in tools] == ["find", "greet"]
    assert tools[0].parameters["properties"] == {"sku": {"type": "string"},
                                                 "limit": {"type": "integer", "default": 5}}
    assert tools[1].parameters["properties"]["times"] == {"type": "integer", "default": 2}


def test_lambda_is_rejected_with_a_reason():
    with pytest.raises(CatalogError, match=r"<object>: \[0\]: a lambda has no name"):
        parse_tools([lambda x: x], format="python")


def test_import_failure_is_a_catalog_error(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(CatalogError, match=r"broken.py: running the module failed \(RuntimeError: boom\)"):
        load_tools(path)
    with pytest.raises(CatalogError, match="cannot import module 'no_such_module_xyz'"):
        load_tools("no_such_module_xyz:f")


# ------------------------------------------------------------------------------------ type mapping

class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Point(TypedDict):
    x: float
    y: float


@dataclasses.dataclass
class Box:
    label: str
    size: int = 1


@pytest.mark.parametrize("tp, expected", [
    (str, {"type": "string"}), (int, {"type": "integer"}), (float, {"type": "number"}),
    (bool, {"type": "boolean"}), (dict, {"type": "object"}), (list, {"type": "array"}), (Any, {}),
    (list[int], {"type": "array", "items": {"type": "integer"}}),
    (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
    (set[str], {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
    (dict[str, Any], {"type": "object"}),
    (Optional[str], {"type": ["string", "null"]}),
    (Union[int, str], {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
    (list[int] | None, {"type": ["array", "null"], "items": {"type": "integer"}}),
    (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
    (Literal[1, "a"], {"enum": [1, "a"]}),
    (Color, {"type": "integer", "enum": [1, 2]}),
    (Annotated[str, "A city name"], {"type": "string", "description": "A city name"}),
    (Point, {"type": "object", "title": "Point", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
             "required": ["x", "y"]}),
    (Box, {"type": "object", "title": "Box", "properties": {"label": {"type": "string"}, "size": {"type": "integer"}},
           "required": ["label"]}),
])
def test_type_schema(tp, expected):
    assert type_schema(tp) == expected


def test_pydantic_field_description_in_annotated():
    from pydantic import Field

    assert type_schema(Annotated[int, Field(description="How many")]) == {"type": "integer",
                                                                          "description": "How many"}


def test_docstring_styles_parse_the_same_facts():
    google = parse_docstring("Add numbers.\n\nArgs:\n    a (int): First.\n    b: Second,\n        continued.\n"
                             "\nReturns:\n    int: The sum.\n")
    numpy = parse_docstring("Add numbers.\n\nParameters\n----------\na : int\n    First.\nb : int\n    Second,\n"
                            "    continued.\n\nReturns\n-------\nint\n    The sum.\n")
    rest = parse_docstring("Add numbers.\n\n:param int a: First.\n:param b: Second,\n    continued.\n"
                           ":returns: The sum.\n")
    for doc in (google, numpy, rest):
        assert doc.description == "Add numbers."
        assert doc.params == {"a": "First.", "b": "Second, continued."}
        assert doc.returns == "The sum."



def test_a_module_level_lambda_is_left_out_with_a_warning(tmp_path):
    module = tmp_path / "helpers.py"
    module.write_text('normalize = lambda s: s.strip().lower()\n\n\ndef get_weather(city: str) -> dict:\n'
                      '    """Get the weather forecast for a city."""\n')
    report = LoadReport()
    assert [t.name for t in load_tools(module, report=report)] == ["get_weather"]
    assert report.warnings == [f"{module}: normalize is a lambda, not a function defined with def: not taken as a "
                               "tool"]


# ------------------------------------------------------------------ pydantic models inside parameters

def check(schema: dict, instance: Any) -> None:
    """jsonschema's verdict: a ref that points nowhere raises its own error, not a ValidationError."""
    pytest.importorskip("jsonschema").validate(instance, schema)


@pytest.fixture(scope="module")
def pydantic_tools():
    pytest.importorskip("pydantic")
    return {t.name: t for t in load_tools(FIXTURES / "pydantic_tools.py")}


def test_nested_and_recursive_pydantic_models_give_self_contained_schemas(pydantic_tools):
    jsonschema = pytest.importorskip("jsonschema")
    tool = pydantic_tools["create_customers"]
    rome = {"name": "A", "address": {"city": "Rome"}}
    tree = {"name": "root", "children": [{"name": "leaf", "children": []}]}
    check(tool.parameters, {"first": rome, "others": [rome], "tree": tree})
    with pytest.raises(jsonschema.ValidationError, match="'city' is a required property"):
        check(tool.parameters, {"first": {"name": "A", "address": {}}, "others": []})
    with pytest.raises(jsonschema.ValidationError, match="'name' is a required property"):
        check(tool.parameters, {"first": rome, "others": [], "tree": {"name": "r", "children": [{}]}})
    check(tool.returns, [rome])  # the return type's definitions are at its own root
    with pytest.raises(jsonschema.ValidationError, match="'city' is a required property"):
        check(tool.returns, [{"name": "A", "address": {"town": "Rome"}}])


def test_two_different_models_of_one_name_keep_their_own_definitions(pydantic_tools):
    jsonschema = pytest.importorskip("jsonschema")
    tool = pydantic_tools["move"]
    customer = {"name": "A", "address": {"city": "Rome"}}
    check(tool.parameters, {"customer": customer, "to": {"address": {"street": "Via Roma"}}})
    with pytest.raises(jsonschema.ValidationError, match="'street' is a required property"):
        check(tool.parameters, {"customer": customer, "to": {"address": {"city": "Rome"}}})


def test_a_default_that_holds_a_defs_key_is_data_and_stays_as_written(pydantic_tools):
    """Lifting definitions walks schemas, not the values a schema holds: a default with a "$defs" key was
    emptied and its content lifted into the tool's definitions (where 1 is no schema)."""
    jsonschema = pytest.importorskip("jsonschema")
    tool = pydantic_tools["configure"]
    assert tool.parameters["properties"]["options"]["default"] == {"$defs": {"keep": 1}}
    jsonschema.Draft202012Validator.check_schema(tool.parameters)
    check(tool.parameters, {"customer": {"name": "A", "address": {"city": "Rome"}}})
