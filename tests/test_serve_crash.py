"""A server killed (SIGKILL) in the middle of a stream of writes restarts with every acknowledged write;
a server stopped with SIGTERM saves a snapshot and leaves an empty journal. Real subprocesses."""

import os
import signal
import socket

import pytest
import threading
import time

import httpx
from servers import free_port, start_server

from toolscout import ToolScout
from toolscout.serve.journal import JOURNAL, Journal

pytestmark = pytest.mark.slow  # starts and kills servers

TOKEN = "crash-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def start_server_at(folder, port):
    return start_server([str(folder)], port=port, token=TOKEN)[0]


def crash_state(port):
    r = httpx.get(f"http://127.0.0.1:{port}/tools", params={"namespace": "crash", "limit": 1000}, timeout=10)
    return {t["id"]: t["description"] for t in r.json()["tools"]}


def test_sigkill_during_writes_keeps_every_acknowledged_write(tmp_path, tools):
    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(folder)
    port = free_port()
    server = start_server_at(folder, port)
    acknowledged: dict[str, str | None] = {}  # id -> description (None: deleted), acknowledged ops only
    in_flight: list[tuple[str, str | None]] = []
    count = [0]

    def writer():
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=10) as client:
            i = 0
            while True:
                if i % 3 == 2:  # delete the tool written two steps before
                    op = (f"crash.t{i - 2}", None)
                else:
                    op = (f"crash.t{i}", f"Crash test tool number {i} that counts sheep")
                in_flight[:] = [op]
                try:
                    if op[1] is None:
                        r = client.delete(f"/tools/{op[0]}")
                    else:
                        r = client.put(f"/tools/{op[0]}", json={"name": f"t{i}", "namespace": "crash",
                                                                "description": op[1]})
                except httpx.HTTPError:
                    return  # the server died with this request in flight
                assert r.status_code == 200, r.text
                acknowledged[op[0]] = op[1]
                count[0] += 1
                i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    while count[0] < 20 and thread.is_alive():
        time.sleep(0.01)
    server.send_signal(signal.SIGKILL)  # while the writer keeps writing
    server.wait()
    thread.join()
    assert count[0] >= 20

    expected = {tid: desc for tid, desc in acknowledged.items() if desc is not None}
    restarted = start_server_at(folder, port)
    try:
        state = crash_state(port)
        tid, desc = in_flight[0]  # the write in flight at the kill may or may not have been made durable
        maybe = dict(expected)
        if desc is None:
            maybe.pop(tid, None)
        else:
            maybe[tid] = desc
        assert state in (expected, maybe)
        last = max(expected, key=lambda t: int(t.rsplit("t", 1)[1]))
        r = httpx.post(f"http://127.0.0.1:{port}/search", json={"query": f"crash test tool number {last[7:]}"})
        assert last in [h["id"] for h in r.json()["results"][0]["hits"]]
    finally:
        restarted.send_signal(signal.SIGTERM)  # graceful: writes a snapshot, empties the journal
        restarted.wait(timeout=60)
    records = list(Journal(folder).replay())
    assert [r["op"] for r in records] == ["base"]
    snapshot = ToolScout.load(folder)
    assert {t.id: t.description for t in snapshot.tools if t.namespace == "crash"} == state
    assert snapshot.saved_config["journal_seq"] == records[0]["seq"]
    assert (folder / JOURNAL).stat().st_size < 100


def test_sigkill_during_feedback_keeps_every_acknowledged_event_once(tmp_path, tools):
    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(folder)
    port = free_port()
    server = start_server_at(folder, port)
    targets = ["mail.send", "files.read", "stocks.quote"]
    acknowledged: list[tuple[str, str]] = []  # (tool id, task) of every acknowledged event, in order
    in_flight: list[tuple[str, str]] = []

    def reporter():
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=10) as client:
            for i in range(100_000):
                event = (targets[i % 3], f"crash feedback task number {i} about sheep")
                in_flight[:] = [event]
                try:
                    r = client.post("/feedback", json={"query": event[1], "tool_ids": [event[0]]})
                except httpx.HTTPError:
                    return  # the server died with this event in flight
                assert r.status_code == 200 and r.json()["learned"] == 1, r.text
                acknowledged.append(event)

    thread = threading.Thread(target=reporter)
    thread.start()
    while len(acknowledged) < 30 and thread.is_alive():
        time.sleep(0.01)
    server.send_signal(signal.SIGKILL)  # while the reporter keeps reporting
    server.wait()
    thread.join()
    assert len(acknowledged) >= 30
    restarted = start_server_at(folder, port)
    try:
        learned = {t: httpx.get(f"http://127.0.0.1:{port}/tools/{t}").json()["feedback"]["learned"] for t in targets}
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=60)
    ledger = ToolScout.load(folder).ledger
    for tool_id in targets:
        want = [task for t, task in acknowledged if t == tool_id]
        got = [usage.query for _source, usages in ledger.usage(tool_id) for usage in usages]
        # every acknowledged event, in order, once; the one in flight at the kill may have landed
        assert got in (want, want + [in_flight[0][1]] if in_flight[0][0] == tool_id else want), tool_id
        assert learned[tool_id] == len(got)
    assert ledger.events in (len(acknowledged), len(acknowledged) + 1)


