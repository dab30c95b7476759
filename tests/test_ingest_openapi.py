"""OpenAPI 3.x / Swagger 2.0: one tool per operation, merged parameter schemas, refs, cycles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolscout.errors import CatalogError
from toolscout.ingest import LoadReport, load_tools, parse_tools
from toolscout.ingest import schema as schema_helpers
from toolscout.ingest.common import slugify
from toolscout.tool import tool_text

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"

NEW_PET_PROPS = {"name": {"type": "string", "description": "The pet's name"},
                 "species": {"type": "string", "enum": ["cat", "dog"]}}  # x-internal and xml dropped


@pytest.fixture(scope="module")
def pets():
    return {t.name: t for t in load_tools(FIXTURES / "openapi_pets.yaml")}


def test_one_tool_per_operation_with_method_path_and_namespace(pets):
    assert list(pets) == ["listPets", "POST /owners/{ownerId}/pets", "getFamily"]
    post = pets["POST /owners/{ownerId}/pets"]
    assert (post.id, post.namespace, post.method, post.path) == (
        "pet-clinic-api.POST /owners/{ownerId}/pets", "pet-clinic-api", "POST", "/owners/{ownerId}/pets")
    assert post.description == "Add a pet" and post.tags == ("pets",)


def test_path_param_query_param_and_reffed_body_merge_into_one_schema(pets):
    post = pets["POST /owners/{ownerId}/pets"]
    assert post.parameters == {
        "type": "object",
        "properties": {
            "ownerId": {"type": "integer", "description": "The owner's id"},  # path-level parameter
            "dryRun": {"type": "boolean", "default": False},                  # query parameter
            **NEW_PET_PROPS,                                                  # $ref'd JSON body, merged
        },
        "required": ["ownerId", "name"],  # path params always; body's required because the body is
    }
    assert post.raw["parameter_locations"] == {"ownerId": "path", "dryRun": "query", "name": "body",
                                               "species": "body"}
    # 201 response (an unquoted YAML int key) → returns, with the allOf refs inlined
    assert post.returns == {"allOf": [{"type": "object", "required": ["name"], "properties": NEW_PET_PROPS},
                                      {"type": "object", "properties": {"id": {"type": "integer"}}}]}


def test_reffed_parameter_summary_description_and_array_response(pets):
    tool = pets["listPets"]
    assert tool.description == "List an owner's pets. Pets are returned newest first."
    assert tool.parameters == {
        "type": "object",
        "properties": {"ownerId": {"type": "integer", "description": "The owner's id"},
                       "limit": {"type": "integer", "maximum": 100, "description": "How many pets to return"}},
        "required": ["ownerId"]}
    assert tool.returns["type"] == "array" and tool.returns["items"]["allOf"][0]["properties"] == NEW_PET_PROPS


def test_recursive_schema_is_cut_with_a_placeholder(pets):
    family = pets["getFamily"]
    assert family.tags == ("deprecated",)
    assert family.returns == {
        "type": "object",
        "properties": {"name": {"type": "string"},
                       "children": {"type": "array", "items": {
                           "type": "object", "title": "Node",
                           "$comment": "recursive reference: #/components/schemas/Node"}}}}


def test_caller_namespace_replaces_the_title():
    tools = load_tools(FIXTURES / "openapi_pets.yaml", namespace="clinic")
    assert tools[0].id == "clinic.listPets"


@pytest.mark.parametrize("title, namespace", [
    ("天気予報 API", "天気予報-api"), ("郵便 API", "郵便-api"), ("Погода", "погода"),
    ("Café API", "caf-api"), ("Météo France", "m-t-o-france"),  # every word kept a letter before: ids unchanged
    ("मौसम सेवा", "मौसम-सेवा"),  # the vowel signs (combining marks) stay with their letters
    ("Ｗｅａｔｈｅｒ　API", "weather-api"), ("🚀", None)])
def test_a_title_in_any_script_keeps_its_letters_in_the_namespace(title, namespace):
    spec = {"openapi": "3.0.0", "info": {"title": title}, "paths": {"/w": {"get": {"operationId": "get"}}}}
    [tool] = parse_tools(spec)
    assert (tool.namespace, tool.id) == (namespace, f"{namespace}.get" if namespace else "get")


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_an_ascii_title_slugs_as_it_always_did(title):
    assert slugify(title) == re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")  # the rule before Unicode


def test_apis_titled_in_other_scripts_do_not_collide():
    from toolscout import ToolScout

    tools = [tool for title, summary in (("天気予報 API", "weather forecast"), ("郵便 API", "postal code lookup"))
             for tool in parse_tools({"openapi": "3.0.0", "info": {"title": title},
                                      "paths": {"/q": {"get": {"operationId": "query", "summary": summary}}}})]
    assert [t.id for t in tools] == ["天気予報-api.query", "郵便-api.query"]  # both were 'api.query'
    scout = ToolScout.from_tools(tools, retriever="bm25")
    [hit] = scout.search("query", k=5, namespaces=["郵便-api"])
    assert hit.tool.id == "郵便-api.query"


def test_swagger2_body_parameter_and_definitions():
    tools = load_tools(FIXTURES / "swagger2.json")
    update, listing = tools
    assert (update.id, update.method, update.path) == ("todo-api.updateTodo", "PUT", "/todos/{id}")
    assert update.parameters == {"type": "object",
                                 "properties": {"id": {"type": "integer"}, "title": {"type": "string"},
                                                "done": {"type": "boolean"}},
                                 "required": ["id", "title"]}
    assert update.returns == {"type": "object", "required": ["title"],
                              "properties": {"title": {"type": "string"}, "done": {"type": "boolean"}}}
    assert listing.name == "GET /todos"
    assert listing.parameters == {"type": "object",
                                  "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}


SWAGGER2_REFFED_BODIES = {
    "swagger": "2.0", "info": {"title": "Notes"},
    "parameters": {"NoteBody": {"name": "note", "in": "body", "required": True,
                                "schema": {"$ref": "#/definitions/Note"}}},
    "definitions": {"Note": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}},
    "paths": {
        "/notes": {"post": {"operationId": "addNote", "parameters": [{"$ref": "#/parameters/NoteBody"}]}},
        "/notes/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": True, "type": "string"},
                           {"name": "body", "in": "body", "schema": {"type": "string", "description": "old"}}],
            "put": {"operationId": "putNote",  # its own body replaces the path item's
                    "parameters": [{"name": "payload", "in": "body", "schema": {"type": "array"}}]},
            "patch": {"operationId": "patchNote"}}}}


def test_swagger2_body_parameter_by_ref_or_at_path_level_is_the_body():
    tools = {t.name: t for t in parse_tools(SWAGGER2_REFFED_BODIES)}
    add = tools["addNote"]  # a $ref to #/parameters: the body's properties merged in
    assert add.parameters == {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    assert add.raw["parameter_locations"] == {"text": "body"}
    assert add.raw["body"] == {"media_type": "application/json", "whole": None}
    patch = tools["patchNote"]  # the path item's body parameter applies to its operations
    assert patch.parameters["properties"] == {"id": {"type": "string"},
                                              "body": {"type": "string", "description": "old"}}
    assert patch.raw["body"] == {"media_type": "application/json", "whole": "body"}
    put = tools["putNote"]  # the operation's body parameter wins over the path item's
    assert put.parameters["properties"] == {"id": {"type": "string"}, "body": {"type": "array"}}
    assert put.raw["parameter_locations"] == {"id": "path", "body": "body"}


def spec_with(op: dict, components: dict | None = None) -> dict:
    return {"openapi": "3.0.0", "info": {"title": "T"}, "paths": {"/items/{id}": {"put": op}},
            "components": components or {}}


COLLIDING = {"operationId": "updateItem", "parameters": [
    {"name": "id", "in": "path", "required": True, "description": "path id of the item", "schema": {"type": "string"}},
    {"name": "id", "in": "query", "description": "query id for versioning", "schema": {"type": "integer"}},
    {"name": "name", "in": "query", "description": "filter by name", "schema": {"type": "string"}}],
    "requestBody": {"required": True, "description": "The item", "content": {"application/json": {"schema": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string", "description": "the new item name"}, "price": {"type": "number"}}}}}}}


def test_a_body_field_named_as_a_parameter_is_kept_beside_it_as_body_name():
    [tool] = parse_tools(spec_with(COLLIDING))
    assert tool.parameters == {"type": "object", "properties": {
        "id": {"type": "string", "description": "path id of the item"},
        "query_id": {"type": "integer", "description": "query id for versioning"},
        "name": {"type": "string", "description": "filter by name"},
        "body_name": {"type": "string", "description": "the new item name"},
        "price": {"type": "number"}}, "required": ["id", "body_name"]}
    assert tool.raw["parameter_locations"] == {"id": "path", "query_id": "query", "name": "query",
                                               "body_name": "body", "price": "body"}
    assert tool.raw["parameter_names"] == {"query_id": "id", "body_name": "name"}  # as the request spells them
    assert tool.raw["body"] == {"media_type": "application/json", "whole": None}
    assert "body name: the new item name; price" in tool_text(tool)


PET_COMPONENTS = {"schemas": {
    "NewPet": {"type": "object", "required": ["species"], "properties": {
        "species": {"type": "string", "description": "the animal species"},
        "nickname": {"type": "string", "description": "what the owner calls it"}}},
    "Pet": {"allOf": [{"$ref": "#/components/schemas/NewPet"},
                      {"type": "object", "required": ["microchip"],
                       "properties": {"microchip": {"type": "string", "description": "implanted microchip"}}}]},
    "Walk": {"type": "object", "properties": {"minutes": {"type": "integer", "description": "length of the walk"}}}}}


def body_op(schema: dict) -> dict:
    return {"operationId": "addPet", "requestBody": {"required": True, "content": {"application/json": {
        "schema": schema}}}}


def test_an_allof_body_by_ref_is_merged_into_one_object_of_arguments():
    # petstore-expanded's Pet: allOf [NewPet, {id}]
    [tool] = parse_tools(spec_with(body_op({"$ref": "#/components/schemas/Pet"}), PET_COMPONENTS))
    assert tool.parameters == {"type": "object", "properties": {
        **PET_COMPONENTS["schemas"]["NewPet"]["properties"],
        "microchip": {"type": "string", "description": "implanted microchip"}},
        "required": ["species", "microchip"]}
    assert tool.raw["body"] == {"media_type": "application/json", "whole": None}
    assert "species: the animal species; nickname: what the owner calls it; microchip: implanted" in tool_text(tool)


def test_an_allof_part_with_another_constraint_keeps_the_body_whole_with_its_fields_in_the_text():
    closed = {"allOf": [{"$ref": "#/components/schemas/NewPet"}, {"additionalProperties": False}]}
    [tool] = parse_tools(spec_with(body_op(closed), PET_COMPONENTS))
    assert list(tool.parameters["properties"]) == ["body"] and "allOf" in tool.parameters["properties"]["body"]
    assert "Parameters: body: species: the animal species; nickname: what the owner calls it" in tool_text(tool)


@pytest.mark.parametrize("keyword", ["oneOf", "anyOf"])
def test_a_oneof_body_stays_one_argument_and_its_branches_fields_are_searchable(keyword):
    choice = {keyword: [{"$ref": "#/components/schemas/Pet"}, {"$ref": "#/components/schemas/Walk"}]}
    [tool] = parse_tools(spec_with(body_op(choice), PET_COMPONENTS))
    body = tool.parameters["properties"]["body"]  # the choice an agent calls with is kept
    assert tool.parameters["required"] == ["body"] and [len(body[keyword])] == [2]
    assert tool.raw["body"] == {"media_type": "application/json", "whole": "body"}
    assert tool_text(tool).endswith("Parameters: body: species: the animal species; nickname: what the owner "
                                    "calls it; microchip: implanted microchip; minutes: length of the walk")


def test_non_json_body_becomes_a_body_property():
    op = {"operationId": "upload", "requestBody": {"required": True, "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
    [tool] = parse_tools(spec_with(op))
    assert tool.parameters == {"type": "object", "properties": {"body": {"type": "string", "format": "binary"}},
                               "required": ["body"]}


def test_size_budget_stops_exponential_inlining(monkeypatch):
    monkeypatch.setattr(schema_helpers, "MAX_EXPANSIONS", 3)
    components = {"schemas": {"A": {"type": "object", "properties": {"b1": {"$ref": "#/components/schemas/B"},
                                                                     "b2": {"$ref": "#/components/schemas/B"}}},
                              "B": {"type": "object", "properties": {"c": {"$ref": "#/components/schemas/C"}}},
                              "C": {"type": "string"}}}
    op = {"operationId": "get", "responses": {"200": {"description": "ok", "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/A"}}}}}}
    [tool] = parse_tools(spec_with(op, components))
    # A, B (b1), C are inlined (3 expansions); b2's B is left as a placeholder
    assert tool.returns["properties"]["b1"] == {"type": "object", "properties": {"c": {"type": "string"}}}
    assert tool.returns["properties"]["b2"] == {
        "type": "object", "title": "B", "$comment": "reference not expanded (size limit): #/components/schemas/B"}


def test_external_ref_is_kept_with_a_warning():
    op = {"operationId": "get", "responses": {"200": {"description": "ok", "content": {
        "application/json": {"schema": {"$ref": "common.yaml#/Thing"}}}}}}
    report = LoadReport()
    [tool] = parse_tools(spec_with(op), report=report)
    assert tool.returns == {"$ref": "common.yaml#/Thing"}
    assert any("common.yaml#/Thing" in w for w in report.warnings)


def test_broken_ref_deep_in_components_names_the_operation():
    owner = {"$ref": "#/components/schemas/Nope"}
    components = {"schemas": {"Pet": {"type": "object", "properties": {"owner": owner}}}}
    op = {"operationId": "get", "responses": {"200": {"description": "ok", "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}}}}}
    with pytest.raises(CatalogError) as info:
        parse_tools(spec_with(op, components), source="spec.json")
    message = str(info.value)
    assert message.startswith("spec.json: components.schemas.Pet.properties.owner.$ref: broken $ref")
    assert "'#/components/schemas/Nope'" in message and "(needed by paths./items/{id}.put)" in message


def test_unsupported_version_fails():
    with pytest.raises(CatalogError, match=r"x.json: openapi: unsupported OpenAPI version '1.2'"):
        parse_tools({"openapi": "1.2", "paths": {}}, source="x.json")


def test_a_ref_without_its_slash_is_called_malformed():
    op = {"operationId": "get", "parameters": [{"name": "q", "in": "query", "schema": {"$ref": "#components/schemas/Q"}}]}
    with pytest.raises(CatalogError) as info:
        parse_tools(spec_with(op, {"schemas": {"Q": {"type": "string"}}}), source="s.json")
    assert str(info.value) == ("s.json: paths./items/{id}.put.parameters[0].schema.$ref: malformed $ref "
                               "'#components/schemas/Q': a ref inside this file is '#/' and a path; write "
                               "'#/components/schemas/Q'")


def test_a_parameter_in_another_file_is_said_to_be_one():
    op = {"operationId": "get", "parameters": [{"$ref": "common.yaml#/parameters/Q"}]}
    with pytest.raises(CatalogError) as info:
        parse_tools(spec_with(op), source="s.json")
    assert str(info.value) == ("s.json: paths./items/{id}.put.parameters[0]: the parameter is a $ref to another file "
                               "('common.yaml#/parameters/Q'), which is not read; bundle the spec into one file")


def test_a_document_forced_to_openapi_without_a_version_field_is_said_not_to_be_one():
    with pytest.raises(CatalogError) as info:
        parse_tools({"tools": [{"name": "a", "inputSchema": {"type": "object"}}]}, format="openapi", source="c.json")
    assert str(info.value) == ("c.json: it reads as mcp, not openapi: pass format='mcp' or none (CLI: --format mcp, or "
                               "no --format); read as openapi, it fails: c.json: not an OpenAPI document: it has no "
                               "'openapi' (3.x) or 'swagger' (2.0) field; check the file, or the format asked for")
    with pytest.raises(CatalogError) as info:  # one that looks like no format: the reason alone
        parse_tools({"title": "x"}, format="openapi", source="c.json")
    assert str(info.value).startswith("c.json: not an OpenAPI document: it has no 'openapi'")


YAML_12_SCALARS = """\
openapi: 3.1.0
info: {title: Poll}
paths:
  /answer:
    get:
      operationId: NO
      summary: answer a poll
      parameters:
        - {name: vote, in: query, required: True, schema: {type: string, enum: [yes, no, on, off, Y, maybe]}}
        - {name: notify, in: query, schema: {type: boolean, default: false}}
      responses: {200: {description: ok}}
