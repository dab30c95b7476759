"""Agent adapters: Anthropic client-side tool search (tool_reference), OpenAI Responses client-mode tool
search (tool_search_output), function lists in and out, LangChain tools in and out, agent-safe names."""

import json

import pytest

from toolscout import Tool, ToolScout
from toolscout.adapters import (
    NAME_PATTERN,
    AgentNames,
    AnthropicToolSearch,
    OpenAIToolSearch,
    from_anthropic,
    from_langchain,
    from_openai,
    json_schema,
    select_langchain,
    to_anthropic,
    to_openai,
)


@pytest.fixture
def scout(tools):
    extra = [Tool("github.search", "search", "Search code in GitHub repositories.", namespace="github"),
             Tool("jira.search", "search", "Search issues in the Jira tracker.", namespace="jira"),
             Tool("odd.name", "files/list.all v2", "List every file in a folder.", namespace="odd")]
    return ToolScout.from_tools(tools + extra, retriever="bm25")


def test_anthropic_client_side_tool_search(scout):
    search = AnthropicToolSearch(scout, k=3)
    tool = search.tool()
    assert tool["name"] == "tool_search" and tool["input_schema"]["required"] == ["query"]
    deferred = search.deferred_tools()
    assert len(deferred) == len(scout) and all(d["defer_loading"] is True for d in deferred)
    assert all(NAME_PATTERN.match(d["name"]) for d in deferred)

    block = {"type": "tool_use", "id": "toolu_01", "name": "tool_search",
             "input": {"query": "weather forecast for Oslo", "limit": 2}}
    assert search.is_call(block)
    result = search.answer(block)
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_01"
    assert result["content"][0] == {"type": "tool_reference", "tool_name": "get_forecast"}
    assert len(result["content"]) == 2
    names = {d["name"] for d in deferred}
    assert all(c["tool_name"] in names for c in result["content"])  # every reference is loadable
    assert search.resolve("get_forecast").id == "weather.get_forecast"

    # same name on two servers: qualified, and both map back to their own tool
    result = search.answer({**block, "input": {"query": "search"}})
    refs = [c["tool_name"] for c in result["content"][:2]]
    assert sorted(refs) == ["github__search", "jira__search"]
    assert search.resolve("jira__search").namespace == "jira"

    none = AnthropicToolSearch(scout, min_score=1000.0).answer({**block, "input": {"query": "fly to the moon"}})
    assert none["content"][0]["type"] == "text"
    assert not search.is_call({"type": "tool_use", "name": "other"})
    with pytest.raises(ValueError):
        search.answer({"type": "tool_use", "name": "other", "input": {}})


class Obj:  # an SDK object instead of a dict
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_openai_client_executed_tool_search(scout):
    search = OpenAIToolSearch(scout, k=2)
    assert search.tool() == {"type": "tool_search", "execution": "client", "description": search.description,
                             "parameters": search.tool()["parameters"]}
    call = {"type": "tool_search_call", "id": "ts_1", "call_id": "call_1", "execution": "client",
            "arguments": json.dumps({"query": "book a hotel room"}), "status": "completed"}
    out = search.answer(call)
    assert {k: out[k] for k in ("type", "call_id", "execution", "status")} == {
        "type": "tool_search_output", "call_id": "call_1", "execution": "client", "status": "completed"}
    first = out["tools"][0]
    assert first == {"type": "function", "name": "book-hotel-room", "parameters": first["parameters"],
                     "description": "Reserve a hotel room in a city for given nights.", "strict": False}
    assert first["parameters"]["properties"]["nights"]["type"] == "string" and len(out["tools"]) == 2

    by_path = search.answer(Obj(type="tool_search_call", call_id="c2", execution="client",
                                arguments={"paths": ["send_email", "jira.search", "nope"]}))
    assert [t["name"] for t in by_path["tools"]] == ["send_email", "jira__search"]

    grouped = OpenAIToolSearch(scout, k=3, group_namespaces=True).answer(
        {**call, "arguments": {"query": "weather forecast and current temperature"}})
    assert grouped["tools"][0]["type"] == "namespace" and grouped["tools"][0]["name"] == "weather"
    assert {t["name"] for t in grouped["tools"][0]["tools"]} >= {"get_forecast", "getCurrentWeather"}


