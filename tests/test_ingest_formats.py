"""OpenAI, Anthropic, MCP and benchmark-JSONL catalogs parse to exactly the expected Tools; detection."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from toolscout.errors import CatalogError
from toolscout.ingest import FORMATS, LoadReport, load_tools, parse_tools
from toolscout.ingest.detect import detect_format
from toolscout.tool import Tool

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def load(name: str, **kwargs):
    report = LoadReport()
    tools = load_tools(FIXTURES / name, report=report, **kwargs)
    return tools, report


def test_formats_constant():
    assert FORMATS == ("openai", "anthropic", "mcp", "openapi", "python", "jsonl")


# ---------------------------------------------------------------------------------------- OpenAI

def test_openai_chat_completions_tools():
    tools, report = load("openai_chat.json")
    assert report.format == "openai" and report.loaded == 2 and report.skipped == []
    weather, email = tools
    assert weather == Tool(
        id="get_weather", name="get_weather", description="Get the current weather for a city.",
        parameters={"type": "object",
                    "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"], "additionalProperties": False})
    assert weather.raw["function"]["strict"] is True  # the original object is kept
    assert email.tags == ("mail",)
    assert email.examples == ("send_email(to='a@b.c', body='hi')",)
    assert email.parameters["required"] == ["to"]


def test_openai_responses_flat_form_skips_builtin_tools():
    tools, report = load("openai_responses.json")
    assert [t.id for t in tools] == ["lookup_order", "list_orders"]
    assert tools[0].parameters == {"type": "object", "properties": {"order_id": {"type": "string"}},
                                   "required": ["order_id"]}
    assert tools[1].parameters is None and tools[1].description == ""
    assert len(report.skipped) == 1
    position, message = report.skipped[0]
    assert position == "[1]" and "web_search_preview" in message


def test_openai_legacy_functions():
    tools, report = load("openai_legacy.json")
    assert report.format == "openai"
    assert [(t.id, t.description) for t in tools] == [("get_time", "Current time in a timezone."), ("ping", "")]


def test_openai_single_object_and_namespace():
    tool = {"type": "function", "function": {"name": "f", "description": "Does f."}}
    [parsed] = parse_tools(tool, namespace="utils")
    assert (parsed.id, parsed.name, parsed.namespace) == ("utils.f", "f", "utils")


def test_summary_and_description_are_joined():
    [tool] = parse_tools([{"name": "a", "summary": "Find pets", "description": "Searches by tag."}], format="openai")
    assert tool.description == "Find pets. Searches by tag."
    [same] = parse_tools([{"name": "a", "summary": "Find pets", "description": "Find pets by tag."}], format="openai")
    assert same.description == "Find pets by tag."  # not repeated


def test_field_aliases_map_to_one_tool_field():
    row = {"name": "lookup", "description": "Look up a word.", "args_schema": {"type": "object", "properties": {}},
           "output_schema": {"type": "string"}, "categories": ["reference", "language"],
           "example_usage": "lookup(word='tool')", "limitations": ["English only", "no slang"]}
    [tool] = parse_tools([row], format="openai")
    assert tool.parameters == {"type": "object", "properties": {}}
    assert tool.returns == {"type": "string"}
    assert tool.tags == ("reference", "language")
    assert tool.examples == ("lookup(word='tool')",)
    assert tool.limitations == "English only; no slang"


# ---------------------------------------------------------------------------------------- Anthropic

def test_anthropic_tools_and_server_tool_skipped():
    tools, report = load("anthropic.json")
    assert report.format == "anthropic"
    assert tools == [
        Tool(id="get_stock_price", name="get_stock_price",
             description="Retrieves the current stock price for a given ticker symbol.",
             parameters={"type": "object",
                         "properties": {"ticker": {"type": "string",
                                                   "description": "The stock ticker symbol, e.g. AAPL"}},
                         "required": ["ticker"]}),
        Tool(id="record_summary", name="record_summary", description="Record a summary of an image.",
             parameters={"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}),
    ]
    assert tools[0].raw["cache_control"] == {"type": "ephemeral"}
    assert report.loaded == 2
    [(position, message)] = report.skipped
    assert position == "tools[1]"
    assert "web_search_20250305" in message and "server tool" in message


# ---------------------------------------------------------------------------------------- MCP

def test_mcp_jsonrpc_tools_list():
    tools, report = load("mcp_jsonrpc.json")
    assert report.format == "mcp"
    weather, delete = tools
    assert weather == Tool(
        id="get_weather", name="get_weather", description="Get current weather information for a location",
        parameters={"type": "object",
                    "properties": {"location": {"type": "string", "description": "City name or zip code"}},
                    "required": ["location"]},
        returns={"type": "object", "properties": {"temperature": {"type": "number"}, "conditions": {"type": "string"}},
                 "required": ["temperature", "conditions"]},
        tags=("read-only", "open-world"), title="Weather Information Provider")
    assert weather.raw["title"] == "Weather Information Provider"
    assert weather.raw["annotations"]["readOnlyHint"] is True
    # no description: the title stands in; destructiveHint true → tag
    assert (delete.description, delete.tags, delete.title) == ("Delete a file", ("destructive",), "Delete a file")


def test_mcp_name_collision_across_servers_gives_qualified_ids():
    tools, report = load("mcp_two_servers.json")
    assert [(t.id, t.name, t.namespace) for t in tools] == [
        ("github.search", "search", "github"), ("github.create_issue", "create_issue", "github"),
        ("jira.search", "search", "jira")]
    assert report.skipped == []


@pytest.mark.parametrize("shape", ["list", "servers_list", "servers_mapping", "mapping_of_results"])
def test_mcp_multi_server_shapes(shape):
    gh = [{"name": "search", "inputSchema": {"type": "object"}}]
    fs = [{"name": "search", "inputSchema": {"type": "object"}}, {"name": "read", "inputSchema": {"type": "object"}}]
    obj = {
        "list": [{"server": "github", "tools": gh}, {"name": "fs", "tools": fs}],
        "servers_list": {"servers": [{"server": "github", "tools": gh}, {"server": "fs", "tools": fs}]},
        "servers_mapping": {"servers": {"github": gh, "fs": {"tools": fs}}},
        "mapping_of_results": {"mcpServers": {"github": {"jsonrpc": "2.0", "id": 3, "result": {"tools": gh}},
                                              "fs": {"result": {"tools": fs}}}},
    }[shape]
    assert detect_format(obj) == "mcp"
    assert [t.id for t in parse_tools(obj)] == ["github.search", "fs.search", "fs.read"]


def test_mcp_caller_namespace_applies_to_ungrouped_tools_only():
    report = LoadReport()
    [tool] = parse_tools({"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}, namespace="svc")
    assert tool.id == "svc.t"
    tools = parse_tools([{"server": "a", "tools": [{"name": "t", "inputSchema": {}}]}], namespace="svc", report=report)
    assert tools[0].id == "a.t"
    assert any("namespace 'svc' ignored" in w for w in report.warnings)


# ---------------------------------------------------------------------------------------- JSONL

def test_benchmark_folder_uses_tool_from_row():
    tools, report = load("benchmark")
    assert report.format == "jsonl" and report.source.endswith("tools.jsonl")
    alarm, stock = tools
    assert alarm == Tool(id="bench::AddAlarm", name="AddAlarm", description="Set an alarm at a time.",
                         parameters={"type": "object", "properties": {"time": {"type": "str", "description": "HH:MM"}}},
                         category="alarm")
    assert alarm.raw == {"name": "AddAlarm"}  # the row's doc, as the benchmark loader keeps it
    assert (stock.parameters, stock.limitations) == (None, "Delayed by 15 minutes")


def test_jsonl_file_and_namespace_keep_row_ids():
    tools = load_tools(FIXTURES / "benchmark" / "tools.jsonl", namespace="apps")
    assert [(t.id, t.namespace) for t in tools] == [("bench::AddAlarm", "apps"), ("bench::QueryStock", "apps")]


def test_a_catalog_expand_wrote_reads_back_with_every_field_it_wrote(tmp_path):
    """`toolscout expand` writes `title`, `method` and `path` into its tools.jsonl; reading it back (index, eval)
    dropped them, so an expanded OpenAPI catalog lost each tool's HTTP method and path, and MCP tools their
    titles."""
    from toolscout.benchmark_sets import load_benchmark
    from toolscout.expand.catalog import tool_row

    catalogs = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs"
    written = [t for t in load_tools(catalogs / "petstore_openapi.yaml")][:3] + \
        [t.with_changes(title="Read a file") for t in load_tools(catalogs / "mcp_reference_servers.json")][:1]
    (tmp_path / "tools.jsonl").write_text("".join(json.dumps(tool_row(t)) + "\n" for t in written))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"id": "q", "query": "a pet", "labels": [written[0].id],
                                                        "split": "test"}) + "\n")
    fields = [(t.id, t.title, t.method, t.path) for t in written]
    assert all(method and path for _id, _title, method, path in fields[:3]) and fields[3][1] == "Read a file"
    assert [(t.id, t.title, t.method, t.path) for t in load_tools(tmp_path)] == fields
    assert [(t.id, t.title, t.method, t.path) for t in load_benchmark(tmp_path).tools] == fields
    (tmp_path / "tools.jsonl").write_text(json.dumps({"id": "a", "name": "a", "method": 3}) + "\n")
    with pytest.raises(CatalogError, match="tools.jsonl:1: field 'method' must be a string or null, got integer"):
        load_tools(tmp_path)


OPENAI_LINES = ('{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",'
                ' "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n'
                '\n'
                '{"type": "function", "function": {"name": "send_mail", "description": "Send an e-mail"}}\n')
MCP_LINES = ('{"name": "read_file", "description": "Read a file", "inputSchema": {"type": "object"}}\n'
             '{"name": "list_dir", "title": "List", "annotations": {"readOnlyHint": true}}\n')
ANTHROPIC_LINES = '{"name": "search", "description": "Search the web", "input_schema": {"type": "object"}}\n'


@pytest.mark.parametrize("lines, expected", [(OPENAI_LINES, "openai"), (MCP_LINES, "mcp"),
                                             (ANTHROPIC_LINES, "anthropic")])
def test_a_jsonl_file_of_tool_definitions_is_read_one_tool_per_line(tmp_path, lines, expected):
    # it was taken for benchmark rows ("field 'id' must be a non-empty string")
    path = tmp_path / "tools.jsonl"
    path.write_text(lines)
    report = LoadReport()
    tools = load_tools(path, report=report)
    assert report.format == expected
    assert tools == parse_tools([json.loads(line) for line in lines.splitlines() if line], format=expected)
    assert load_tools(path, format=expected) == tools  # as --format reads it (it was "invalid JSON (Extra data)")


def test_a_line_of_a_jsonl_file_that_is_not_a_tool_is_named_by_its_line(tmp_path):
    path = tmp_path / "tools.jsonl"
    path.write_text(OPENAI_LINES + '{"type": "function", "function": {"description": "no name"}}\n[1]\n')
    with pytest.raises(CatalogError, match=r"tools.jsonl:4: tool.function: field 'name' is missing"):
        load_tools(path)
    report = LoadReport()
    assert [t.name for t in load_tools(path, lenient=True, report=report)] == ["get_weather", "send_mail"]
    assert [message.split(": ")[0] for _, message in report.skipped] == [f"{path}:4", f"{path}:5"]
    assert report.skipped[1][1] == f"{path}:5: expected a JSON object, got array"
    with pytest.raises(CatalogError, match=r"tools.jsonl:1: expected a 'tools' list .* or one tool object"):
        load_tools(path, format="mcp")  # an OpenAI line is no MCP tool


def test_a_gateway_config_given_as_a_catalog_points_to_indexing_its_servers_with_mcp_command(tmp_path):
    """`toolscout index servers.json` of an mcpServers file that launches servers (a gateway's config) said only
    "expected a 'tools' list" (trial 11); it says what the file is and how to index those servers."""
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone=UTC"]},
        "remote": {"url": "https://h.example/mcp"}}}))
    with pytest.raises(CatalogError) as err:
        load_tools(path)
    assert str(err.value).startswith(f"{path}: mcpServers.time: this is how to launch or reach a server (a gateway "
                                     "config, or a host's mcp.json), not its tools"), str(err.value)
    assert "toolscout index 'mcp:uvx mcp-server-time --local-timezone=UTC' --out DIR" in str(err.value)
    assert "toolscout gateway FILE" in str(err.value)
    path.write_text(json.dumps({"mcpServers": {"remote": {"url": "https://h.example/mcp"}}}))
    with pytest.raises(CatalogError, match="toolscout index https://h.example/mcp --out DIR"):
        load_tools(path)


def test_a_jsonl_line_in_another_format_than_the_first_line_is_refused_naming_both_lines(tmp_path):
    """A JSON list of mixed formats is refused; a JSONL file was read as its first line's format, whatever
    the order: an OpenAI line after an Anthropic one was skipped as an "Anthropic server tool 'function'"."""
    path = tmp_path / "tools.jsonl"
    path.write_text(ANTHROPIC_LINES + OPENAI_LINES)
    with pytest.raises(CatalogError) as refused:
        load_tools(path)
    assert str(refused.value).startswith(f"{path}:2: this line is an OpenAI tool, but the file reads as anthropic "
                                         f"from its first line ({path}:1); a JSONL file holds one format")
    path.write_text(OPENAI_LINES + ANTHROPIC_LINES + MCP_LINES)  # the other order was read whole
    with pytest.raises(CatalogError, match=rf"tools.jsonl:4: this line is an Anthropic tool, but the file reads "
                                           rf"as openai from its first line \({re.escape(str(path))}:1\)"):
        load_tools(path)
    report = LoadReport()
    assert [t.name for t in load_tools(path, lenient=True, report=report)] == ["get_weather", "send_mail"]
    assert [message.split(": ")[0] for _, message in report.skipped] == [f"{path}:{n}" for n in (4, 5, 6)]
    assert "this line is an MCP tool" in report.skipped[1][1]
    # a named format reads every line as that format, as before
    assert [t.name for t in load_tools(path, format="openai")] == ["get_weather", "send_mail", "search",
                                                                   "read_file", "list_dir"]
    # a tool with no schema (a name and a description) is every format's: it belongs to the file's
    bare = json.dumps({"name": "ping", "description": "Check that the service answers"}) + "\n"
    for lines in (ANTHROPIC_LINES, MCP_LINES):
        path.write_text(lines + bare)
        assert [t.name for t in load_tools(path)][-1] == "ping"


def test_jsonl_rows_in_memory_and_parameter_aliases():
    rows = [{"id": "x1", "name": "X", "category": "c", "input_schema": {"type": "object", "properties": {}}}]
    [tool] = parse_tools(rows)
    assert tool.parameters == {"type": "object", "properties": {}} and tool.category == "c"


# ---------------------------------------------------------------------------------------- detection

@pytest.mark.parametrize("name, expected", [
    ("openai_chat.json", "openai"), ("openai_responses.json", "openai"), ("openai_legacy.json", "openai"),
    ("anthropic.json", "anthropic"), ("mcp_jsonrpc.json", "mcp"), ("mcp_two_servers.json", "mcp"),
    ("openapi_pets.yaml", "openapi"), ("swagger2.json", "openapi"), ("duplicate_ids.json", "mcp"),
    ("params_not_object.json", "anthropic"), ("missing_name.json", "openai"),
])
def test_detection_on_fixture_objects(name, expected):
    path = FIXTURES / name
    text = path.read_text()
    if path.suffix == ".json":
        obj = json.loads(text)
    else:
        import yaml

        obj = yaml.safe_load(text)
    assert detect_format(obj, name) == expected


@pytest.mark.parametrize("path, expected", [
    ("benchmark", "jsonl"), ("benchmark/tools.jsonl", "jsonl"), ("tools_module.py", "python"),
    ("openapi_pets.yaml", "openapi"), ("mcp_two_servers.json", "mcp"),
])
def test_detection_on_paths(path, expected):
    report = LoadReport()
    load_tools(FIXTURES / path, report=report)
    assert report.format == expected


def test_detection_of_single_items():
    assert detect_format([{"name": "a", "description": "b"}]) == "openai"
    assert detect_format([{"name": "a", "inputSchema": {}}]) == "mcp"
    assert detect_format([{"name": "a", "input_schema": {}}]) == "anthropic"
    assert detect_format([{"type": "bash_20250124", "name": "bash"}]) == "anthropic"
    assert detect_format([{"id": "x", "name": "a", "doc": {}}]) == "jsonl"
    assert detect_format([len]) == "python"
    assert detect_format({"openapi": "3.1.0", "paths": {}}) == "openapi"


def test_explicit_format_overrides_detection():
    # only name/description: detected as OpenAI, but the caller may say it is Anthropic
    report = LoadReport()
    [tool] = parse_tools([{"name": "a", "description": "b"}], format="anthropic", report=report)
    assert report.format == "anthropic" and tool.parameters is None


def test_report_accumulates_over_loads():
    report = LoadReport()
    load_tools(FIXTURES / "openai_chat.json", report=report)
    load_tools(FIXTURES / "anthropic.json", report=report)
    assert report.loaded == 4 and len(report.skipped) == 1 and report.format == "anthropic"
    assert "anthropic.json: 4 tools (anthropic), 1 skipped" in report.summary()


def test_toolscout_load_tools_is_the_same_function():
    import toolscout

    assert toolscout.load_tools is load_tools


def test_a_live_servers_listing_keeps_a_schema_the_catalog_rule_refuses_unless_it_is_no_object():
    """The gateway reads its upstreams' listings `as_served`: a property that is not a schema is the server's
    business (kept, with a warning); a schema that is not an object cannot take arguments (skipped)."""
    from toolscout.ingest import LoadReport, parse_tools

    listing = {"tools": [
        {"name": "geocode", "description": "Coordinates of an address",
         "inputSchema": {"type": "object", "properties": {"address": "string"}}},
        {"name": "scalar", "description": "Takes a bare string", "inputSchema": {"type": "string"}}]}
    report = LoadReport()
    tools = parse_tools(listing, format="mcp", lenient=True, namespace="maps", report=report, as_served=True)
    assert [t.id for t in tools] == ["maps.geocode"]
    assert tools[0].parameters == {"type": "object", "properties": {"address": "string"}}
    assert report.warnings == ["<object>: tools[0].inputSchema.properties.address: must be a JSON schema (an "
                               "object, or true/false), got string (kept as the server gave it)"]
    assert [position for position, _message in report.skipped] == ["tools[1]"]
    catalog = LoadReport()  # the same listing given as a catalog to index: both are refused
    assert parse_tools(listing, format="mcp", lenient=True, namespace="maps", report=catalog) == []
    assert len(catalog.skipped) == 2