"""


def test_yaml_is_read_with_yaml_12_booleans_only_true_and_false(tmp_path):
    # YAML 1.1 read NO as false ("field 'operationId' must be a non-empty string") and yes/no as true/false
    spec = tmp_path / "poll.yaml"
    spec.write_text(YAML_12_SCALARS)
    [tool] = load_tools(spec)
    assert tool.name == "NO"
    assert tool.parameters == {"type": "object", "properties": {
        "vote": {"type": "string", "enum": ["yes", "no", "on", "off", "Y", "maybe"]},
        "notify": {"type": "boolean", "default": False}}, "required": ["vote"]}  # True and false still booleans


def test_yaml_numbers_are_yaml_12s_so_a_time_or_a_zero_padded_code_keeps_its_value():
    """YAML 1.1 read `12:30` as 750 (base 60), `010` as 8 (octal), `0b11` as 3 and `1_000` as 1000; in YAML 1.2's core
    schema the first is text, `010` is ten, and the last two are text. An explicit !!int still reads `1_000`."""
    from toolscout.ingest.yaml_loader import load

    text = ("at: 12:30\ncode: 010\nmask: 0b11\nbig: 1_000\nhex: 0x1F\noct: 0o17\ne: 1e3\nhalf: .5\n"
            "neg: -2.5E-1\nplus: +7\ntagged: !!int '1_000'\n")
    assert load(text, "numbers.yaml") == {"at": "12:30", "code": 10, "mask": "0b11", "big": "1_000", "hex": 31,
                                          "oct": 15, "e": 1000.0, "half": 0.5, "neg": -0.25, "plus": 7,
                                          "tagged": 1000}


ODD_OPERATIONS = """\
openapi: 3.0.3
info: {title: Ledger, version: "1"}
paths:
  /entries:
    get:
      operationId: listEntries
      parameters:
        - {name: amount, in: query, schema: {type: number, maximum: .inf}}
      responses: {200: {description: ok}}
    post:
      operationId: 12345
      summary: Create an entry
      responses: {201: {description: created}}
  /entries/{id}:
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
    get:
      operationId: getEntry
      responses: {200: {description: ok}}
    patch:
      operationId: getEntry
      summary: Change an entry
      responses: {200: {description: ok}}
