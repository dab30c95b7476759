"""A gateway's first searches, while its upstreams start: the official MCP SDK client launches `toolscout
gateway CONFIG` over stdio on a new index, in front of stub servers that are slow to start
(tests/fixtures/mcp_stub.py --start-delay) and one whose command does not exist. A search waits for the
servers still starting that have no tools in the index (bounded by --search-wait), and its answer names the
servers it could not search."""

import json
import time

import anyio
import pytest

pytest.importorskip("mcp")
from mcp import Client  # noqa: E402

from gateways import gateway_stdio, stub, time_server, write_config  # noqa: E402

pytestmark = pytest.mark.slow  # starts gateways and upstream servers

ZEBRA = {"name": "count_zebra_stripes", "description": "Count the stripes of a zebra in a photo",
         "inputSchema": {"type": "object", "properties": {"photo": {"type": "string"}}}}


def ids(result) -> list[str]:
    assert not result.is_error, result.content[0].text
    return [t["id"] for t in result.structured_content["tools"]]


def test_the_first_search_on_a_new_index_waits_for_a_server_slow_to_start(tmp_path):
    (tmp_path / "zoo.json").write_text(json.dumps([ZEBRA]))
    config = write_config(tmp_path, {
        "zoo": stub("zoo", "--start-delay", "3", "--no-builtins", "--tools", str(tmp_path / "zoo.json")),
        "time": time_server(),
        "ghost": {"command": str(tmp_path / "no-such-server")}})

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index")) as client:
            started = time.monotonic()
            first = await client.call_tool("search_tools", {"task": "count the stripes of a zebra", "k": 3})
            waited = time.monotonic() - started
            assert ids(first)[0] == "zoo.count_zebra_stripes", first.structured_content
            assert first.structured_content["abstained"] is False
            # the server that cannot start is named, with why; the ones that started are not
            (ghost,) = first.structured_content["not_searchable"]
            assert ghost["server"] == "ghost" and ghost["status"] == "down"
            assert "no-such-server" in ghost["reason"]
            assert waited < 10  # the gateway's default wait; zoo came up within it
            timed = await client.call_tool("search_tools", {"task": "what time is it in Tokyo", "k": 3})
            assert "time.get_current_time" in ids(timed)

    anyio.run(session)


def test_a_server_that_does_not_come_up_within_the_wait_is_named_and_waited_for_once(tmp_path):
    (tmp_path / "zoo.json").write_text(json.dumps([ZEBRA]))
    config = write_config(tmp_path, {
        "late": stub("late", "--start-delay", "600", "--no-builtins", "--tools", str(tmp_path / "zoo.json")),
        "alpha": stub("alpha")})

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index", "--search-wait", "6")) as client:
            started = time.monotonic()
            first = await client.call_tool("search_tools", {"task": "echo the text back", "k": 3})
            waited = time.monotonic() - started
            assert ids(first)[0] == "alpha.echo"  # alpha came up while the search waited
            assert first.structured_content["not_searchable"] == [
                {"server": "late", "status": "starting", "reason": "it has not listed its tools yet"}]
            assert 5 < waited < 30  # it waited its bound for late (on two busy cores, give the answer time)
            started = time.monotonic()
            again = await client.call_tool("search_tools", {"task": "count the stripes of a zebra", "k": 3})
            assert time.monotonic() - started < 3  # late's wait is spent: later searches answer at once
            assert [s["server"] for s in again.structured_content["not_searchable"]] == ["late"]
            only_alpha = await client.call_tool("search_tools", {"task": "echo", "namespaces": ["alpha"]})
            assert only_alpha.structured_content["not_searchable"] == []  # late is not among what it searched
            # a server still starting is not searchable, with why; a name no server has is said to be unknown
            named = await client.call_tool("search_tools", {"task": "echo", "namespaces": ["alpah", "late"]})
            assert named.structured_content["unknown_namespaces"] == ["alpah"]
            assert [s["server"] for s in named.structured_content["not_searchable"]] == ["late"]

    anyio.run(session)


