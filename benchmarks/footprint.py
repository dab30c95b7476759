"""What the gateway costs a machine: install size per extra, resident memory and start-up, beside the toolscout
before the lean install (today's) and fastmcp's proxy, in one run (docs/install.md has the figures).

    python benchmarks/footprint.py --json footprint.json --markdown footprint.md
    python benchmarks/footprint.py --sections gateway --sizes 265 --searches 200      # a quicker run

Everything is measured from fresh virtual environments made in the work folder, from wheels built here:

- lean: this checkout with `[gateway]` (no torch, no sentence-transformers);
- today: toolscout as it was before the lean install (`--baseline REF`, a git commit of this repository,
  read with `git archive`) with `[serve,fast]`, torch==2.13.0 installed first as its setup did (`[fast]`
  brought onnxruntime: without it, today's `[serve]` encoded with sentence-transformers);
- fastmcp: `fastmcp==4.2.3` (the version the issue measured).

Sections:

1. install: MiB that each install adds to a fresh venv's site-packages (pip and setuptools left out): this
   checkout's core, [gateway], [serve], [train] and [all]; today's core, [serve] and [serve,fast]; fastmcp.
2. gateway: N real tools of the dev sets (`--sizes`, default 265 and 10,000; benchmarks/common.py
   build_catalog) dealt to 20 stub MCP servers over stdio (tests/fixtures/mcp_stub.py, the same processes for
   every gateway), each gateway started by the official MCP SDK client over stdio, as a host starts it.
   Figures: seconds from launch to the first answered `search_tools` and to the first search that returns a
   probe task's gold tool; the gateway process's RSS once every upstream is indexed ("after start-up"), after
   `--searches` searches each followed by a call of the first tool found (the stub echoes it; fewer when they
   outlast `--workload-budget` seconds, and the json says how many), and its peak;
   then the same gateway restarted over the index it kept: seconds to its first answered search, and how many
   of that answer's tools were reachable then (0: answered before its upstreams were up). fastmcp runs its
   documented shared-session proxy: one fastmcp `Client` over the same mcpServers config, connected, handed to
   `create_proxy`, with `BM25SearchTransform(max_results=10)` (gofastmcp.com/servers/providers/proxy,
   /servers/transforms/tool-search); it keeps no index, so its "restart" is a second start.
3. serve: `toolscout serve` over an index of `--serve-tools` tools (default 43,000; built once, by the lean
   install): RSS after start-up and after `--searches` searches over HTTP, lean and today's.

The machine should be idle: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
from common import DEFAULT_DATA, build_catalog, deal_tools, machine_line, percentile, sample_queries  # noqa: E402

K = 10
BASELINE = "a019de5"  # the last commit before the lean install (issue 37): what "today" means in these figures
TORCH = "torch==2.13.0"  # the CPU build on these machines; installed first wherever torch comes in
FASTMCP = "fastmcp==4.2.3"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def child_env() -> dict[str, str]:
    """The environment of everything this starts: offline, and without the caller's PYTHONPATH, through which a
    fresh venv would see a source tree (its egg-info tells pip toolscout is "already satisfied", and its
    gateway would import that tree instead of the installed wheel)."""
    return {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}, **ENV}

# (label, wheel: "this" | "baseline" | None, extras or requirement, torch first)
INSTALLS = [
    ("toolscout (core)", "this", "", False),
    ("toolscout[gateway]", "this", "gateway", False),
    ("toolscout[serve]", "this", "serve", False),
    ("toolscout[train]", "this", "train", True),
    ("toolscout[all]", "this", "all", True),
    ("today: toolscout (core)", "baseline", "", True),
    ("today: toolscout[serve]", "baseline", "serve", True),
    ("today: toolscout[serve,fast]", "baseline", "serve,fast", True),
    ("fastmcp proxy", None, FASTMCP, False),
]
# today's gateway is measured at its best: with [fast] (onnxruntime), so it encodes with the same int8 graph as the
# lean one and the difference is what importing torch costs; `pip install toolscout[serve]` alone encoded with torch
GATEWAY_VENVS = {"lean": "toolscout[gateway]", "today": "today: toolscout[serve,fast]", "fastmcp": "fastmcp proxy"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="install,gateway,serve")
    parser.add_argument("--sizes", default="265,10000", help="gateway catalog sizes (tools)")
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--searches", type=int, default=1000, help="searches (each with a call) per gateway")
    parser.add_argument("--workload-budget", type=float, default=300.0,
                        help="seconds a gateway's searches and calls may take; fewer are run past it (fastmcp's "
                             "BM25 search over 10,000 tools takes seconds each)")
    parser.add_argument("--systems", default="lean,today,fastmcp", help="gateways to run (default: all three)")
    parser.add_argument("--serve-tools", type=int, default=43000)
    parser.add_argument("--baseline", default=BASELINE, help="git commit of today's toolscout (default %(default)s)")
    parser.add_argument("--work", default=None, help="work folder (default: a new temporary one); venvs are reused")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="toolscout-footprint-"))
    work.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    print(f"{machine_line()}; work folder {work}", file=sys.stderr)
    venvs = make_venvs(work, args.baseline, sections)
    out: dict = {"machine": machine_line(), "baseline": args.baseline,
                 "install_mib": {label: v.size_mib for label, v in venvs.items()}}
    if "gateway" in sections:
        out["gateway"] = {size: gateway_section(venvs, work, int(size), args) for size in args.sizes.split(",")}
    if "serve" in sections:
        out["serve"] = serve_section(venvs, work, args)
    out["machine_after"] = machine_line()
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(out))
    return 0


# ------------------------------------------------------------------------------------------ installs

@dataclass
class Venv:
    path: Path
    size_mib: float

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)


def make_venvs(work: Path, baseline: str, sections: list[str]) -> dict[str, Venv]:
    """Every venv the sections need (all of INSTALLS for the install section), each made once per work folder."""
    wanted = [row for row in INSTALLS if "install" in sections or row[0] in GATEWAY_VENVS.values()]
    wheels = build_wheels(work, baseline, {row[1] for row in wanted})
    venvs = {}
    for label, wheel, extras, torch_first in wanted:
        folder = work / "venvs" / label.replace(" ", "_").replace(":", "").replace("(", "").replace(")", "")
        requirement = extras if wheel is None else f"{wheels[wheel]}[{extras}]" if extras else str(wheels[wheel])
        if not (folder / ".installed").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, env=child_env())
            pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet"]
            if torch_first:
                subprocess.run([*pip, TORCH], check=True, env=child_env())
            subprocess.run([*pip, requirement], check=True, env=child_env())
            if wheel is not None:  # pip installed the wheel itself, not only its dependencies
                subprocess.run([str(folder / "bin" / "python"), "-c", "import toolscout"], check=True,
                               env=child_env(), cwd=folder)
            (folder / ".installed").write_text(f"{requirement}\n{time.perf_counter() - started:.0f} s\n")
        venvs[label] = Venv(folder, site_packages_mib(folder))
        print(f"  {label}: {venvs[label].size_mib:.0f} MiB", file=sys.stderr)
    return venvs


def build_wheels(work: Path, baseline: str, which: set) -> dict[str, Path]:
    """This checkout's wheel and the baseline commit's (from `git archive`, which changes nothing in the repo)."""
    wheels = {}
    for name in sorted(w for w in which if w):
        folder = work / "wheels" / name
        found = sorted(folder.glob("toolscout-*.whl")) if folder.is_dir() else []
        if not found:
            source = ROOT
            if name == "baseline":
                source = work / "baseline-src"
                source.mkdir(parents=True, exist_ok=True)
                archive = subprocess.run(["git", "-C", str(ROOT), "archive", baseline], check=True, capture_output=True)
                subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder),
                            str(source)], check=True)
            found = sorted(folder.glob("toolscout-*.whl"))
        wheels[name] = found[-1]
    return wheels


def site_packages_mib(venv: Path) -> float:
    """MiB of what was installed into the venv's site-packages (pip, setuptools and their files left out)."""
    site = next((venv / "lib").glob("python*/site-packages"))
    skip = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth", "pkg_resources")
    total = 0
    for entry in site.iterdir():
        if entry.name.startswith(skip):
            continue
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file() and not p.is_symlink()]
        total += sum(p.stat().st_size for p in files)
    return round(total / 2**20, 1)