"""


def test_lenient_leaves_out_only_the_operation_holding_an_infinity_and_says_where(tmp_path):
    spec = tmp_path / "ledger.yaml"
    spec.write_text(ODD_OPERATIONS)
    with pytest.raises(CatalogError, match=r"ledger.yaml: paths\./entries\.get\.parameters\[0\]\.schema\.maximum: "
                                           "inf is not a JSON number"):
        load_tools(spec)  # strict: the file is refused, naming the value
    report = LoadReport()
    tools = load_tools(spec, lenient=True, report=report)
    assert sorted(t.name for t in tools) == ["12345", "PATCH /entries/{id}", "getEntry"]
    [(where, why)] = report.skipped
    assert (where, why) == ("paths./entries.get", f"{spec}: paths./entries.get.parameters[0].schema.maximum: inf is "
                                                  "not a JSON number; write a finite number, or a string")
    # outside every operation (a shared component) there is nothing smaller to leave out: the file is refused
    shared = tmp_path / "shared.yaml"
    shared.write_text(ODD_OPERATIONS.replace("maximum: .inf", "maximum: 10") + "components:\n  schemas:\n"
                      "    Amount: {type: number, maximum: .nan}\n")
    with pytest.raises(CatalogError, match=r"shared.yaml: components\.schemas\.Amount\.maximum: nan is not"):
        load_tools(shared, lenient=True)


def test_a_numeric_operation_id_is_its_text_and_a_repeated_one_falls_back_to_method_and_path(tmp_path):
    spec = tmp_path / "ledger.yaml"
    spec.write_text(ODD_OPERATIONS.replace("maximum: .inf", "maximum: 10"))
    report = LoadReport()
    tools = {t.id: t for t in load_tools(spec, report=report)}  # not lenient: nothing is refused
    assert set(tools) == {"ledger.listEntries", "ledger.12345", "ledger.getEntry", "ledger.PATCH /entries/{id}"}
    assert tools["ledger.PATCH /entries/{id}"].description == "Change an entry"
    assert tools["ledger.getEntry"].method == "GET" and not report.skipped
    assert report.warnings == [f"{spec}: paths./entries/{{id}}.patch: operationId 'getEntry' is already the id of "
                               "paths./entries/{id}.get; this operation's id is 'PATCH /entries/{id}', its method and "
                               "path (give it an operationId of its own to name it)"]


READ_ONLY_OAS3 = """\
openapi: 3.0.3
info: {title: Stations, version: "1"}
paths:
  /stations:
    post:
      operationId: createStation
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: '#/components/schemas/Station'}
      responses:
        201:
          description: created
          content:
            application/json:
              schema: {$ref: '#/components/schemas/Station'}
