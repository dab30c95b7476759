import json
import re

import pytest

from toolscout.errors import InvalidRequest
from toolscout.tool import TextView, Tool, content_hash, split_identifier, tool_text


@pytest.mark.parametrize("name, words", [
    ("getWeatherForecast", "get Weather Forecast"),
    ("get_weather.forecast", "get weather forecast"),
    ("v1/get-weather", "v1 get weather"),
    ("HTTPServerStart", "HTTP Server Start"),
    ("math.hypot", "math hypot"),
    ("plain", "plain"),
])
def test_split_identifier(name, words):
    assert split_identifier(name) == words


def test_default_view_has_name_words_description_and_parameters(tools):
    text = tool_text(tools[0])
    assert text == ("get forecast\nGet the weather forecast for a city for the next days.\n"
                    "Parameters: city: Name of the city; days: How many days ahead")


def test_view_includes_profile_fields_but_not_example_usage_by_default():
    tool = Tool("t", "t", "d", profile={"function": "Does X", "tags": ["a", "b"], "example_usage": "call t()"})
    text = tool_text(tool)
    assert "Function: Does X" in text and "Tags: a, b" in text
    assert "call t()" not in text
    assert "Example usage: call t()" in tool_text(tool, TextView(profile_fields=("example_usage",)))


def test_view_usage_appends_known_queries():
    tool = Tool("t", "t", "d", usage=("first request", "second request", "third"))
    assert "Example requests: first request | second request" in tool_text(tool, TextView(usage=2))
    assert "first request" not in tool_text(tool)


def test_tool_round_trips_through_dict(tools):
    for tool in tools:
        assert Tool.from_dict(tool.to_dict()) == tool


def test_tool_rejects_bad_fields():
    with pytest.raises(ValueError, match="name"):
        Tool("x", "")
    with pytest.raises(ValueError, match="unknown Tool field"):
        Tool.from_dict({"id": "x", "name": "x", "nonsense": 1})


@pytest.mark.parametrize("parameters, message", [
    ({"type": "array"}, "parameters.type must be 'object' (tool arguments are one JSON object), got 'array'"),
    ({"properties": [1, 2]}, "parameters.properties must be an object mapping each argument's name to its schema, "
                             "got array"),
    ({"properties": {"a": "notaschema"}}, "parameters.properties.a must be a JSON schema (an object, or true/false), "
                                          "got string"),
    ({"properties": {"a": {}}, "required": "a"}, "parameters.required must be a list of argument names (strings), "
                                                 "got string"),
    ({"required": ["a", 1]}, "parameters.required must be a list of argument names (strings), got array holding "
                             "other values"),
])
def test_parameters_that_cannot_describe_arguments_are_refused_naming_the_field(parameters, message):
    with pytest.raises(ValueError) as info:
        Tool("x", "x", parameters=parameters)
    assert str(info.value) == f"tool 'x': {message}"