# ------------------------------------------------------------------------------------------- gateway

FASTMCP_PROXY = '''
"""fastmcp's proxy over an mcpServers config, with one shared, connected session and BM25 tool search."""
import asyncio, json, logging, sys
from fastmcp import Client
from fastmcp.server import create_proxy
from fastmcp.server.transforms.search import BM25SearchTransform

async def main():
    for name in ("fastmcp", "mcp"):
        logging.getLogger(name).setLevel(logging.ERROR)
    config = json.load(open(sys.argv[1]))
    async with Client(config) as connected:  # the documented shared session: every request reuses it
        proxy = create_proxy(connected, name="fastmcp-proxy")
        proxy.add_transform(BM25SearchTransform(max_results=10))
        await proxy.run_async(show_banner=False)

asyncio.run(main())
'''


class Side:
    """How a gateway is driven: its search and call tools' arguments and the tool names it returns."""

    def __init__(self, kind: str, budget_s: float = float("inf")):
        self.kind, self.budget_s = kind, budget_s  # budget_s: seconds the workload may take

    def search(self, task: str) -> tuple[str, dict]:
        return ("search_tools", {"task": task, "k": K} if self.kind != "fastmcp" else {"query": task})

    def found(self, result) -> list[tuple[str, bool]]:
        """(tool name to call, reachable now) of each tool a search returned."""
        if self.kind != "fastmcp":
            return [(t["id"], t.get("available", True)) for t in result.structured_content["tools"]]
        data = result.structured_content
        tools = data.get("result", data) if isinstance(data, dict) else None
        if tools is None:
            tools = json.loads(result.content[0].text)
        return [(t["name"], True) for t in tools]

    def name(self, gateway_id: str) -> str:
        return gateway_id.replace(".", "_", 1) if self.kind == "fastmcp" else gateway_id


