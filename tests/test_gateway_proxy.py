"""The gateway as a complete MCP proxy, end to end with the official MCP SDK client: what the protocol carries
besides tool calls passes through to real third-party servers (the npm "everything" server: prompts,
resources, progress, a long-running tool, elicitation), a hung server is restarted, a server whose config
cannot be resolved is down by name while the others serve, and limits, shutdown and a server's last words
read as MCP clients and people need them. The everything server's stdin is tapped (`tee`) so the tests read
what the gateway actually sent it."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx
import pytest

pytest.importorskip("mcp")
import httpx2  # noqa: E402
import mcp_types as types  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from gateways import (  # noqa: E402
    everything_tapped,
    gateway_stdio,
    npm_everything,
    sent_upstream,
    start_gateway,
    stop,
    stub,
    time_server,
    upstreams,
    wait_for,
    wait_up,
    write_config,
)

pytestmark = pytest.mark.slow  # starts gateways and upstream servers

NO_NPM = "npm is not installed here: the npm reference server cannot be installed"


@pytest.fixture(scope="module")
def reference():
    """What the everything server itself says, asked directly (no gateway): the figures to compare with."""
    everything = npm_everything()
    if everything is None:
        pytest.skip(NO_NPM)

    async def ask():
        async with Client(StdioServerParameters(command=str(everything), args=["stdio"])) as direct:
            resources = [r.uri for r in (await direct.list_resources()).resources]
            prompt = await direct.get_prompt("args-prompt", {"city": "Paris", "state": "Texas"})
            completed = await direct.complete(types.PromptReference(type="ref/prompt", name="completable-prompt"),
                                              {"name": "department", "value": "E"})
            return {"prompts": [p.name for p in (await direct.list_prompts()).prompts], "resources": resources,
                    "completion": completed.completion.values,
                    "templates": [t.uri_template for t in (await direct.list_resource_templates()).resource_templates],
                    "prompt": [m.content.text for m in prompt.messages],
                    "document": (await direct.read_resource(resources[0])).contents[0].text}

    return anyio.run(ask)


async def listed_prompts(client) -> list[str]:
    """The gateway's prompts once the everything server has listed them (the gateway starts it: poll)."""
    deadline = time.monotonic() + 120
    while True:
        names = [p.name for p in (await client.list_prompts()).prompts]
        if names:
            return names
        assert time.monotonic() < deadline, "the everything server's prompts never reached the gateway"
        await anyio.sleep(0.2)


async def check_prompts_and_resources(client, reference) -> None:
    assert await listed_prompts(client) == [f"everything.{name}" for name in reference["prompts"]]
    resources = [r.uri for r in (await client.list_resources()).resources]
    assert resources == [f"toolscout://everything/{uri}" for uri in reference["resources"]]
    templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
    assert templates == [f"toolscout://everything/{t}" for t in reference["templates"]]
    prompt = await client.get_prompt("everything.args-prompt", {"city": "Paris", "state": "Texas"})
    assert [m.content.text for m in prompt.messages] == reference["prompt"]
    read = await client.read_resource(resources[0])
    assert (read.contents[0].uri, read.contents[0].text) == (resources[0], reference["document"])
    raw = await client.read_resource(reference["resources"][0])  # a URI as the server gave it works too
    assert raw.contents[0].text == reference["document"]
    dynamic = await client.read_resource("toolscout://everything/demo://resource/dynamic/text/7")  # a template's
    assert dynamic.contents[0].text.startswith("Resource 7:")
    completed = await client.complete(types.PromptReference(type="ref/prompt", name="everything.completable-prompt"),
                                      {"name": "department", "value": "E"})
    assert completed.completion.values == reference["completion"]
    with pytest.raises(MCPError, match="no prompt 'nowhere.x'"):
        await client.get_prompt("nowhere.x")
    with pytest.raises(MCPError, match="upstream 'everything' refused resources/read: .*demo://nope"):
        await client.read_resource("toolscout://everything/demo://nope")  # the server's own error, named