def test_function_lists_out_and_in(scout, tools):
    hits = scout.search("send an email", k=2)
    chat = to_openai(hits, names=AgentNames(scout.tools))
    assert chat[0] == {"type": "function", "function": {"name": "send_email", "description": tools[5].description,
                                                        "parameters": json_schema(tools[5])}}
    responses = to_openai(hits, style="responses", names=AgentNames(scout.tools))
    assert responses[0]["name"] == "send_email" and responses[0]["strict"] is False
    anthropic = to_anthropic(hits)
    assert anthropic[0]["input_schema"]["properties"]["to"]["type"] == "string"

    back = from_openai(chat, namespace="mail2")
    assert [t.id for t in back] == ["mail2.send_email", f"mail2.{hits[1].tool.name}"]
    assert back[0].parameters == json_schema(tools[5])
    assert [t.name for t in from_openai(responses)] == [h.tool.name for h in hits]
    assert from_anthropic(anthropic)[0].description == tools[5].description
    with pytest.raises(ValueError):
        to_openai(hits, style="legacy")


def test_definitions_of_separate_searches_never_give_two_tools_one_name():
    """to_openai/to_anthropic named each call's tools by that call's hits alone: gh.list_issues and
    gl.list_issues were both `list_issues` when each came alone, and fs `files.read` and s3 `files_read` both
    `files_read`, so an agent keeping the functions of several searches called the wrong tool. Without
    `names` a name now depends on the tool alone; one AgentNames of the catalog keeps short names stable."""
    tools = [Tool("gh.list_issues", "list_issues", namespace="gh"), Tool("gl.list_issues", "list_issues", namespace="gl"),
             Tool("fs.read", "files.read", namespace="fs"), Tool("s3.read", "files_read", namespace="s3")]
    for definitions, name_of in ((to_openai, lambda d: d["function"]["name"]), (to_anthropic, lambda d: d["name"])):
        alone = [name_of(definitions([tool])[0]) for tool in tools]
        assert alone[:2] == ["gh__list_issues", "gl__list_issues"] and alone[3] == "s3__files_read"
        assert alone[2].startswith("fs__files_read_") and NAME_PATTERN.match(alone[2])  # squashed: marked
        assert [name_of(d) for d in definitions(tools)] == alone  # the same name in every call
        loose = [Tool("read_a", "files.read", "Read a file"), Tool("read_b", "files_read", "Read an object")]
        apart = [name_of(definitions([tool])[0]) for tool in loose]  # no namespace: squashed alike, unless marked
        assert apart[1] == "files_read" and apart[0].startswith("files_read_") and NAME_PATTERN.match(apart[0])
    names = AgentNames(tools)
    given = [names.name(tool) for tool in [tools[2], tools[0], tools[3], tools[1], *tools]]
    assert len(set(given)) == 4 and [names.tool(n).id for n in given[4:]] == [t.id for t in tools]


def test_names_are_valid_unique_and_reversible():
    tools = [Tool("a.x", "search", namespace="a"), Tool("b.x", "search", namespace="b"),
             Tool("c.y", "get weather/now", namespace="c"), Tool("d.z", "w" * 80, namespace="d"),
             Tool("e.z", "get_weather_now", namespace="e")]
    names = AgentNames(tools)
    given = [names.name(t) for t in tools]
    assert given[:3] == ["a__search", "b__search", "get_weather_now"]
    assert len(given[3]) == 64 and all(NAME_PATTERN.match(n) for n in given)
    assert given[4] != given[2] and len(set(given)) == 5  # squashed to the same name: told apart
    assert [names.tool(n).id for n in given] == [t.id for t in tools]
    with pytest.raises(KeyError):
        names.tool("never_offered")


def test_schemas_are_cleaned_for_provider_apis():
    tool = Tool("t", "t", parameters={"properties": {"a": {"type": "str"}, "b": {"type": "list", "items": {"type": "int"}},
                                                     "c": {"type": ["str", "null"]}, "d": {"type": "any"}}})
    schema = json_schema(tool)
    assert schema["type"] == "object"
    assert schema["properties"] == {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}},
                                    "c": {"type": ["string", "null"]}, "d": {}}
    assert json_schema(Tool("u", "u")) == {"type": "object", "properties": {}}