def gateway_section(venvs: dict[str, Venv], work: Path, size: int, args) -> dict:
    tools, sets, note = build_catalog(DEFAULT_DATA, size)
    folder = work / f"gateway-{size}"
    dealt = deal_tools(tools, args.servers, folder)
    probe = probe_task(sets, dealt["gateway_id"])
    tasks = sample_queries(sets, args.searches, seed=1)
    out = {"catalog": note, "tools_listed": dealt["tools"], "servers": args.servers, "probe": probe[0]}
    (folder / "fastmcp_proxy.py").write_text(FASTMCP_PROXY)
    for kind, label in GATEWAY_VENVS.items():
        if kind in args.systems.split(","):
            out[kind] = one_gateway(kind, venvs[label], folder, dealt, probe, tasks, args.workload_budget)
            print(f"    {json.dumps(out[kind])}", file=sys.stderr)
    return out


RESTART_FIGURES = ("first_answer_s", "first_answer_cpu_s", "first_answer_reachable", "first_gold_s", "rss_indexed_mib",
                   "journal_bytes")


def one_gateway(kind: str, venv: Venv, folder: Path, dealt: dict, probe: tuple[str, str], tasks: list[str],
                budget_s: float) -> dict:
    """Three launches: a new index with the workload, stopped as the SDK client stops a server (stdin closed, 2 s,
    then SIGTERM); a restart over what that left (a journal the gateway had no time to fold in is replayed),
    stopped cleanly (the client waits for it to exit, so it saves its index); a restart over that saved index."""
    index = folder / f"index-{kind}"
    if kind == "fastmcp":
        command = [venv.bin("python"), str(folder / "fastmcp_proxy.py"), str(dealt["config"])]
    else:
        shutil.rmtree(index, ignore_errors=True)
        command = [venv.bin("toolscout"), "gateway", str(dealt["config"]), "--index", str(index), "--no-fsync"]
    runs = {}
    for name, work, grace in (("start", tasks, None), ("restart_after_host_stop", [], 60.0), ("restart", [], None)):
        print(f"  gateway {kind}, {dealt['tools']} tools: {name}", file=sys.stderr)
        runs[name] = anyio.run(run_gateway, command, Side(kind, budget_s), dealt, probe, work, folder / f"{kind}.pid",
                               grace, index)
    return {"start": runs["start"], **{name: {k: runs[name].get(k) for k in RESTART_FIGURES + ("stop_s",)}
                                       for name in ("restart_after_host_stop", "restart")}}


def probe_task(sets, gateway_id: dict[str, str]) -> tuple[str, str]:
    """A real test task whose one gold tool is in the catalog: (task, its gateway id)."""
    for bench in sets:
        for query in bench.split("test"):
            key = f"{bench.name}/{query.labels[0]}" if query.labels else None
            if len(query.labels) == 1 and key in gateway_id:
                return query.text, gateway_id[key]
    raise SystemExit("no test task has its gold tool in the catalog")