async def check_progress_and_cancellation(client, wire: Path) -> None:
    seen: list[tuple[float, float | None]] = []

    async def progress(value, total, _message):
        seen.append((value, total))

    done = await client.call_tool("call_tool", {"name": "everything.trigger-long-running-operation",
                                                "arguments": {"duration": 0.4, "steps": 4}}, progress_callback=progress)
    assert not done.is_error and "Steps: 4" in done.content[0].text
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]  # the server's own progress, with the client's token

    started = anyio.Event()

    async def first_step(_value, _total, _message):
        started.set()

    async with anyio.create_task_group() as tasks:
        async def long_call():
            await client.call_tool("call_tool", {"name": "everything.trigger-long-running-operation",
                                                 "arguments": {"duration": 60, "steps": 120}},
                                   progress_callback=first_step)
        tasks.start_soon(long_call)
        with anyio.fail_after(30):
            await started.wait()  # the call is running upstream: it has reported progress
        cancelled_at = time.monotonic()
        tasks.cancel_scope.cancel()
    assert time.monotonic() - cancelled_at < 1  # the client has its answer at once

    def upstream_cancelled():
        sent = sent_upstream(wire)
        calls = [m["id"] for m in sent if m.get("method") == "tools/call"
                 and m["params"].get("arguments", {}).get("duration") == 60]
        return calls and any(m.get("method") == "notifications/cancelled" and m["params"]["requestId"] == calls[0]
                             for m in sent)

    deadline = time.monotonic() + 10
    while not upstream_cancelled():
        assert time.monotonic() < deadline, "the everything server was never told the call was cancelled"
        await anyio.sleep(0.1)
    after = await client.call_tool("call_tool", {"name": "everything.get-sum", "arguments": {"a": 2, "b": 40}})
    assert "42" in after.content[0].text


async def elicited(context, params):
    """The user's answer to the everything server's question, as a host would give it."""
    assert "Please provide inputs" in params.message
    return types.ElicitResult(action="accept", content={"name": "Ada Lovelace", "check": True})


async def check_elicitation(client) -> None:
    answered = await client.call_tool("call_tool", {"name": "everything.trigger-elicitation-request",
                                                    "arguments": {}})
    assert not answered.is_error and "Ada Lovelace" in json.dumps([c.model_dump() for c in answered.content])


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the 2026 protocol, and the 2025 one hosts speak today
def test_prompts_resources_progress_cancellation_and_elicitation_over_stdio(tmp_path, reference, mode):
    wire = tmp_path / "wire.jsonl"
    config = write_config(tmp_path, {"everything": everything_tapped(wire)})

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index"), mode=mode,
                          elicitation_callback=elicited) as client:
            await check_prompts_and_resources(client, reference)
            await check_progress_and_cancellation(client, wire)
            if mode == "legacy":  # the 2026 protocol has no server-to-client requests to pass on
                await check_elicitation(client)
            else:  # the server hears why its question went unanswered
                refused = await client.call_tool("call_tool", {"name": "everything.trigger-elicitation-request",
                                                               "arguments": {}})
                said = json.dumps([c.model_dump() for c in refused.content])
                assert "no client whose request is in flight can answer it" in said, said

    anyio.run(session)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_prompts_resources_progress_cancellation_and_elicitation_over_http(tmp_path, reference, mode):
    wire = tmp_path / "wire.jsonl"
    config = write_config(tmp_path, {"everything": everything_tapped(wire)})
    proc, url = start_gateway(config, tmp_path / "index")
    try:
        async def session():
            async with Client(f"{url}/mcp", mode=mode, elicitation_callback=elicited) as client:
                await check_prompts_and_resources(client, reference)
                await check_progress_and_cancellation(client, wire)
                if mode == "legacy":
                    await check_elicitation(client)

        anyio.run(session)
    finally:
        stop(proc)


