"""Several hosts on one machine, one config: each host is the official MCP SDK client launching `toolscout
gateway CONFIG` over stdio (real processes), in front of mcp-server-time (PyPI) and stub servers
(tests/fixtures/mcp_stub.py). The first gateway owns the index; the others attach to it (gateway/hosts.py,
gateway/bridge.py). Hosts start together or one after another and quit in any order, the owner's included:
every host keeps searching and calling, and what one host's calls teach moves the others' rankings."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402

from gateways import learned_all, start_gateway, stdio_env, stop, stub, time_server, wait_for, wait_up, write_config  # noqa: E402
from traffic import RAIN_TASK, mixed  # noqa: E402

from toolscout.feedback import UsageLedger  # noqa: E402
from toolscout.spec import read_pipeline_config  # noqa: E402

pytestmark = pytest.mark.slow  # starts several gateways and their upstream servers

SCHEMA = {"type": "object", "properties": {"note": {"type": "string"}}}
DESK = [{"name": name, "description": description, "inputSchema": SCHEMA} for name, description in [
    ("get_forecast", "Get the weather forecast for a city for the next days."),
    ("current_weather", "Current temperature, wind and rain at a location."),
    ("send_email", "Send an email message to one or more recipients."),
    ("search_inbox", "Find emails in the inbox matching words."),
    ("create_event", "Create a calendar event with a title and a start time."),
    ("list_events", "List the calendar events of a day."),
    ("read_file", "Read a text file from disk."),
    ("stock_quote", "Latest stock price quote for a ticker symbol.")]]
# what one host's agent is seen doing: 12 differently worded requests per family, each served by its tool
# (rain by the stock quote: an odd choice no untaught ranking makes, so a move is the calls' doing)
TAUGHT = {"rain": "desk.stock_quote", "mail": "desk.send_email", "calendar": "desk.create_event",
          "files": "desk.read_file", "facts": "desk.list_events"}


class Host:
    """An MCP host (the SDK's client) running `toolscout gateway CONFIG` over stdio, in a task of its own, so
    hosts start and quit in any order. `pid` is its gateway's process id; `log`, where its stderr goes (if not the
    test's own)."""

    def __init__(self, config: Path, folder: Path, name: str, mode: str = "auto", log: Path | None = None):
        self.pid_file, self.log = folder / f"{name}.pid", log
        # the gateway's pid, then the gateway itself
        command = f'echo $$ > "{self.pid_file}"; exec "$0" "$@"' + (f' 2>>"{log}"' if log else "")
        self.params = StdioServerParameters(command="sh", args=[
            "-c", command, sys.executable, "-m", "toolscout", "gateway", str(config), "--index",
            str(folder / "index"), "--no-fsync",
            "--min-probability", "off"], env=stdio_env())  # ranks, not abstention, say what was shared
        self.name, self.mode = name, mode
        self.client = None
        self._quit, self._done = anyio.Event(), anyio.Event()

    @property
    def pid(self) -> int:
        return int(self.pid_file.read_text())

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with Client(self.params, mode=self.mode) as client:
                self.client = client
                task_status.started(self)
                await self._quit.wait()
        finally:
            self._done.set()

    async def quit(self) -> None:
        """The host closes the gateway, as a host does (its stdin, then SIGTERM 2 s later)."""
        self._quit.set()
        await self._done.wait()

    async def search(self, task: str, k: int = 5) -> list[str]:
        result = await self.client.call_tool("search_tools", {"task": task, "k": k})
        assert not result.is_error, f"{self.name}: {result.content[0].text}"
        return [t["id"] for t in result.structured_content["tools"]]

    async def call(self, tool_id: str, **arguments) -> dict:
        result = await self.client.call_tool("call_tool", {"name": tool_id, "arguments": arguments})
        assert not result.is_error, f"{self.name}: {result.content[0].text}"
        return result.structured_content

    async def teach(self) -> None:
        """Search each request of the traffic, then call the tool that served it, one the search showed (a call
        of a tool no search showed teaches nothing); no feedback is posted."""
        for event in mixed(TAUGHT, 12):
            assert event["tool_ids"][0] in await self.search(event["query"], k=50)
            await self.call(event["tool_ids"][0], note="x")

    async def searches_and_calls(self) -> int:
        """One search and call of each kind (a stub, mcp-server-time); the pid of the owner's alpha server's
        parent: the gateway that owns the index."""
        assert (await self.search("echo the text back", k=3))[0] == "alpha.echo"
        assert (await self.call("alpha.echo", text=self.name))["arguments"] == {"text": self.name}
        assert "time.get_current_time" in await self.search("what time is it in Tokyo right now", k=3)
        now = await self.call("time.get_current_time", timezone="Asia/Tokyo")
        assert now["timezone"] == "Asia/Tokyo" and now["datetime"].endswith("+09:00")  # mcp-server-time's answer
        return (await self.call("alpha.pid"))["ppid"]


async def ranked_first(host: Host, task: str, tool_id: str, within: float = 30.0) -> None:
    """Wait until `tool_id` ranks first for `task` through `host` (learning from calls runs in the background)."""
    deadline = time.monotonic() + within
    while (found := await host.search(task, k=3))[0] != tool_id:
        assert time.monotonic() < deadline, f"{tool_id} is not first for {task!r} through {host.name}: {found}"
        await anyio.sleep(0.2)  # polling the search itself: what is read is the ranking


def config_for(folder: Path) -> Path:
    (folder / "desk.json").write_text(json.dumps(DESK))
    return write_config(folder, {"time": time_server(), "alpha": stub("alpha"),
                                 "desk": stub("desk", "--no-builtins", "--tools", str(folder / "desk.json"))})


def owner_pid(folder: Path) -> int:
    return json.loads((folder / "index" / "gateway.attach").read_text())["pid"]


def taught(folder: Path) -> UsageLedger:
    """What the index learned, as the last gateway to own it saved it."""
    snapshot, _config = read_pipeline_config(folder / "index")
    return UsageLedger.load(snapshot / "feedback.json")


@pytest.mark.parametrize("mode, quits", [("legacy", "first"), ("auto", "second")])
def test_a_second_host_attaches_shares_the_index_and_learns_from_the_first_in_any_quitting_order(tmp_path, mode,
                                                                                                   quits):
    config = config_for(tmp_path)
    first, second = Host(config, tmp_path, "first", mode), Host(config, tmp_path, "second", mode)

    async def session():
        async with anyio.create_task_group() as hosts:
            await hosts.start(first.run)
            assert await first.searches_and_calls() == first.pid == owner_pid(tmp_path)
            assert (await first.search(RAIN_TASK, k=3))[0] != "desk.stock_quote"
            await hosts.start(second.run)  # finds the index held: attaches to the first
            assert await second.searches_and_calls() == first.pid  # served by the first's upstreams
            await second.teach()
            await ranked_first(first, RAIN_TASK, "desk.stock_quote")  # the second's calls moved the first's ranking
            leaving, staying = (first, second) if quits == "first" else (second, first)
            await leaving.quit()
            assert await staying.searches_and_calls() == staying.pid == owner_pid(tmp_path)
            assert (await staying.search(RAIN_TASK, k=3))[0] == "desk.stock_quote"  # nothing learned was lost
            await staying.quit()

    anyio.run(session)
    ledger = taught(tmp_path)  # each host taught as a source of its own, with its own searches' tasks
    assert [(source, len(usages)) for source, usages in ledger.usage("desk.stock_quote")] == [
        (f"session:local:{second.pid}", 12)]
    echoed = {source: [u.query for u in usages] for source, usages in ledger.usage("alpha.echo")}
    assert echoed["session:stdio"] == ["echo the text back"]
    assert echoed[f"session:local:{second.pid}"] == ["echo the text back"]


def test_hosts_started_together_share_one_new_index_and_go_on_when_its_owner_quits(tmp_path):
    config = config_for(tmp_path)
    hosts = [Host(config, tmp_path, name, "legacy") for name in ("one", "two", "three")]

    async def session():
        async with anyio.create_task_group() as running:
            async with anyio.create_task_group() as starting:  # all at once, on an index none has made yet
                for host in hosts:
                    starting.start_soon(running.start, host.run)
            owner = owner_pid(tmp_path)
            assert sorted(h.pid for h in hosts).count(owner) == 1
            for host in hosts:
                assert await host.searches_and_calls() == owner
            await hosts[1].teach()
            for host in hosts:
                await ranked_first(host, RAIN_TASK, "desk.stock_quote")
            leaving = next(h for h in hosts if h.pid == owner)
            await leaving.quit()  # one of the others takes the index over, the third attaches to it
            staying = [h for h in hosts if h is not leaving]
            for host in staying:
                assert await host.searches_and_calls() == owner_pid(tmp_path) != owner
                assert (await host.search(RAIN_TASK, k=3))[0] == "desk.stock_quote"
            assert owner_pid(tmp_path) in [h.pid for h in staying]
            for host in staying:
                await host.quit()

    anyio.run(session)
    assert not (tmp_path / "index" / "gateway.attach").exists()  # the last owner cleaned up after itself


def test_a_stdio_host_attaches_to_a_gateway_serving_http_on_the_same_index(tmp_path):
    config = config_for(tmp_path)
    proc, url = start_gateway(config, tmp_path / "index")
    host = Host(config, tmp_path, "stdio")
    try:
        wait_up(url, ["time", "alpha", "desk"], proc)

        async def session():
            async with anyio.create_task_group() as hosts:
                await hosts.start(host.run)
                assert await host.searches_and_calls() == proc.pid
                await host.quit()

        anyio.run(session)
        wait_for(lambda: learned_all(url), "the stdio host's call to be learned", 30, proc)
        echo = httpx.get(f"{url}/tools/alpha.echo", timeout=10).json()["feedback"]
        assert echo["learned"] == 1 and echo["sources"] == 1  # the stdio host's call, learned by the HTTP gateway
        refused = _run_gateway(config, tmp_path / "index", "--port", "1")  # HTTP needs an index of its own
        assert refused.returncode != 0
        assert f"the gateway of pid {proc.pid} holds this index" in refused.stderr
        # and what a team can do instead: the start order, an index of its own, or replicas
        assert "Start the HTTP gateway first" in refused.stderr and "--index DIR" in refused.stderr
        assert "--store DSN" in refused.stderr
    finally:
        stop(proc)


def _run_gateway(config: Path, index: Path, *flags: str):
    import subprocess

    return subprocess.run([sys.executable, "-m", "toolscout", "gateway", str(config), "--index", str(index), *flags],
                          capture_output=True, text=True, timeout=120, env=stdio_env())


def test_a_search_made_through_the_owner_that_quit_teaches_the_call_made_after_the_take_over(tmp_path):
    config = config_for(tmp_path)
    first, second = Host(config, tmp_path, "first", "legacy"), Host(config, tmp_path, "second", "legacy")

    async def session():
        async with anyio.create_task_group() as hosts:
            await hosts.start(first.run)
            await hosts.start(second.run)
            assert (await second.search("echo the text back", k=3))[0] == "alpha.echo"  # the first serves it
            await first.quit()  # the second's gateway takes the index over
            assert (await second.call("alpha.echo", text="after"))["arguments"] == {"text": "after"}
            assert (await second.call("alpha.pid"))["ppid"] == second.pid == owner_pid(tmp_path)
            await second.quit()

    anyio.run(session)
    echoed = {source: [u.query for u in usages] for source, usages in taught(tmp_path).usage("alpha.echo")}
    assert echoed == {f"session:local:{second.pid}": ["echo the text back"]}  # its own search, its own source


async def logged(host: Host, words: str, within: float = 60.0) -> None:
    """Wait until the host's gateway says `words` on its stderr."""
    with anyio.fail_after(within):
        while not (host.log.exists() and words in host.log.read_text()):
            await anyio.sleep(0.05)  # polling the log for the line itself


def test_requests_sent_while_the_owner_quits_wait_for_the_next_and_a_call_it_cut_says_if_calling_again_is_safe(
        tmp_path):
    config = config_for(tmp_path)
    first = Host(config, tmp_path, "first", "legacy")
    second = Host(config, tmp_path, "second", "legacy", log=tmp_path / "second.log")

    async def session():
        async with anyio.create_task_group() as hosts:
            await hosts.start(first.run)
            await hosts.start(second.run)
            assert (await second.call("alpha.pid"))["ppid"] == first.pid
            sleeping, cut = anyio.Event(), []

            async def started(progress, total, message):
                sleeping.set()

            async def long_call():
                cut.append(await second.client.call_tool(
                    "call_tool", {"name": "alpha.sleep", "arguments": {"seconds": 60}}, progress_callback=started))

            hosts.start_soon(long_call)
            await sleeping.wait()
            hosts.start_soon(first.quit)  # the first stops: its calls in flight get their grace, then are cut
            await logged(second, f"the gateway served by pid {first.pid} stops")
            # sent while the first still stops (the long call is in its grace): it waits for the next owner
            with anyio.fail_after(120):
                assert (await second.call("alpha.pid"))["ppid"] == second.pid == owner_pid(tmp_path)
            text = cut[0].content[0].text
            assert cut[0].is_error and f"(pid {first.pid}) stopped while the call of alpha.sleep ran" in text
            assert "call it again only if running it twice is safe" in text and "shutting down" not in text
            await second.quit()

    anyio.run(session)


def test_a_call_in_flight_when_the_owner_is_killed_gets_an_error_and_the_host_goes_on(tmp_path):
    from mcp.shared.exceptions import MCPError

    config = config_for(tmp_path)
    first, second = Host(config, tmp_path, "first", "legacy"), Host(config, tmp_path, "second", "legacy")

    async def session():
        async with anyio.create_task_group() as hosts:
            await hosts.start(first.run)
            await hosts.start(second.run)
            assert await second.searches_and_calls() == first.pid
            sleeping = anyio.Event()

            async def started(progress, total, message):
                sleeping.set()

            async def kill_when_sleeping():
                await sleeping.wait()
                os.kill(first.pid, signal.SIGKILL)  # the owner dies with the call in flight

            hosts.start_soon(kill_when_sleeping)
            with pytest.raises(MCPError, match=f"pid {first.pid}.* stopped before it answered tools/call.*"
                                                "only if running it twice is safe"):
                await second.client.call_tool("call_tool", {"name": "alpha.sleep", "arguments": {"seconds": 5}},
                                              progress_callback=started)
            assert await second.searches_and_calls() == second.pid == owner_pid(tmp_path)  # it took over
            await first.quit()
            await second.quit()

    anyio.run(session)


class RawHost:
    """A host that speaks JSON-RPC to `toolscout gateway CONFIG` over its stdin and stdout itself (the 2025
    protocol), so a test reads what the SDK's client hides: the gateway's exit status and stderr."""

    def __init__(self, config: Path, folder: Path, name: str):
        import subprocess

        self.stderr = folder / f"{name}.stderr"
        self.proc = subprocess.Popen([sys.executable, "-m", "toolscout", "gateway", str(config), "--index",
                                      str(folder / "index"), "--no-fsync"], env=stdio_env(), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr.open("w"))
        self._ids = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": name, "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict, timeout: float = 120) -> dict:
        import select

        self._ids += 1
        self._send({"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            assert select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0], \
                f"no answer to {method} within {timeout:.0f} s: {self.stderr.read_text()[-2000:]}"
            message = json.loads(self.proc.stdout.readline())
            if message.get("id") == self._ids:
                return message

    def served_by(self) -> int:
        """The pid of the gateway whose alpha server answered: the owner of the index."""
        answer = self.request("tools/call", {"name": "call_tool", "arguments": {"name": "alpha.pid", "arguments": {}}})
        return answer["result"]["structuredContent"]["ppid"]

    def quit(self) -> int:
        """Close the gateway's stdin, as a host does; its exit status."""
        self.proc.stdin.close()
        return self.proc.wait(60)


def test_a_gateway_that_took_the_index_over_exits_quietly_when_its_host_quits(tmp_path):
    config = config_for(tmp_path)
    first = RawHost(config, tmp_path, "first")
    second = None
    try:
        assert first.served_by() == first.proc.pid
        second = RawHost(config, tmp_path, "second")
        assert second.served_by() == first.proc.pid  # attached to the first
        assert first.quit() == 0
        assert second.served_by() == second.proc.pid  # took the index over
        assert second.quit() == 0, second.stderr.read_text()
        assert "Traceback" not in second.stderr.read_text()
    finally:
        for host in (first, second):
            if host is not None and host.proc.poll() is None:
                host.proc.kill()
