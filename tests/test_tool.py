import pytest

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


def test_content_hash_changes_with_text():
    assert content_hash("a") == content_hash("a") != content_hash("b")


def test_view_can_keep_the_raw_identifier_and_shows_titles():
    tool = Tool("t", "get_weather", "d", title="Weather lookup")
    assert tool_text(tool, TextView(raw_name=True, parameters=False)).startswith("Weather lookup (get_weather (get weather))")
    assert tool_text(tool).startswith("Weather lookup (get weather)\nd")