def test_hosts_over_http_are_told_when_an_upstream_brings_prompts_and_only_of_servers_their_token_sees(tmp_path):
    """Hosts list prompts once, at connect, before slow servers are up: they are told when the prompts come
    (the first listing was not announced), through capabilities that say so over HTTP (the streamable-HTTP
    handshake said no list ever changes), and only about servers their token may see."""
    everything = npm_everything()
    if everything is None:
        pytest.skip(NO_NPM)
    config = write_config(tmp_path, {  # both come up after the hosts connected, e1 well before e2
        "e1": {"command": "sh", "args": ["-c", f'sleep 2; exec "{everything}" stdio']},
        "e2": {"command": "sh", "args": ["-c", f'sleep 8; exec "{everything}" stdio']}})
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"token": "alice-token-1", "name": "alice", "namespaces": ["e1"]},
                                             {"token": "bob-token-2", "name": "bob", "namespaces": ["e2"]}]}))
    proc, url = start_gateway(config, tmp_path / "index", "--tokens", str(tokens), "--search-wait", "0")
    heard: dict[str, list[str]] = {"alice": [], "bob": []}

    def host(token: str, who: str):
        async def on_message(message):
            if isinstance(message, (types.PromptListChangedNotification, types.ResourceListChangedNotification)):
                heard[who].append(type(message).__name__)

        transport = streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"}, timeout=60))
        return Client(transport, mode="legacy", message_handler=on_message)

    try:
        async def session():
            async with host("alice-token-1", "alice") as alice, host("bob-token-2", "bob") as bob:
                for client in (alice, bob):
                    capabilities = client.server_capabilities
                    assert capabilities.prompts.list_changed and capabilities.resources.list_changed
                    assert (await client.list_prompts()).prompts == []  # at connect: e1 is not up yet
                with anyio.fail_after(60):
                    while "PromptListChangedNotification" not in heard["alice"]:
                        await anyio.sleep(0.1)
                names = [p.name for p in (await alice.list_prompts(cache_mode="refresh")).prompts]
                assert names and all(name.startswith("e1.") for name in names)
                with anyio.fail_after(60):  # e2's prompts: bob hears of them, after e1's would have come
                    while "PromptListChangedNotification" not in heard["bob"]:
                        await anyio.sleep(0.1)
                names = [p.name for p in (await bob.list_prompts(cache_mode="refresh")).prompts]
                assert names and all(name.startswith("e2.") for name in names)
                # one stream carries bob's notifications in order: e1's change (not his business) never came
                assert heard["bob"].count("PromptListChangedNotification") == 1, heard["bob"]

        anyio.run(session)
    finally:
        stop(proc)


@pytest.mark.filterwarnings("ignore:resources/(un)?subscribe is removed")
@pytest.mark.parametrize("mode", ["auto", "legacy"])  # a listen stream naming the resource / resources/subscribe
def test_a_resource_subscription_passes_through_and_its_updates_come_back(tmp_path, reference, mode):
    wire = tmp_path / "wire.jsonl"
    config = write_config(tmp_path, {"everything": everything_tapped(wire)})
    uri = f"toolscout://everything/{reference['resources'][0]}"
    updates: list[str] = []
    updated = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)
            updated.set()

    async def toggle_and_wait(client):
        subscribed = {"method": "resources/subscribe", "uri": reference["resources"][0]}
        assert subscribed in [{"method": m.get("method"), "uri": (m.get("params") or {}).get("uri")}
                              for m in sent_upstream(wire)]  # one subscription upstream, in its own URI
        await client.call_tool("call_tool", {"name": "everything.toggle-subscriber-updates", "arguments": {}})
        with anyio.fail_after(15):  # the server sends one update at once, then every 5 s
            await updated.wait()
        assert updates[0] == uri  # named as the client subscribed to it

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index"), mode=mode, message_handler=on_message) as client:
            await listed_prompts(client)
            if mode == "legacy":
                await client.subscribe_resource(uri)
                await toggle_and_wait(client)
                await client.unsubscribe_resource(uri)
                return
            async with client.listen(resource_subscriptions=[uri]) as events:
                async def heard():
                    async for event in events:
                        updates.append(event.uri)
                        updated.set()
                        return
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(heard)
                    await toggle_and_wait(client)
            deadline = time.monotonic() + 10  # the listen stream ended: the gateway unsubscribes upstream
            while not any(m.get("method") == "resources/unsubscribe" for m in sent_upstream(wire)):
                assert time.monotonic() < deadline, "the gateway never unsubscribed upstream"
                await anyio.sleep(0.1)

    anyio.run(session)
    # the server keeps running after its stdin closes (its update timer holds it): the gateway, closed by its host,
    # still stops it (the host's SIGTERM, 2 s after closing the gateway's stdin, does not cut that short)
    wait_for(lambda: not _running_with(str(wire)), "the everything server to be stopped with the gateway", 15)