def test_a_call_to_a_server_still_queued_to_start_waits_for_it_instead_of_failing(tmp_path):
    """On a kept index the gateway answers at once and starts its upstreams a few at a time: a call to one
    whose start is still queued starts it out of turn and waits for it (it failed at once, saying the server
    "did not come up within 60 s", when the call came before the server's supervisor had run)."""
    (tmp_path / "zoo.json").write_text(json.dumps([ZEBRA]))
    zoo = stub("zoo", "--no-builtins", "--tools", str(tmp_path / "zoo.json"))

    async def index_them(config):
        async with Client(gateway_stdio(config, tmp_path / "index")) as client:
            assert ids(await client.call_tool("search_tools", {"task": "count zebra stripes"}))[0] == \
                "zoo.count_zebra_stripes"

    anyio.run(index_them, write_config(tmp_path, {"alpha": stub("alpha"), "beta": stub("beta"), "zoo": zoo}))
    # the same servers, the first two slow to start: they hold both turns while zoo waits in the queue
    slow = write_config(tmp_path, {"alpha": stub("alpha", "--start-delay", "4"),
                                   "beta": stub("beta", "--start-delay", "4"), "zoo": zoo})

    async def call_first():
        async with Client(gateway_stdio(slow, tmp_path / "index")) as client:
            called = await client.call_tool("call_tool", {"name": "zoo.count_zebra_stripes",
                                                          "arguments": {"photo": "p.jpg"}})
            assert not called.is_error, called.content[0].text
            assert json.loads(called.content[0].text) == {"server": "zoo", "tool": "count_zebra_stripes",
                                                          "arguments": {"photo": "p.jpg"}}

    anyio.run(call_first)


def test_a_server_that_never_answers_the_handshake_is_named_for_that_not_for_its_command(tmp_path):
    """Its command started: the reason is the handshake that got no answer (a TimeoutError is an OSError, and
    it was reported as "cannot start the command")."""
    config = write_config(tmp_path, {"mute": {"command": "sh", "args": ["-c", "sleep 600"], "timeout": 1},
                                     "alpha": stub("alpha")})

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index", "--search-wait", "30")) as client:
            first = await client.call_tool("search_tools", {"task": "echo the text back", "k": 3})
            (mute,) = first.structured_content["not_searchable"]
            assert mute["server"] == "mute" and mute["status"] == "down", mute
            assert "no answer to the MCP handshake and tools/list within 10 s" in mute["reason"], mute
            assert "cannot start the command" not in mute["reason"]

    anyio.run(session)


def test_commands_that_are_not_mcp_servers_and_a_key_typo_get_reasons_that_say_so(tmp_path):
    """/bin/cat echoes the initialize request back (the reason was "MCPError: Method not found"); a command
    that exits at once gave "MCPError: Connection closed"; "comand" gave "needs 'command' or 'url'" with the
    did-you-mean only in the log (05_broken_config.py)."""
    config = write_config(tmp_path, {"cat": {"command": "cat"},
                                     "quits": {"command": "sh", "args": ["-c", "echo no config found >&2; exit 1"]},
                                     "typo": {"comand": "cat"}, "alpha": stub("alpha")})

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index", "--search-wait", "30")) as client:
            first = await client.call_tool("search_tools", {"task": "echo the text back", "k": 3})
            reasons = {down["server"]: down["reason"] for down in first.structured_content["not_searchable"]}
            assert reasons["cat"].startswith("it does not speak MCP (it answered the initialize request with "
                                             "Method not found)"), reasons
            assert reasons["quits"].startswith("its process exited (or closed its stdout) before the MCP "
                                               "handshake (its last words on stderr: 'no config found'"), reasons
            assert reasons["typo"].endswith("needs 'command' (a server the gateway starts over stdio) or 'url' "
                                            "(a streamable-HTTP endpoint); it has 'comand' (did you mean "
                                            "'command'?)"), reasons

    anyio.run(session)


def test_prompts_and_resources_listed_right_after_the_handshake_wait_for_servers_still_starting(tmp_path):
    """A host that lists once at connect got nothing from the servers still starting (they are not in any
    index): the lists now wait for them as a search does (--search-wait), and a server that comes up after
    the wait is still announced with list_changed. The wait is long enough for quick's start on a loaded
    machine (4 s was not, at a load of 10 on two cores); late never starts within it."""
    from mcp_types import PromptListChangedNotification

    gate = tmp_path / "gate"
    config = write_config(tmp_path, {"quick": stub("quick", "--start-delay", "1", "--extras"),
                                     "late": stub("late", "--start-gate", str(gate), "--extras")})
    heard = [anyio.Event()]

    async def on_message(message):
        if isinstance(message, PromptListChangedNotification):
            heard[-1].set()

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index", "--search-wait", "12"),
                          mode="legacy", message_handler=on_message) as client:
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            assert prompts == ["quick.greet"]  # late never came up within the wait
            resources = [str(r.uri) for r in (await client.list_resources()).resources]
            assert resources == ["toolscout://quick/stub://quick/readme"]
            gate.touch()
            with anyio.fail_after(30):  # quick's own coming up was announced too: listen until late's is
                while prompts == ["quick.greet"]:
                    await heard[-1].wait()
                    heard.append(anyio.Event())
                    prompts = [p.name for p in (await client.list_prompts(cache_mode="refresh")).prompts]
            assert sorted(prompts) == ["late.greet", "quick.greet"]

    anyio.run(session)