@pytest.mark.parametrize("fields, where", [
    ({"description": "bad \ud800 text"}, "description"),
    ({"tags": ["ok", "x\udfff"]}, "tags[1]"),
    ({"parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "a\udc80"}}}},
     "parameters.properties.q.description"),
    ({"parameters": {"type": "object", "properties": {"\ud800": {"type": "string"}}}}, "parameters.properties (a key)"),
    ({"raw": {"name": "t", "deep": [["\ud83d"]]}}, "raw.deep[0][0]"),
])
def test_a_lone_surrogate_anywhere_in_a_tool_is_refused_as_catalog_files_refuse_it(fields, where):
    """`Tool()` took a lone surrogate that `load_tools` refuses; `add()` then failed inside encoding, half-way
    through the index. The one text rule now applies where the tool is made, naming the field."""
    with pytest.raises(InvalidRequest, match=rf"^tool 't': {re.escape(where)}: a lone surrogate \(\\ud800 to "):
        Tool("t", "t", **fields)
    assert Tool("t", "t", description="📁 files \u00e9").description == "📁 files é"  # real characters pass


def test_a_lone_surrogate_in_a_set_in_raw_is_refused_and_an_object_whose_repr_raises_is_no_error():
    """The quick check read `raw` off json.dumps(default=repr), whose repr escapes surrogates: one inside a set
    was missed; and an object whose __repr__ raised made `Tool()` raise that (review #11). Now whatever JSON
    cannot write is walked, sets included, and an object that is no text is left alone."""
    with pytest.raises(InvalidRequest, match=r"^tool 't': raw.tags\[0\]: a lone surrogate"):
        Tool("t", "t", raw={"tags": {"x\ud800"}})

    class Opaque:
        def __repr__(self):
            raise RuntimeError("no repr")

    assert isinstance(Tool("t", "t", raw={"handle": Opaque(), "tags": frozenset({"ok"})}).raw["handle"], Opaque)


def test_parameters_may_use_any_json_schema_feature():
    for parameters in ({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}, "b": True, "c": False},
                        "$defs": {"A": {"type": "string"}}, "additionalProperties": False, "required": ["a"]},
                       {"allOf": [{"properties": {"a": {}}}], "patternProperties": {"^x": {}}},
                       {"type": "dict", "properties": {"a": {"type": "integer"}}},  # BFCL's spelling of object
                       {"type": "object", "properties": None, "required": None},  # Go's nil map and slice
                       {"type": None, "properties": {"a": {}}},  # a nil type, unsaid as before the rule
                       {"type": ["object", "null"], "properties": {"a": {}}},  # a list of types allowing one
                       {}):
        assert Tool("x", "x", parameters=parameters).parameters == parameters


def test_a_stored_tool_loads_with_the_parameters_it_was_stored_with(tmp_path):
    """Tools written before every route checked parameters (over HTTP, say) are not lost when the index loads."""
    from toolscout import ToolScout

    ToolScout.from_tools([Tool("a", "a", "alpha tool"), Tool("b", "b", "beta tool")], retriever="bm25").save(
        tmp_path / "idx")
    rows = tmp_path / "idx" / (tmp_path / "idx" / "CURRENT").read_text().strip() / "tools.jsonl"
    lines = rows.read_text().splitlines()
    lines[1] = json.dumps({"id": "b", "name": "b", "description": "beta tool", "parameters": {"type": "array"}})
    rows.write_text("\n".join(lines) + "\n")
    scout = ToolScout.load(tmp_path / "idx")
    assert scout.get("b").parameters == {"type": "array"} and scout.search("beta", k=1)[0].tool.id == "b"

    from toolscout.serve.held import current_pipeline
    from toolscout.serve.journal import Journal

    journal = Journal(tmp_path / "idx", fsync=False)  # a write acknowledged, not yet in a snapshot
    journal.append({"seq": 1, "op": "upsert", "tools": [{"id": "c", "name": "c", "parameters": {"required": "q"}}]})
    journal.close()
    assert current_pipeline(tmp_path / "idx").get("c").parameters == {"required": "q"}


def test_content_hash_changes_with_text():
    assert content_hash("a") == content_hash("a") != content_hash("b")


def test_view_can_keep_the_raw_identifier_and_shows_titles():
    tool = Tool("t", "get_weather", "d", title="Weather lookup")
    assert tool_text(tool, TextView(raw_name=True, parameters=False)).startswith("Weather lookup (get_weather (get weather))")
    assert tool_text(tool).startswith("Weather lookup (get weather)\nd")