def test_langchain_tools_in_and_out():
    pydantic = pytest.importorskip("pydantic")

    class WeatherArgs(pydantic.BaseModel):
        city: str = pydantic.Field(description="City name")

    class LCTool:  # the attributes LangChain's BaseTool exposes
        def __init__(self, name, description, args_schema=None):
            self.name, self.description, self.args_schema = name, description, args_schema

    lc = [LCTool("get_weather", "Weather for a city", WeatherArgs),
          LCTool("send_email", "Send an email", {"type": "object", "properties": {"to": {"type": "string"}}}),
          LCTool("noop", "Does nothing")]
    tools = from_langchain(lc, namespace="lc")
    assert [t.id for t in tools] == ["lc.get_weather", "lc.send_email", "lc.noop"]
    assert tools[0].parameters["properties"]["city"]["description"] == "City name" and tools[2].parameters is None
    assert tools[0].raw is lc[0]
    scout = ToolScout.from_tools(tools, retriever="bm25")
    picked = select_langchain(scout.search("weather in Paris", k=2), lc)
    assert picked[0] is lc[0]
    with pytest.raises(ValueError, match="same name"):
        from_langchain([lc[0], lc[0]])


def test_a_service_backend_keeps_the_principal_s_namespaces(tmp_path, tools):
    from toolscout.serve import Principal, ToolService

    ToolScout.from_tools(tools, retriever="bm25").save(tmp_path / "idx")
    with ToolService.open(tmp_path / "idx", fsync=False) as service:
        mail = Principal("mail", frozenset({"mail"}))
        search = AnthropicToolSearch(service, principal=mail)
        assert {d["name"] for d in search.deferred_tools()} == {"send_email", "search_inbox"}
        result = search.answer({"type": "tool_use", "id": "t1", "name": "tool_search",
                                "input": {"query": "book a flight and send an email"}})
        assert [c["tool_name"] for c in result["content"]] == ["send_email", "search_inbox"]  # never a travel tool
        out = OpenAIToolSearch(service, principal=mail).answer(
            {"type": "tool_search_call", "call_id": "c", "arguments": {"paths": ["book_flight", "search_inbox"]}})
        assert [t["name"] for t in out["tools"]] == ["search_inbox"]


JSON_API_SPEC = """\
openapi: 3.0.3
info: {title: Tickets, version: "1"}
paths:
  /tickets:
    post:
      operationId: findTickets
      summary: Find tickets by status
      parameters:
        - {name: "filter[status]", in: query, required: true, schema: {type: string}}
        - {name: "page[size]", in: query, schema: {type: integer}}
        - {name: page_size_, in: header, schema: {type: integer}}
      requestBody:
        content:
          application/json:
            schema:
              type: object
              properties:
                "sort by": {type: object, properties: {"field name": {type: string}}, required: ["field name"]}
"""


def test_anthropic_property_keys_are_renamed_to_its_rule_and_calls_map_back(tmp_path):
    import re

    from toolscout.ingest import load_tools

    anthropic_key = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")  # Anthropic's documented rule for property keys

    spec = tmp_path / "tickets.yaml"
    spec.write_text(JSON_API_SPEC)
    [tool] = load_tools(spec)
    search = AnthropicToolSearch(ToolScout.from_tools([tool], retriever="bm25"))
    [definition] = search.deferred_tools()
    schema = definition["input_schema"]
    keys = set(schema["properties"])
    assert {"filter_status_", "page_size_", "sort_by"} <= keys and len(keys) == 4  # page_size_ is a real one
    [hashed] = keys - {"filter_status_", "page_size_", "sort_by"}  # page[size]: its plain form is taken
    assert hashed.startswith("page_size__") and anthropic_key.match(hashed)
    assert schema["required"] == ["filter_status_"]
    assert schema["properties"]["sort_by"]["properties"] == {"field_name": {"type": "string"}}
    assert schema["properties"]["sort_by"]["required"] == ["field_name"]
    call = {"filter_status_": "open", hashed: 20, "page_size_": 5, "sort_by": {"field_name": "created"}}
    assert search.arguments(definition["name"], call) == {
        "filter[status]": "open", "page[size]": 20, "page_size_": 5, "sort by": {"field name": "created"}}
    # the tool's schema itself is untouched, and OpenAI definitions (no such rule) keep the keys
    assert "filter[status]" in tool.parameters["properties"]
    assert "filter[status]" in to_openai([tool])[0]["function"]["parameters"]["properties"]