async def run_gateway(command: list[str], side: Side, dealt: dict, probe: tuple[str, str], tasks: list[str],
                      pidfile: Path, grace: float | None, index: Path) -> dict:
    """Launch a gateway through the SDK client over stdio (its pid read through a shell that execs it), time its
    first answer and its first gold answer, wait until every upstream is indexed, measure RSS, run the
    workload, measure again, stop it (`grace`: seconds the client waits for it to exit after closing its
    stdin, before SIGTERM; None: the SDK's own) and time that."""
    import mcp.client.stdio as sdk_stdio
    from mcp import Client, StdioServerParameters

    journal = index / "journal.log"
    pidfile.unlink(missing_ok=True)
    params = StdioServerParameters(command="/bin/sh", args=["-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), *command],
                                   env=child_env())
    default_grace = sdk_stdio.PROCESS_TERMINATION_TIMEOUT
    sdk_stdio.PROCESS_TERMINATION_TIMEOUT = grace or default_grace  # read by the SDK when it stops the server
    out: dict = {"journal_bytes": journal.stat().st_size if journal.is_file() else 0}
    started = time.perf_counter()
    try:
        await drive(Client(params), side, dealt, probe, tasks, pidfile, started, out)
        out["stop_s"] = round(time.perf_counter() - out.pop("stopping"), 2)
    finally:
        sdk_stdio.PROCESS_TERMINATION_TIMEOUT = default_grace
    return out


async def drive(client_context, side: Side, dealt: dict, probe: tuple[str, str], tasks: list[str], pidfile: Path,
                started: float, out: dict) -> None:
    async with client_context as client:
        answer = await until(lambda: search(client, side, probe[0]))
        out["first_answer_s"] = round(time.perf_counter() - started, 2)
        out["first_answer_cpu_s"] = cpu_s(int(pidfile.read_text()))  # its own CPU time: what a busy machine hides
        out["first_answer_reachable"] = f"{sum(ok for _n, ok in answer)}/{len(answer)}"
        await until(lambda: found_gold(client, side, probe))
        out["first_gold_s"] = round(time.perf_counter() - started, 2)
        pid = int(pidfile.read_text())
        if side.kind != "fastmcp":  # fastmcp connects every upstream before it answers at all
            for server, listed in dealt["lists"].items():
                if listed:
                    await until(lambda: found_gold(client, side, (f"{server}.{listed[0]['name']}",) * 2, k=1))
        out["all_indexed_s"] = round(time.perf_counter() - started, 2)
        await anyio.sleep(2)
        out["rss_indexed_mib"] = rss_mib(pid)["VmRSS"]
        if tasks:
            out["workload"] = await workload(client, side, tasks)
            memory = rss_mib(pid)
            out["rss_after_workload_mib"], out["peak_rss_mib"] = memory["VmRSS"], memory["VmHWM"]
        out["stopping"] = time.perf_counter()


async def search(client, side: Side, task: str):
    name, arguments = side.search(task)
    result = await client.call_tool(name, arguments)
    return None if result.is_error else side.found(result)


async def found_gold(client, side: Side, probe: tuple[str, str], k: int = K) -> bool:
    """Whether searching the probe's task returns its gold tool, reachable, in the top k."""
    task, gold = probe
    found = await search(client, side, task) or []
    return side.name(gold) in [name for name, ok in found[:k] if ok]


async def until(check, timeout: float = 1800.0, every: float = 0.05):
    """`await check()` until it returns something true (errors while a gateway starts count as not yet)."""
    deadline = time.perf_counter() + timeout
    last = None
    while time.perf_counter() < deadline:
        try:
            value = await check()
        except Exception as exc:  # noqa: BLE001  (an MCP error while the gateway starts: try again)
            value, last = None, exc
        if value:
            return value
        await anyio.sleep(every)
    raise SystemExit(f"timed out waiting for the gateway (last error: {last})")


async def workload(client, side: Side, tasks: list[str]) -> dict:
    """Each task searched, then the first tool it found called (the stub echoes the call), until the tasks or
    the side's time budget run out."""
    times = {"search": [], "call": []}
    ends = time.perf_counter() + side.budget_s
    for task in tasks:
        if time.perf_counter() > ends:
            break
        started = time.perf_counter()
        found = await search(client, side, task)
        times["search"].append((time.perf_counter() - started) * 1000)
        if found:
            started = time.perf_counter()
            result = await client.call_tool("call_tool", {"name": found[0][0], "arguments": {}})
            times["call"].append((time.perf_counter() - started) * 1000)
            assert not result.is_error, result.content[0].text
    return {f"{kind}_p50_ms": round(percentile(v, 50), 2) for kind, v in times.items()} | {
        "searches": len(times["search"]), "calls": len(times["call"])}


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def rss_mib(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


# --------------------------------------------------------------------------------------------- serve

def serve_section(venvs: dict[str, Venv], work: Path, args) -> dict:
    from toolscout.benchmark_sets import write_benchmark

    tools, sets, note = build_catalog(DEFAULT_DATA, args.serve_tools)
    folder = work / f"serve-{args.serve_tools}"
    index = folder / "index"
    out: dict = {"catalog": note}
    if not (index / "CURRENT").is_file():
        write_benchmark(folder / "catalog", tools, [])
        started = time.perf_counter()
        subprocess.run([venvs["toolscout[gateway]"].bin("toolscout"), "index", str(folder / "catalog" / "tools.jsonl"),
                        "--out", str(index)], check=True, env=child_env(), stdout=subprocess.DEVNULL)
        out["index_build_s (lean)"] = round(time.perf_counter() - started, 1)
    queries = sample_queries(sets, args.searches, seed=2)
    for kind in [k for k in ("lean", "today") if k in args.systems.split(",")]:
        copy = folder / f"index-{kind}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(index, copy)
        out[kind] = serve_once(venvs[GATEWAY_VENVS[kind]], copy, queries, folder / f"serve-{kind}.log")
        print(f"  serve {kind}: {json.dumps(out[kind])}", file=sys.stderr)
    return out


def serve_once(venv: Venv, index: Path, queries: list[str], log: Path) -> dict:
    from servers import free_port, stop  # tests/servers.py: a free loopback port, a clean stop

    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([venv.bin("toolscout"), "serve", str(index), "--port", str(port), "--no-fsync"],
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"toolscout serve exited; see {log}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        out = {"ready_s": round(time.perf_counter() - started, 2)}
        time.sleep(2)
        out["rss_started_mib"] = rss_mib(proc.pid)["VmRSS"]
        times = []
        with httpx.Client(timeout=60) as http:
            for query in queries:
                begin = time.perf_counter()
                http.post(f"{url}/search", json={"query": query, "k": K}).raise_for_status()
                times.append((time.perf_counter() - begin) * 1000)
        memory = rss_mib(proc.pid)
        out.update({"searches": len(times), "search_p50_ms": round(percentile(times, 50), 2),
                    "rss_after_searches_mib": memory["VmRSS"], "peak_rss_mib": memory["VmHWM"]})
        return out
    finally:
        stop(proc)


# ------------------------------------------------------------------------------------------ markdown

def markdown(out: dict) -> str:
    lines = [f"Machine: {out['machine']} (after: {out['machine_after']}); today = toolscout at {out['baseline']}.", "",
             "| install | site-packages MiB |", "|---|---|"]
    lines += [f"| {label} | {mib:.0f} |" for label, mib in out["install_mib"].items()]
    for size, figures in out.get("gateway", {}).items():
        lines += ["", f"Gateway, {figures['catalog']} on {figures['servers']} stdio servers "
                      f"({figures['tools_listed']} listed):", "",
                  "| | first answer s | first gold s | all indexed s | RSS indexed MiB | RSS after work MiB | peak MiB "
                  "| search p50 ms | call p50 ms | restart after the host's stop: first answer s (reachable; journal "
                  "bytes) | restart over the saved index: first answer s (its CPU s; reachable) | its RSS MiB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for kind in [k for k in GATEWAY_VENVS if k in figures]:
            s, h, r = (figures[kind][k] for k in ("start", "restart_after_host_stop", "restart"))
            w = s.get("workload", {})
            lines.append(f"| {kind} | {s['first_answer_s']} | {s['first_gold_s']} | {s['all_indexed_s']} | "
                         f"{s['rss_indexed_mib']} | {s.get('rss_after_workload_mib')} | {s.get('peak_rss_mib')} | "
                         f"{w.get('search_p50_ms')} | {w.get('call_p50_ms')} | {h['first_answer_s']} "
                         f"({h['first_answer_reachable']}; {h['journal_bytes']}) | {r['first_answer_s']} "
                         f"({r['first_answer_cpu_s']}; {r['first_answer_reachable']}) | {r['rss_indexed_mib']} |")
    if "serve" in out:
        serve = out["serve"]
        lines += ["", f"toolscout serve, {serve['catalog']}:", "",
                  "| | ready s | RSS started MiB | RSS after searches MiB | peak MiB | search p50 ms |",
                  "|---|---|---|---|---|---|"]
        for kind in [k for k in ("lean", "today") if k in serve]:
            s = serve[kind]
            lines.append(f"| {kind} | {s['ready_s']} | {s['rss_started_mib']} | {s['rss_after_searches_mib']} | "
                         f"{s['peak_rss_mib']} | {s['search_p50_ms']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
