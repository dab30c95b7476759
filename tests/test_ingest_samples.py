"""The catalogs shipped in toolscout/data/catalogs load, with the shapes the docs promise."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import toolscout
from toolscout.benchmark_sets import load_benchmark
from toolscout.ingest import LoadReport, load_tools

CATALOGS = Path(toolscout.__file__).parent / "data" / "catalogs"

PETSTORE_OPERATIONS = [
    ("addPet", "POST", "/pet"), ("updatePet", "PUT", "/pet"),  # document order
    ("findPetsByStatus", "GET", "/pet/findByStatus"), ("findPetsByTags", "GET", "/pet/findByTags"),
    ("getPetById", "GET", "/pet/{petId}"), ("updatePetWithForm", "POST", "/pet/{petId}"),
    ("deletePet", "DELETE", "/pet/{petId}"), ("uploadFile", "POST", "/pet/{petId}/uploadImage"),
    ("getInventory", "GET", "/store/inventory"), ("placeOrder", "POST", "/store/order"),
    ("getOrderById", "GET", "/store/order/{orderId}"), ("deleteOrder", "DELETE", "/store/order/{orderId}"),
    ("createUser", "POST", "/user"), ("createUsersWithListInput", "POST", "/user/createWithList"),
    ("loginUser", "GET", "/user/login"), ("logoutUser", "GET", "/user/logout"),
    ("getUserByName", "GET", "/user/{username}"), ("updateUser", "PUT", "/user/{username}"),
    ("deleteUser", "DELETE", "/user/{username}"),
]


def test_petstore_one_tool_per_operation():
    report = LoadReport()
    tools = load_tools(CATALOGS / "petstore_openapi.yaml", report=report)
    assert report.format == "openapi" and report.skipped == [] and report.warnings == []
    assert [(t.name, t.method, t.path) for t in tools] == PETSTORE_OPERATIONS
    assert {t.namespace for t in tools} == {"swagger-petstore-openapi-3-0"}
    by_name = {t.name: t for t in tools}
    assert by_name["getPetById"].description == "Find pet by ID. Returns a single pet"
    assert by_name["getPetById"].parameters == {
        "type": "object", "properties": {"petId": {"type": "integer", "format": "int64",
                                                   "description": "ID of pet to return"}},
        "required": ["petId"]}
    assert by_name["findPetsByStatus"].parameters["properties"]["status"] == {
        "type": "string", "enum": ["available", "pending", "sold"], "default": "available",
        "description": "Status values that need to be considered for filter"}
    # Pet body merged (x-swagger-router-model and xml dropped), its required fields kept
    add = by_name["addPet"].parameters
    assert list(add["properties"]) == ["id", "name", "category", "photoUrls", "tags", "status"]
    assert add["required"] == ["name", "photoUrls"]
    assert add["properties"]["category"] == {"properties": {"id": {"type": "integer", "format": "int64", "example": 1},
                                                            "name": {"type": "string", "example": "Dogs"}},
                                             "type": "object"}
    # path parameter 'username' and User's 'username' clash: the body's is body_username, sent as 'username'
    update = by_name["updateUser"]
    assert list(update.parameters["properties"]) == ["username", "id", "body_username", "firstName", "lastName",
                                                     "email", "password", "phone", "userStatus"]
    assert update.raw["parameter_names"] == {"body_username": "username"}
    assert by_name["getInventory"].returns == {"type": "object",
                                               "additionalProperties": {"type": "integer", "format": "int32"}}
    assert by_name["deletePet"].tags == ("pet",)


def test_mcp_sample_gives_namespaced_tools():
    report = LoadReport()
    tools = load_tools(CATALOGS / "mcp_reference_servers.json", report=report)
    assert report.format == "mcp" and report.skipped == []
    assert Counter(t.namespace for t in tools) == {"filesystem": 14, "memory": 9, "time": 2, "fetch": 1}
    by_id = {t.id: t for t in tools}
    assert len(by_id) == 26
    read = by_id["filesystem.read_text_file"]
    assert read.tags == ("read-only",) and read.raw["title"] == "Read Text File"
    assert read.parameters["required"] == ["path"]
    assert read.returns["properties"] == {"content": {"type": "string"}}
    assert by_id["memory.delete_entities"].tags == ("destructive", "idempotent")
    assert by_id["fetch.fetch"].parameters["properties"]["max_length"]["default"] == 5000
    assert by_id["time.convert_time"].parameters["required"] == ["source_timezone", "time", "target_timezone"]


def test_apibank_sample_is_the_default_catalog():
    report = LoadReport()
    tools = load_tools(CATALOGS / "apibank_sample", report=report)
    assert report.format == "jsonl" and len(tools) == 60
    assert all(t.id == f"apibank::{t.name}" for t in tools)
    bench = load_benchmark(CATALOGS / "apibank_sample")  # every label is a sample tool
    splits = Counter(q.split for q in bench.queries)
    assert splits == {"test": 107, "train": 23}
    tested = {label for q in bench.split("test") for label in q.labels}
    assert {"apibank::AddAlarm", "apibank::AddReminder", "apibank::AppointmentRegistration",
            "apibank::QueryAgenda"} <= tested


def test_catalog_readme_names_every_shipped_catalog_and_licence():
    readme = (CATALOGS / "README.md").read_text()
    for name in ("petstore_openapi.yaml", "mcp_reference_servers.json", "apibank_sample/"):
        assert name in readme
    for licence in ("Apache-2.0", "MIT"):
        assert licence in readme