def _running_with(text: str) -> bool:
    """Whether a process whose command line holds `text` is running (Linux's /proc)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                return True
        except OSError:  # it ended meanwhile
            continue
    return False


# ------------------------------------------------------------------------------------------ health

def test_a_hung_upstream_is_restarted_within_30_s_failing_its_calls_by_name_meanwhile(tmp_path):
    config = write_config(tmp_path, {"alpha": stub("alpha"), "beta": stub("beta")})
    proc, url = start_gateway(config, tmp_path / "index")  # the default pings: every 10 s, 5 s each
    try:
        wait_up(url, ["alpha", "beta"], proc)
        call = lambda tool, **arguments: httpx.post(f"{url}/tools/{tool}/call", json={"arguments": arguments},  # noqa
                                                    timeout=120)
        pid = call("alpha.pid").json()["structuredContent"]["pid"]
        wedged: dict = {}
        started = time.monotonic()
        thread = threading.Thread(target=lambda: wedged.update(response=call("alpha.wedge")))
        thread.start()  # alpha stays alive and answers nothing from now on, pings included
        saw_down = False
        while True:
            state = upstreams(url)["alpha"]
            if state["state"] == "down" and not saw_down:
                saw_down = True
                assert "stopped answering" in state["last_error"], state
                asked = time.monotonic()
                refused = call("alpha.echo", text="meanwhile")
                assert time.monotonic() - asked < 3  # no waiting for the hung server's timeout
                assert refused.status_code == 200 or "'alpha'" in refused.json()["error"]["message"]
            before = time.monotonic()
            other = call("beta.echo", text="unaffected")
            assert other.status_code == 200 and time.monotonic() - before < 2
            if state["state"] == "up" and state["connects"] == 2:
                break
            assert time.monotonic() - started < 30, f"alpha not serving again within 30 s: {state}"
            time.sleep(0.2)  # polling interval: the state is what /health says
        again = call("alpha.pid").json()
        assert again["structuredContent"]["pid"] != pid and time.monotonic() - started < 30
        assert saw_down and upstreams(url)["alpha"]["restarts_for_hangs"] == 1
        thread.join(30)
        message = wedged["response"].json()["error"]["message"]  # the call in flight failed, naming the server
        assert wedged["response"].status_code == 502 and "upstream 'alpha' stopped answering" in message
    finally:
        stop(proc)


# ----------------------------------------------------------------------------- unresolvable config

def test_an_unset_variable_and_a_missing_command_leave_the_others_serving_and_are_named(tmp_path):
    env_name = "TOOLSCOUT_TEST_UNSET_TOKEN"
    assert env_name not in os.environ
    config = write_config(tmp_path, {"secret": stub("secret", env={"TOKEN": "${" + env_name + "}"}),
                                     "ghost": {"command": "no-such-mcp-server-for-toolscout"},
                                     "time": time_server()})
    proc, url = start_gateway(config, tmp_path / "index")
    try:
        wait_up(url, ["time"], proc)
        health = upstreams(url)
        assert health["secret"]["state"] == health["ghost"]["state"] == "down"
        assert f"the environment variable {env_name} is not set" in health["secret"]["last_error"]
        assert "mcpServers.secret.env.TOKEN" in health["secret"]["last_error"]
        assert "the command 'no-such-mcp-server-for-toolscout' was not found" in health["ghost"]["last_error"]
        secret = httpx.post(f"{url}/tools/secret.echo/call", json={"arguments": {"text": "x"}})
        assert secret.status_code == 502
        assert "its server 'secret' is down: not started: " in secret.json()["error"]["message"]
        assert env_name in secret.json()["error"]["message"]

        async def over_mcp():
            async with Client(f"{url}/mcp") as client:
                ghost = await client.call_tool("call_tool", {"name": "ghost.anything", "arguments": {}})
                assert ghost.is_error and "server 'ghost' is down" in ghost.content[0].text
                assert "no-such-mcp-server-for-toolscout" in ghost.content[0].text
                now = await client.call_tool("call_tool", {"name": "time.get_current_time",
                                                           "arguments": {"timezone": "UTC"}})
                assert not now.is_error and now.structured_content["timezone"] == "UTC"

        anyio.run(over_mcp)
    finally:
        stop(proc)
    strict = subprocess.run([sys.executable, "-m", "toolscout", "gateway", str(config), "--index",
                             str(tmp_path / "strict-index"), "--strict"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 1 and env_name in strict.stderr and not (tmp_path / "strict-index").exists()


def test_a_known_tool_of_a_server_still_starting_waits_for_it_after_a_restart(tmp_path):
    config = write_config(tmp_path, {"late": stub("late", "--start-delay", "5")})
    proc, url = start_gateway(config, tmp_path / "index")
    try:
        wait_up(url, ["late"], proc)
    finally:
        stop(proc)
    proc, url = start_gateway(config, tmp_path / "index")  # the same index: late.echo is known at once
    try:
        assert upstreams(url)["late"]["state"] == "starting"
        called = httpx.post(f"{url}/tools/late.echo/call", json={"arguments": {"text": "waited"}}, timeout=60)
        assert called.status_code == 200 and called.json()["structuredContent"]["arguments"] == {"text": "waited"}
        unknown = httpx.post(f"{url}/tools/late.nope/call", json={"arguments": {}}, timeout=60)
        assert unknown.status_code == 404 and "no tool 'late.nope'" in unknown.json()["error"]["message"]
    finally:
        stop(proc)


# ------------------------------------------------------------------------------- limits, shutdown, logs

def mcp_client(url: str) -> Client:
    return Client(streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(timeout=60)))


def test_the_mcp_body_limit_is_its_own_answers_a_json_rpc_error_and_takes_real_payloads(tmp_path):
    config = write_config(tmp_path, {"alpha": stub("alpha")})
    proc, url = start_gateway(config, tmp_path / "index", "--mcp-max-body", str(3 << 20))
    try:
        wait_up(url, ["alpha"], proc)

        async def session():
            async with mcp_client(url) as client:
                image = "A" * (2 << 20)  # a 2 MiB base64 payload: twice the API's own body limit
                echoed = await client.call_tool("call_tool", {"name": "alpha.echo", "arguments": {"text": image}})
                assert echoed.structured_content["arguments"]["text"] == image
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("call_tool", {"name": "alpha.echo", "arguments": {"text": "A" * (4 << 20)}})
                assert f"{3 << 20} bytes (the server's --mcp-max-body)" in str(refused.value)
                again = await client.call_tool("call_tool", {"name": "alpha.echo", "arguments": {"text": "small"}})
                assert again.structured_content["arguments"] == {"text": "small"}  # the session goes on

        anyio.run(session)
        api = httpx.post(f"{url}/search", json={"query": "x" * (2 << 20)})
        assert api.status_code == 413 and api.json()["error"]["type"] == "payload_too_large"  # --max-body, as before
    finally:
        stop(proc)


def test_sigterm_answers_every_call_in_flight_with_an_error_within_2_s(tmp_path):
    config = write_config(tmp_path, {"alpha": stub("alpha")})
    proc, url = start_gateway(config, tmp_path / "index")
    try:
        wait_up(url, ["alpha"], proc)
        pid = httpx.post(f"{url}/tools/alpha.pid/call", json={}).json()["structuredContent"]["pid"]
        answers: dict = {}

        async def callers():
            async def rest(i):
                async with httpx.AsyncClient(timeout=60) as http:
                    r = await http.post(f"{url}/tools/alpha.sleep/call", json={"arguments": {"seconds": 30}})
                answers[f"rest{i}"] = (time.monotonic(), r.status_code, r.json())

            async def mcp():
                async with mcp_client(url) as client:
                    r = await client.call_tool("call_tool", {"name": "alpha.sleep", "arguments": {"seconds": 30}})
                answers["mcp"] = (time.monotonic(), r.is_error, r.content[0].text)

            async with anyio.create_task_group() as tasks:
                for i in range(3):
                    tasks.start_soon(rest, i)
                tasks.start_soon(mcp)
                with anyio.fail_after(30):
                    while (await anyio.to_thread.run_sync(lambda: httpx.get(f"{url}/health").json()))[
                            "calls_in_flight"] < 4:
                        await anyio.sleep(0.05)  # polling: /health counts the calls the gateway is forwarding
                answers["signal"] = time.monotonic()
                proc.send_signal(signal.SIGTERM)

        anyio.run(callers)
        for i in range(3):
            at, status, body = answers[f"rest{i}"]
            assert at - answers["signal"] < 2 and status == 503, body
            assert "the gateway is shutting down" in body["error"]["message"]
        at, is_error, text = answers["mcp"]
        assert at - answers["signal"] < 2 and is_error and "the gateway is shutting down" in text
        assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn ends by the signal it handled, as is the custom
        wait_for(lambda: not _alive(pid), "the upstream to be stopped with the gateway", 10)
    finally:
        if proc.poll() is None:
            stop(proc)


def test_sigterm_gives_mcp_sessions_over_http_the_grace_then_the_error(tmp_path):
    """A 2025-protocol client over HTTP (a session, answers as event streams): a call that ends within the
    grace gets its result, a longer one the shutting-down error, not a stream cut at the signal."""
    config = write_config(tmp_path, {"alpha": stub("alpha")})
    proc, url = start_gateway(config, tmp_path / "index")
    answers: dict = {}
    try:
        wait_up(url, ["alpha"], proc)

        async def session():
            async with Client(streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(timeout=60)),
                              mode="legacy") as client:
                started = {seconds: anyio.Event() for seconds in (1, 30)}

                async def sleep(seconds):
                    async def progress(_value, _total, _message):
                        started[seconds].set()
                    try:
                        call = {"name": "alpha.sleep", "arguments": {"seconds": seconds}}
                        r = await client.call_tool("call_tool", call, progress_callback=progress)
                        answers[seconds] = (time.monotonic(), r.is_error, r.content[0].text)
                    except MCPError as exc:
                        answers[seconds] = (time.monotonic(), True, f"MCPError: {exc}")

                async with anyio.create_task_group() as tasks:
                    for seconds in started:
                        tasks.start_soon(sleep, seconds)
                    with anyio.fail_after(30):
                        for event in started.values():  # alpha said (through the gateway) that each call is under way
                            await event.wait()
                    answers["signal"] = time.monotonic()
                    proc.send_signal(signal.SIGTERM)

        anyio.run(session)
        at, is_error, text = answers[1]
        assert not is_error and json.loads(text) == {"slept": 1}, text  # it ended within the grace of 1.5 s
        at, is_error, text = answers[30]
        assert at - answers["signal"] < 2.5 and is_error and "the gateway is shutting down" in text, text
        assert proc.wait(15) in (0, -signal.SIGTERM)
        assert "without completing response" not in Path(proc.log_path).read_text()  # no stream cut short
    finally:
        stop(proc)  # if it still runs; and its log goes


def test_sigterm_of_a_stdio_gateway_answers_its_host_before_it_goes(tmp_path):
    config = write_config(tmp_path, {"alpha": stub("alpha")})
    answers: dict = {}

    async def session():
        async with Client(gateway_stdio(config, tmp_path / "index")) as client:
            deadline = time.monotonic() + 120
            while (found := await client.call_tool("call_tool", {"name": "alpha.pid", "arguments": {}})).is_error:
                assert time.monotonic() < deadline, found.content[0].text  # alpha is still starting: poll
                await anyio.sleep(0.2)
            gateway_pid = found.structured_content["ppid"]  # alpha's parent is the gateway

            sleeping = [anyio.Event(), anyio.Event()]

            async def slow(i):
                async def started(_value, _total, _message):
                    sleeping[i].set()
                r = await client.call_tool("call_tool", {"name": "alpha.sleep", "arguments": {"seconds": 30}},
                                           progress_callback=started)
                answers[i] = (time.monotonic(), r.is_error, r.content[0].text)

            async with anyio.create_task_group() as tasks:
                for i in range(2):
                    tasks.start_soon(slow, i)
                with anyio.fail_after(30):
                    for event in sleeping:  # alpha said (through the gateway) that each call is under way
                        await event.wait()
                answers["signal"] = time.monotonic()
                os.kill(gateway_pid, signal.SIGTERM)

    anyio.run(session)
    for i in range(2):
        at, is_error, text = answers[i]
        assert at - answers["signal"] < 2 and is_error and "the gateway is shutting down" in text, text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_last_words_come_from_the_crash_and_stdout_noise_costs_one_log_line(tmp_path):
    config = write_config(tmp_path, {"alpha": stub("alpha")})
    proc, url = start_gateway(config, tmp_path / "index")
    try:
        wait_up(url, ["alpha"], proc)
        call = lambda tool, **arguments: httpx.post(f"{url}/tools/{tool}/call", json={"arguments": arguments})  # noqa
        complained = call("alpha.complain", text="Traceback: complaint about an earlier call")
        assert complained.json()["isError"] is True
        assert call("alpha.noise", lines=50).json()["structuredContent"] == {"noise": 50}
        assert call("alpha.echo", text="still here").json()["structuredContent"]["arguments"] == {"text": "still here"}
        crashed = call("alpha.crash", text="fatal: out of cheese")
        message = crashed.json()["error"]["message"]
        assert crashed.status_code == 502 and "'fatal: out of cheese'" in message and "complaint" not in message
        wait_for(lambda: "out of cheese" in (upstreams(url)["alpha"]["last_error"] or ""), "alpha's last words", 30)
        log = Path(proc.log_path).read_text()
        assert sum("not JSON-RPC" in line for line in log.splitlines()) == 1
        assert "Traceback" not in log
    finally:
        stop(proc)
