"""Malformed catalogs: CatalogError names file, position and field; lenient mode skips exactly the bad tool."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from toolscout.errors import CatalogError
from toolscout.ingest import LoadReport, load_tools, parse_tools

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def error_of(name: str, **kwargs) -> str:
    with pytest.raises(CatalogError) as info:
        load_tools(FIXTURES / name, **kwargs)
    return str(info.value)


def test_json_syntax_error_has_line_and_column():
    message = error_of("bad_syntax.json")
    assert "bad_syntax.json: line 3, column 38: invalid JSON" in message


def test_yaml_syntax_error_has_line_and_column():
    message = error_of("bad_syntax.yaml")
    assert "bad_syntax.yaml: line 7, column 1: invalid YAML" in message
    assert "opened at line 6, column 10" in message


def test_syntax_errors_raise_even_in_lenient_mode():
    for name in ("bad_syntax.json", "bad_syntax.yaml"):
        with pytest.raises(CatalogError, match="invalid (JSON|YAML)"):
            load_tools(FIXTURES / name, lenient=True)


DUPLICATE_PATHS_YAML = """openapi: 3.0.0
info: {title: DK}
x-base: &base {summary: shared, operationId: base}
paths:
  /pets:
    get: {operationId: listPets}
  /users:
    get: {<<: *base, operationId: listUsers}
  /pets:
    post: {operationId: createPet}