components:
  schemas:
    Station:
      type: object
      required: [id, name, sensors]
      properties:
        id: {type: string, readOnly: true}
        name: {type: string}
        password: {type: string, writeOnly: true}
        sensors:
          type: array
          items:
            type: object
            required: [serial, installedAt]
            properties:
              serial: {type: string}
              installedAt: {type: string, readOnly: true}
"""

READ_ONLY_SWAGGER2 = """\
swagger: "2.0"
info: {title: Stations, version: "1"}
host: example.com
paths:
  /stations:
    post:
      operationId: createStation
      parameters:
        - {name: body, in: body, required: true, schema: {$ref: '#/definitions/Station'}}
      responses: {201: {description: created}}
definitions:
  Base:
    type: object
    required: [id]
    properties:
      id: {type: string, readOnly: true}
  Station:
    allOf:
      - $ref: '#/definitions/Base'
      - type: object
        required: [name]
        properties:
          name: {type: string}
"""


def test_read_only_body_properties_are_left_out_of_the_arguments_at_any_depth(tmp_path):
    (tmp_path / "oas3.yaml").write_text(READ_ONLY_OAS3)
    [tool] = load_tools(tmp_path / "oas3.yaml")
    assert tool.parameters == {"type": "object", "properties": {
        "name": {"type": "string"}, "password": {"type": "string", "writeOnly": True},
        "sensors": {"type": "array", "items": {"type": "object", "required": ["serial"],
                                               "properties": {"serial": {"type": "string"}}}}},
        "required": ["name", "sensors"]}
    assert tool.returns["properties"]["id"] == {"type": "string", "readOnly": True}  # answers still carry it
    (tmp_path / "swagger2.yaml").write_text(READ_ONLY_SWAGGER2)
    [tool] = load_tools(tmp_path / "swagger2.yaml")
    assert tool.parameters == {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