def test_sigterm_of_an_mcp_only_http_server_saves_a_snapshot_too(tmp_path, tools):
    """`toolscout serve DIR --mcp http` ends a SIGTERM as the API server does: the feedback its MCP clients
    recorded goes into a snapshot and the journal starts afresh (uvicorn ends by the signal itself, so only
    the app's lifespan runs at shutdown, and this app's did not close the catalog)."""
    import subprocess
    import sys

    import anyio
    from mcp import Client

    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(folder)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolscout", "serve", str(folder), "--mcp", "http", "--port",
                             str(port)], env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:  # up once it takes connections (a GET of /mcp opens a stream that stays open)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the MCP server did not come up"
                time.sleep(0.2)

        async def record():
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                done = await client.call_tool("record_tool_use", {"task": "send the report by email",
                                                                  "tool_ids": ["mail.send"]})
                assert not done.is_error, done.content[0].text

        anyio.run(record)
        assert [r["op"] for r in Journal(folder).read()] == ["feedback"]  # read beside the live server
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert [r["op"] for r in Journal(folder).replay()] == ["base"]
    assert ToolScout.load(folder).ledger.summary("mail.send")["learned"] == 1


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_port_in_use_fails_before_anything_says_it_is_serving(tmp_path, tools, command):
    """`toolscout serve`/`gateway` on a taken port printed "serving ... at http://127.0.0.1:PORT" and only then
    uvicorn's "address already in use": the port is bound first now. And what it said was uvicorn's raw
    "ERROR: [Errno 98] ... address already in use", exit status 3 (trial8 #15): now a toolscout error naming
    the port and --port, exit status 1, the same for both commands."""
    import json
    import subprocess
    import sys

    if command == "serve":
        ToolScout.from_tools(tools, retriever="bm25").save(tmp_path / "idx")
        args = ["serve", str(tmp_path / "idx")]
    else:
        config = tmp_path / "servers.json"
        config.write_text(json.dumps({"mcpServers": {"off": {"command": "sh", "enabled": False}}}))
        args = ["gateway", str(config), "--index", str(tmp_path / "gw")]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "toolscout", *args, "--port", str(port)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.splitlines()[-1] == (
        f"toolscout {command}: error: port {port} on 127.0.0.1 is already in use (another server listens there): "
        "stop it, or choose another port with --port")
    assert "Errno" not in run.stderr and f"127.0.0.1:{port} (" not in run.stderr, run.stderr


def test_an_address_the_host_lacks_is_refused_naming_the_flags():
    """What uvicorn would have said raw ("[Errno 99] ..."), as the port in use above: a toolscout error."""
    from toolscout.serve.listen import CannotListen, check_listen

    with pytest.raises(CannotListen, match=r"^cannot listen on 192\.0\.2\.1 port 0: .*; check --host and --port$"):
        check_listen("192.0.2.1", 0)  # TEST-NET-1: no interface here has it
    check_listen("127.0.0.1", 0)  # a free port: nothing to say


def test_a_server_restarted_after_sigkill_compacts_the_journal_it_replayed(tmp_path, tools):
    """A restart replays the journal; it used to leave it as it was (compactions 0), so every later crash
    replayed all of it again. Now the restarted server saves a snapshot right after the replay."""
    folder = tmp_path / "idx"
    ToolScout.from_tools(tools, retriever="bm25").save(folder)
    port = free_port()
    server = start_server_at(folder, port)
    events = [{"query": f"send the sheep report number {i}", "tool_ids": ["mail.send"]} for i in range(20)]
    for i in range(0, 20, 5):
        r = httpx.post(f"http://127.0.0.1:{port}/feedback", json={"events": events[i:i + 5]}, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert [r["op"] for r in Journal(folder).read()] == ["feedback"] * 4
    restarted = start_server_at(folder, port)
    try:
        deadline = time.monotonic() + 60  # the snapshot is saved in the background while it serves
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        while health["compactions"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a condition, not a handshake
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        assert health["compactions"] == 1 and health["journal_records"] == 0, health
        assert httpx.get(f"http://127.0.0.1:{port}/tools/mail.send").json()["feedback"]["learned"] == 20
    finally:
        restarted.send_signal(signal.SIGKILL)  # a second crash: nothing is left to replay
        restarted.wait()
    assert [r["op"] for r in Journal(folder).read()] == ["base"]
    assert ToolScout.load(folder).ledger.events == 20