"""


def test_a_key_written_twice_is_refused_with_both_places(tmp_path):
    spec = tmp_path / "merged.yaml"
    spec.write_text(DUPLICATE_PATHS_YAML)
    with pytest.raises(CatalogError) as info:
        load_tools(spec, lenient=True)  # not a bad tool: the file itself says two things
    assert str(info.value) == (f"{spec}: line 9, column 3: duplicate key '/pets' (first at line 5, column 3); "
                               "a key may appear once in an object: merge the two entries")
    spec.write_text(DUPLICATE_PATHS_YAML.replace("  /pets:\n    post", "  /kittens:\n    post"))
    assert [t.name for t in load_tools(spec)] == ["listPets", "listUsers", "createPet"]  # a merge key overrides

    tools = tmp_path / "tools.json"
    tools.write_text('{"tools": [{"name": "a", "inputSchema": {"type": "object"},\n  "name": "b"}]}')
    with pytest.raises(CatalogError, match=r"tools.json: line 2, column 3: duplicate key 'name' \(first at line 1, "
                                           r"column 13\); a key may appear once"):
        load_tools(tools)
    tools.write_text('{"tools": [{"name": "a", "inputSchema": {"name": "a"}}, {"name": "b", "inputSchema": {}}]}')
    assert [t.name for t in load_tools(tools)] == ["a", "b"]  # one key in several objects is no duplicate


def test_missing_name_names_file_position_and_field():
    message = error_of("missing_name.json")
    assert message.startswith(f"{FIXTURES / 'missing_name.json'}: tools[1].function: field 'name' is missing")


def test_parameters_not_an_object():
    message = error_of("params_not_object.json")
    assert message.endswith("params_not_object.json: [1].input_schema: field 'input_schema' must be a JSON schema "
                            "object, got array")


def test_parameters_of_another_type_than_object():
    with pytest.raises(CatalogError, match=r"t.json: tools\[0\].function.parameters.type: must be 'object' \(tool "
                                           r"arguments are one JSON object\), got 'string'"):
        parse_tools({"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}]},
                    source="t.json")


def test_parameters_are_checked_by_one_rule_in_every_format(tmp_path):
    openai = tmp_path / "openai.json"
    openai.write_text(json.dumps([{"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}, "n": "integer"}}}}]))
    with pytest.raises(CatalogError) as info:
        load_tools(openai)
    assert str(info.value) == (f"{openai}: [0].function.parameters.properties.n: must be a JSON schema (an object, "
                               "or true/false), got string")
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"tools": [{"name": "a", "inputSchema": {"properties": [1, 2]}}]}))
    with pytest.raises(CatalogError, match=r"mcp.json: tools\[0\].inputSchema.properties: must be an object mapping"):
        load_tools(mcp)
    rows = tmp_path / "tools.jsonl"
    rows.write_text(json.dumps({"id": "a", "name": "a", "parameters": {"properties": {}, "required": "q"}}) + "\n")
    with pytest.raises(CatalogError, match=r"tools.jsonl:1: field 'parameters.required' must be a list of argument "
                                           r"names \(strings\), got string"):
        load_tools(rows)
    spec = {"openapi": "3.0.0", "info": {"title": "T"}, "paths": {"/h": {"post": {
        "operationId": "h", "requestBody": {"content": {"application/json": {"schema": "oops"}}}}}}}
    with pytest.raises(CatalogError, match=r"^s.json: paths./h.post.requestBody.content.application/json.schema: a "
                                           r"schema must be a JSON schema object \(or true/false\), got string"):
        parse_tools(spec, source="s.json")
    spec["paths"]["/h"]["post"] = {"operationId": "h", "parameters": [{"name": "q", "in": "query", "schema": 5}]}
    with pytest.raises(CatalogError, match=r"paths./h.post.parameters\[0\].schema: a schema must be a JSON schema"):
        parse_tools(spec, source="s.json")


def test_openapi_broken_ref():
    message = error_of("broken_ref.yaml")
    assert "broken_ref.yaml: paths./pets.post.requestBody.content.application/json.schema.$ref: " in message
    assert "broken $ref '#/components/schemas/Missing'" in message


def test_jsonl_bad_line_names_the_line():
    message = error_of("bad_line.jsonl")
    assert message == f"{FIXTURES / 'bad_line.jsonl'}:3: invalid JSON (Expecting ',' delimiter at column 58)"


def test_undetectable_format_lists_formats_and_flag():
    message = error_of("undetectable.json")
    assert "undetectable.json: cannot tell which tool format this is" in message
    assert "openai, anthropic, mcp, openapi, python, jsonl" in message and "--format" in message


def test_tool_objects_are_sent_to_from_tools_not_asked_for_a_format():
    """load_tools([Tool(...)]) said it could not tell the format and to pass format=, which no format fits."""
    from toolscout import Tool

    with pytest.raises(CatalogError, match=r"^<object>: \[1\]: is a toolscout Tool already, not a catalog entry "
                                           r"to read; give Tool objects to ToolScout.from_tools\(tools\)"):
        load_tools([{"name": "a", "inputSchema": {}}, Tool("b", "b", "B")])


def test_mixed_formats_are_not_guessed():
    with pytest.raises(CatalogError, match=r"look like different formats: mcp \(\[0\]\), anthropic \(\[1\]\)"):
        parse_tools([{"name": "a", "inputSchema": {}}, {"name": "b", "input_schema": {}}])


def test_unknown_format_name():
    with pytest.raises(CatalogError, match=r"unknown catalog format 'yaml'; known: openai, anthropic, mcp, "
                                           r"openapi, python, jsonl \(CLI: --format NAME\)"):
        load_tools(FIXTURES / "openai_chat.json", format="yaml")


def test_missing_file():
    with pytest.raises(CatalogError, match="nope.json: no such file or folder"):
        load_tools("nope.json")


def test_folder_without_tools_jsonl(tmp_path):
    with pytest.raises(CatalogError, match="a folder must hold a benchmark tools.jsonl"):
        load_tools(tmp_path)


# ------------------------------------------------------------------------------------ lenient mode

def test_lenient_skips_exactly_the_bad_tool():
    report = LoadReport()
    tools = load_tools(FIXTURES / "missing_name.json", lenient=True, report=report)
    assert [t.id for t in tools] == ["ok_tool", "another_ok_tool"]
    assert report.loaded == 2
    [(position, message)] = report.skipped
    assert position == "tools[1]" and "field 'name' is missing" in message


def test_lenient_jsonl_skips_bad_lines_and_goes_on():
    report = LoadReport()
    tools = load_tools(FIXTURES / "bad_line.jsonl", lenient=True, report=report)
    assert [t.id for t in tools] == ["a", "b", "e"]
    assert [position for position, _ in report.skipped] == ["line 3", "line 4"]
    assert "bad_line.jsonl:4: field 'parameters' must be an object or null, got array" in report.skipped[1][1]


def test_lenient_openapi_skips_the_operation_with_the_broken_ref():
    report = LoadReport()
    tools = load_tools(FIXTURES / "broken_ref.yaml", lenient=True, report=report)
    assert [t.id for t in tools] == ["broken-refs.listPets"]
    assert [position for position, _ in report.skipped] == ["paths./pets.post"]


BAD_PATH_ITEMS_YAML = """openapi: 3.0.0
info: {title: Items}
paths:
  /good:
    get: {operationId: listGood}
  /d: "notanobject"
  /x: {$ref: '#/paths/~1y'}
  /y: {$ref: '#/paths/~1x'}
  /z: {$ref: '#/components/pathItems/Nope'}
  /after:
    get: {operationId: listAfter}