def test_arguments_give_back_renamed_keys_only_where_the_schema_declares_them():
    """A top-level `page size` (offered as `page_size`) made arguments() rename `page_size` at any depth, also
    inside a free-form `labels` map, so the user's own label key came back as `page size`."""
    item = {"type": "object", "properties": {"item no": {"type": "integer"}}, "additionalProperties": True}
    tool = Tool("api.tag", "tag", "Tag a resource", namespace="api", parameters={
        "type": "object", "$defs": {"item": item},
        "properties": {"page size": {"type": "integer"},
                       "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                       "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
                       "extra": {"allOf": [{"properties": {"item no": {"type": "integer"}}}]}}})
    search = AnthropicToolSearch(ToolScout.from_tools([tool], retriever="bm25"))
    [definition] = search.deferred_tools()
    call = {"page_size": 5, "labels": {"page_size": "A4", "item_no": "x"},
            "items": [{"item_no": 1, "page_size": "free"}], "extra": {"item_no": 2}}
    assert search.arguments(definition["name"], call) == {
        "page size": 5, "labels": {"page_size": "A4", "item_no": "x"},
        "items": [{"item no": 1, "page_size": "free"}], "extra": {"item no": 2}}


def test_arguments_give_back_renamed_keys_under_schema_parts_the_walk_does_not_know():
    """Keys declared under if/then/else, dependentSchemas, not, or a draft-04 tuple `items: [...]` were no
    longer given back (review #12): the walk kept every key it found no declaration for. Now a key is kept as
    sent only under an explicit additionalProperties (a schema, or true) or a matching patternProperties."""
    tool = Tool("api.tag", "tag", "Tag a resource", namespace="api", parameters={
        "type": "object",
        "properties": {"kind": {"type": "string"}, "pair": {"type": "array", "items": [
            {"type": "object", "properties": {"item no": {"type": "integer"}}}, {"type": "string"}]},
            "tags": {"type": "object", "patternProperties": {"size$": {"type": "string"}}}},
        "if": {"properties": {"kind": {"const": "page"}}},
        "then": {"properties": {"page size": {"type": "integer"}}},
        "else": {"properties": {"sheet size": {"type": "integer"}}},
        "dependentSchemas": {"kind": {"properties": {"due date": {"type": "string"}}}},
        "not": {"properties": {"bad key": {"type": "string"}}}})
    search = AnthropicToolSearch(ToolScout.from_tools([tool], retriever="bm25"))
    [definition] = search.deferred_tools()
    call = {"kind": "page", "page_size": 5, "sheet_size": 1, "due_date": "today", "bad_key": "b",
            "pair": [{"item_no": 3}, "x"], "tags": {"page_size": "kept"}}
    assert search.arguments(definition["name"], call) == {
        "kind": "page", "page size": 5, "sheet size": 1, "due date": "today", "bad key": "b",
        "pair": [{"item no": 3}, "x"], "tags": {"page_size": "kept"}}


def test_openai_namespaces_of_non_ascii_titles_stay_apart_and_name_back(tmp_path):
    from toolscout.ingest import load_tools

    tools = []
    for file, title in (("stocks.yaml", "株価 API"), ("fx.yaml", "為替 API")):
        (tmp_path / file).write_text(f"openapi: 3.0.3\ninfo: {{title: {title}, version: '1'}}\npaths:\n  /quote:\n"
                                     f"    get: {{operationId: getQuote, summary: Get the latest quote}}\n")
        tools += load_tools(tmp_path / file)
    search = OpenAIToolSearch(ToolScout.from_tools(tools, retriever="bm25"), k=5, group_namespaces=True)
    call = {"type": "tool_search_call", "call_id": "c", "execution": "client", "arguments": {"query": "latest quote"}}
    groups = search.answer(call)["tools"]
    assert sorted(g["description"] for g in groups) == ["Tools of 株価-api.", "Tools of 為替-api."]
    names = [g["name"] for g in groups]
    assert len(set(names)) == 2 and all(NAME_PATTERN.match(n) and n.startswith("api_") for n in names), names
    functions = [g["tools"][0]["name"] for g in groups]
    assert len(set(functions)) == 2 and all(f.startswith(n + "__") for f, n in zip(functions, names))
    by_group = {g["description"]: search.resolve(g["tools"][0]["name"]).id for g in groups}
    assert by_group == {"Tools of 株価-api.": "株価-api.getQuote", "Tools of 為替-api.": "為替-api.getQuote"}
    assert [g["name"] for g in search.answer(call)["tools"]] == names  # the same names in every answer