def test_descriptions_are_read_as_plain_text_cut_for_encoders_and_summarised_by_their_first_sentence():
    from toolscout.retrievers.dense import summary_view
    from toolscout.tool import DESCRIPTION_CHARS

    note = ("Creating issues [triggers notifications](https://docs.github.com/rest/guides). See <a href=\"/x\">secondary "
            "rate limits</a> &amp; <code>best practices</code>: https://docs.github.com/limits ")
    description = f"Create an issue. Any user with pull access can create one.\n\n{note * 12}"
    tool = Tool(id="issues/create", name="issues/create", description=description,
                parameters={"type": "object", "properties": {"title": {"type": "string", "description": "The title."}}})
    text = tool_text(tool)
    name, body, params = text.split("\n", 1)[0], text.split("\n", 1)[1].rsplit("\n", 1)[0], text.rsplit("\n", 1)[1]
    assert name == "issues create" and params == "Parameters: title: The title."  # the parameters stay in reach
    plain = ("Create an issue. Any user with pull access can create one.\n\n"
             + "Creating issues triggers notifications. See secondary rate limits & best practices: " * 12)
    assert DESCRIPTION_CHARS // 2 < len(body) <= DESCRIPTION_CHARS  # cut at a word, not at one character
    assert body == plain[:len(body)] and plain[len(body)] == " "
    assert tool_text(tool, summary_view(TextView())) == "issues create\nCreate an issue."
    # A view saved before this reading (no `descriptions` key) reads descriptions whole and as written, in
    # the summary too, so an index built then keeps the texts its stored vectors were made from.
    saved = {k: v for k, v in TextView().to_dict().items() if k != "descriptions"}
    old = TextView.from_dict(saved)
    assert tool_text(tool, old) == f"issues create\n{description}\nParameters: title: The title."
    assert tool_text(tool, summary_view(old)) == f"issues create\n{description}"
    assert TextView.from_dict(TextView().to_dict()) == TextView()
    assert TextView.from_dict({"parameters": False}) == TextView(parameters=False)  # written by hand: today's reading
    # an old index re-saved by this version saves its view as that code did, so that code still reads it
    assert TextView.from_dict(saved).to_dict() == saved
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['summary_chars'\].*newer toolscout"):
        TextView.from_dict({**saved, "summary_chars": 100})  # a view from a newer toolscout
    with pytest.raises(ValueError, match="descriptions must be one of plain, lead, as-written, not 'short'"):
        TextView(descriptions="short")


@pytest.mark.parametrize("written, plain, lead", [
    ("If n<p or p>n. Then stop.", "If n<p or p>n. Then stop.", "If n<p or p>n."),  # not tags: prose stays
    ("Use x <b and c> y or List<String>. More.", "Use x <b and c> y or List<String>. More.",
     "Use x <b and c> y or List<String>."),
    ("See <a href=\"/rl\">rate limits</a> &amp; <code>best practices</code>.", "See rate limits & best practices.",
     "See rate limits & best practices."),
    ("Go to <https://example.com/a_(b)> now.", "Go to now.", "Go to now."),
    ("Docs at https://x.com/docs. Then more.", "Docs at. Then more.", "Docs at."),  # the full stop is the sentence's
    ("Read [the guide](https://d.com/a_(b)) (https://d.com/c) and call os.system().",
     "Read the guide and call os.system().", "Read the guide and call os.system()."),
    ("Match files, e.g. *.py ones, in the U.K. office. Then more.", "Match files, e.g. *.py ones, in the U.K. office. "
     "Then more.", "Match files, e.g. *.py ones, in the U.K. office."),
    ("Call it (see the docs.) And then.", "Call it (see the docs.) And then.", "Call it (see the docs.)"),
    ("Filter with ?limit=10&region=eu&copy=true &amp; more. See Fig. 3 below. Then.",  # entities need their ";"
     "Filter with ?limit=10&region=eu&copy=true & more. See Fig. 3 below. Then.",
     "Filter with ?limit=10&region=eu&copy=true & more."),
    ("See Fig. 3 for details. Then more.", "See Fig. 3 for details. Then more.", "See Fig. 3 for details."),
    ("Based on the paper by Feichtenhofer et al. They are trained.", "Based on the paper by Feichtenhofer et al. They "
     "are trained.", "Based on the paper by Feichtenhofer et al."),
])
def test_plain_text_keeps_prose_and_the_lead_is_the_first_sentence(written, plain, lead):
    from toolscout.tool import lead_sentence, plain_text

    assert plain_text(written) == plain
    assert lead_sentence(plain) == lead