"""


def test_lenient_openapi_skips_a_malformed_path_item_and_reports_it(tmp_path):
    spec = tmp_path / "items.yaml"
    spec.write_text(BAD_PATH_ITEMS_YAML)
    report = LoadReport()
    tools = load_tools(spec, lenient=True, report=report)
    assert [t.name for t in tools] == ["listGood", "listAfter"]
    skipped = dict(report.skipped)
    assert list(skipped) == ["paths./d", "paths./x", "paths./y", "paths./z"]
    assert skipped["paths./d"] == f"{spec}: paths./d: a path item must be an object, got string"
    assert "refers to itself in a loop" in skipped["paths./x"]
    assert "broken $ref '#/components/pathItems/Nope'" in skipped["paths./z"]
    with pytest.raises(CatalogError, match=r"items.yaml: paths./d: a path item must be an object, got string"):
        load_tools(spec)


def test_lenient_anthropic_bad_schema():
    report = LoadReport()
    tools = load_tools(FIXTURES / "params_not_object.json", lenient=True, report=report)
    assert [t.id for t in tools] == ["fine"] and report.skipped[0][0] == "[1]"


def test_structure_errors_still_raise_in_lenient_mode():
    with pytest.raises(CatalogError, match=r"x.json: tools: expected a list of tools, got string"):
        parse_tools({"tools": "oops"}, lenient=True, source="x.json")


# ------------------------------------------------------------------------------------ ids

def test_true_duplicate_names_both_positions():
    message = error_of("duplicate_ids.json")
    assert "duplicate_ids.json: tools[2]: duplicate tool id 'search', already defined at tools[0]" in message


def test_lenient_duplicate_keeps_the_first():
    report = LoadReport()
    tools = load_tools(FIXTURES / "duplicate_ids.json", lenient=True, report=report)
    assert [(t.id, t.description) for t in tools] == [("search", "first"), ("fetch", "other")]
    assert report.skipped[0][0] == "tools[2]"


def test_duplicate_operation_ids_in_openapi_fall_back_to_method_and_path():
    spec = {"openapi": "3.0.0", "info": {"title": "Dup"}, "paths": {
        "/a": {"get": {"operationId": "op", "responses": {}}},
        "/b": {"get": {"operationId": "op", "responses": {}}}}}
    report = LoadReport()
    assert [t.id for t in parse_tools(spec, report=report)] == ["dup.op", "dup.GET /b"]
    assert "paths./b.get: operationId 'op' is already the id of paths./a.get" in report.warnings[0]


def test_same_name_in_two_namespaces_is_never_dropped():
    servers = {"servers": {"a": [{"name": "run", "inputSchema": {}}], "b": [{"name": "run", "inputSchema": {}}]}}
    assert [t.id for t in parse_tools(servers)] == ["a.run", "b.run"]


def test_jsonrpc_error_response():
    with pytest.raises(CatalogError, match=r"r.json: error: the JSON-RPC response is an error: Method not found"):
        parse_tools({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}},
                    source="r.json")


def test_mcp_server_entry_without_a_name():
    with pytest.raises(CatalogError, match=r"\[1\]: a server entry needs a 'server' or 'name' string"):
        parse_tools([{"server": "a", "tools": []}, {"tools": [{"name": "x", "inputSchema": {}}]}], format="mcp")


def test_a_format_given_that_fails_says_which_format_the_catalog_reads_as(tmp_path):
    """`--format mcp` on an OpenAI file blamed a missing 'name', as if the file were a broken MCP listing."""
    openai_file = tmp_path / "openai.json"
    openai_file.write_text(json.dumps([{"type": "function", "function": {"name": "get_weather"}}]))
    with pytest.raises(CatalogError) as info:
        load_tools(openai_file, format="mcp")
    assert str(info.value) == (f"{openai_file}: it reads as openai, not mcp: pass format='openai' or none (CLI: "
                               f"--format openai, or no --format); read as mcp, it fails: {openai_file}: [0]: field "
                               "'name' is missing; every tool needs a name")
    lines = tmp_path / "tools.jsonl"  # one tool a line: its first line tells
    lines.write_text(json.dumps({"type": "function", "function": {"name": "get_weather"}}) + "\n")
    with pytest.raises(CatalogError, match=rf"^{re.escape(str(lines))}: line 1 reads as openai, not mcp: pass "
                                           r"format='openai' or none .*; read as mcp, it fails: .*tools.jsonl:1: "):
        load_tools(lines, format="mcp")
    # a first line that shows no format (not JSON, or no tool) is the parser's error alone: it read as "jsonl"
    lines.write_text("{not json\n")
    with pytest.raises(CatalogError, match=rf"^{re.escape(str(lines))}:1: invalid JSON"):
        load_tools(lines, format="openai")


def test_a_csv_file_is_said_to_be_no_catalog_format_and_the_formats_are_listed(tmp_path):
    table = tmp_path / "tools.csv"
    table.write_text("name,description\nfoo,Do foo\n")
    with pytest.raises(CatalogError) as info:
        load_tools(table)
    assert str(info.value) == (
        f"{table}: not a tool catalog: expected a JSON or YAML object or list of tools, got string (a .csv file is "
        "not a catalog format; it was read as YAML). Catalogs toolscout reads: OpenAI or Anthropic tools (JSON, "
        "YAML, or JSONL one tool a line), an MCP tools/list or server file, an OpenAPI 3 or Swagger 2 spec (JSON or "
        "YAML), benchmark rows (tools.jsonl, or its folder), or Python callables (a .py file, or "
        "'package.module:attr')")


def test_a_format_given_that_reads_no_tool_says_which_format_the_catalog_reads_as():
    # an OpenAI list read as Anthropic's: each entry is skipped as a server tool, which names the wrong
    # format; the report also says the format it reads as. A format that reads it, or a catalog of none, says
    # nothing more
    openai_list = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                     "parameters": {"type": "object", "properties": {}}}}]
    report = LoadReport()
    assert parse_tools(openai_list, format="anthropic", source="a.json", report=report) == []
    assert report.warnings[-1] == ("a.json: it reads as openai, not anthropic: pass format='openai' or none "
                                   "(CLI: --format openai, or no --format)")
    report = LoadReport()
    assert [t.name for t in parse_tools(openai_list, format="openai", report=report)] == ["get_weather"]
    assert report.warnings == []
    report = LoadReport()
    assert parse_tools({"tools": []}, format="anthropic", report=report) == [] and len(report.warnings) == 1
