"""`toolscout learn DIR [LOG.jsonl...]`: tool-use feedback from log files, taking a source back, and the
opt-in heavier learning (`--train mlc|refiner|embed`), on an index that no server holds at the moment
(a running server takes the same through POST /feedback, DELETE /feedback and POST /admin/learn)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import datetime, timezone

from .options import parse_options

BATCH = 1000


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("learn", help="learn from tool-use feedback: import logs, take a source back, retrain",
                       description="Import tool-use feedback (JSONL, one {query, tool_ids, source?, outcome?} per "
                                   "line) into an index, which learns from it at once; take back what a source "
                                   "taught; or train a heavier model on the feedback so far and keep it only if "
                                   "held-back feedback ranks better.")
    p.add_argument("dir", metavar="DIR", nargs="?", default=None,
                   help="pipeline directory (none with --store: every positional is then a log); no server may "
                        "be serving it")
    p.add_argument("logs", metavar="LOG", nargs="*", help="feedback logs (JSONL) to import")
    p.add_argument("--store", default=None, metavar="DSN", help="the PostgreSQL index at DSN instead of DIR")
    p.add_argument("--source", default="import", help="source of events that name none (default %(default)s)")
    p.add_argument("--forget", action="append", default=[], metavar="SOURCE",
                   help="take back everything SOURCE taught (repeatable)")
    p.add_argument("--train", choices=["mlc", "refiner", "embed"], default=None,
                   help="train this on the feedback so far; swapped in only when held-back feedback ranks better")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the --train trainer, VALUE parsed as JSON when it can be (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars while --train trains")
    p.set_defaults(handler=cmd_learn)
    add_learning_parsers(sub)


def cmd_learn(args: argparse.Namespace) -> int:
    from ..feedback import DEFAULT_SOURCE, events_from_jsonl, nothing_from
    from ..postgres import recorded_spec, require_catalog
    from ..store.pgvector import is_postgres_spec

    if args.store and args.dir is not None:  # `learn --store DSN LOG...`: the first positional is a log, not DIR
        args.logs, args.dir = [args.dir, *args.logs], None
    if not (args.logs or args.forget or args.train):
        raise ValueError("nothing to do: give feedback logs, --forget SOURCE or --train METHOD")
    target = args.store or recorded_spec(args.dir) or args.dir
    if target is None:
        raise ValueError("give the pipeline directory (DIR) or --store postgresql://...")
    if is_postgres_spec(target):
        require_catalog(target, "learn")
    events = [replace(e, source=args.source) if e.source == DEFAULT_SOURCE else e
              for log in args.logs for e in events_from_jsonl(log)]  # every log is read before anything changes
    if args.logs and not events:
        print(f"no feedback events in {', '.join(map(str, args.logs))}: nothing learned", file=sys.stderr)
    via_server = ("post the log to the server: POST http://HOST:PORT/feedback {\"events\": [...]}" if events else
                  "ask the server: DELETE http://HOST:PORT/feedback?source=SOURCE" if args.forget else
                  "ask the server: POST http://HOST:PORT/admin/learn {\"train\": METHOD}")
    service = open_held(target, via_server)
    try:
        if events:
            service.check_feedback_times(events)  # the whole log, before its first batch is written
            import_events(service, events)
        for source in args.forget:
            touched = service.forget(source)
            print(nothing_from(source) if touched is None else f"forgot source {source!r}: the {len(touched)} tools "
                  "it had taught rank as if it had never posted", file=sys.stderr)
        if args.train:  # minutes of work: say what runs, and show the trainer's progress
            print(f"training {args.train} on the feedback so far, then scoring it and the pipeline as it is on "
                  "the feedback held back", file=sys.stderr)
            state = service.retrain(args.train, **{"progress": not args.quiet, **parse_options(args.option)})
            verdict = "swapped in" if state["state"] == "swapped" else "kept the pipeline as it was"
            print(f"{args.train}: held-back nDCG@10 {state['candidate_ndcg@10']:.2f} vs {state['baseline_ndcg@10']:.2f} "
                  f"({state['train_queries']} requests trained on, {state['holdout_queries']} held back): {verdict}",
                  file=sys.stderr)
            if state.get("warning"):
                print(f"warning: {state['warning']}", file=sys.stderr)
    finally:
        service.close()
    return 0


def open_held(target: str, via_server: str):
    """The service over `target` opened here; a directory a server holds is refused with the way through that
    server (`via_server`), not only "stop it first"."""
    from ..serve.errors import DirectoryHeld
    from ..serve.limits import FeedbackLimits
    from ..serve.service import ToolService

    try:
        return ToolService.open(target, batch_workers=0, limits=FeedbackLimits(rate=None, volume=None))
    except DirectoryHeld as exc:
        raise DirectoryHeld(f"{exc}, or {via_server} (with an admin --token)") from None


def import_events(service, events) -> None:
    """Teach `service` `events` in batches, with a progress bar, and say what they taught."""
    from tqdm.auto import tqdm

    from ..feedback import LearnResult

    total = LearnResult()
    with tqdm(total=len(events), unit="event", desc="feedback", disable=None) as bar:
        for start in range(0, len(events), BATCH):
            result = service.feedback(events[start:start + BATCH])
            total.absorb(result)
            bar.update(result.events)
    held = f", {total.held_by_freeze} held back by the freeze" if total.held_by_freeze else ""
    held += (f", {total.incidental} whose request is only numbers, dates or addresses (they teach nothing)"
             if total.incidental else "")
    print(f"{len(events)} events: {total.taught} (tool, request) pairs learned{held}, {total.duplicates} repeats, "
          f"{total.capped} over the per-source cap, {total.failures} failures, {len(total.unknown)} unknown "
          f"tool ids{_named(total.unknown)}", file=sys.stderr)
    if total.note():
        print(total.note(), file=sys.stderr)


def _named(ids: list[str], shown: int = 5) -> str:
    """The distinct ids of `ids`, the first `shown` by name: " (7 distinct: 'a', 'b' and 5 more)"; '' for none."""
    distinct = list(dict.fromkeys(ids))
    if not distinct:
        return ""
    more = f" and {len(distinct) - shown} more" if len(distinct) > shown else ""
    counted = f"{len(distinct)} distinct: " if len(distinct) < len(ids) else ""
    return f" ({counted}{', '.join(map(repr, distinct[:shown]))}{more})"


# ------------------------------------------------------------------------------ toolscout learning

def add_learning_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("learning", help="how learning from use is doing, and an operator's controls over it",
                       description="Every feedback event is scored before it is learned: where the used tool ranked "
                                   "as served, untaught, and with learning at full weight. `report` shows those "
                                   "figures per namespace and the weight learning has in each; `weight`, `freeze`, "
                                   "`unfreeze` and `rollback` change it. TARGET: a pipeline directory, "
                                   "a gateway's config file (the index it keeps by default), postgresql://... "
                                   "or the URL of a running server or gateway. `report` reads "
                                   "a directory even while a server or a stdio gateway holds it; the verbs that "
                                   "change learning need it free, or the server's URL.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    report = verbs.add_parser("report", help="the deployment's own measurement of its learning")
    report.add_argument("target", metavar="TARGET")
    report.add_argument("--json", action="store_true", help="the whole report as JSON")
    weight = verbs.add_parser("weight", help="set learning's weight in a namespace (0 to 1, or auto)")
    weight.add_argument("target", metavar="TARGET")
    weight.add_argument("namespace", help='the namespace ("*": every namespace without its own weight)')
    weight.add_argument("weight", help="a number from 0 to 1, or auto (the automatic weight again)")
    for name, text in (("freeze", "learn nothing taught from now on (it is still recorded and scored)"),
                       ("unfreeze", "learn what was held back, and go on learning")):
        verbs.add_parser(name, help=text).add_argument("target", metavar="TARGET")
    rollback = verbs.add_parser("rollback", help="take back everything learned at or after a time (the time each "
                                "event happened: an imported log of older events goes with `learn --forget SOURCE`)")
    rollback.add_argument("target", metavar="TARGET")
    rollback.add_argument("--before", required=True, metavar="TIME",
                          help="ISO 8601 time (UTC unless it says) or seconds since the epoch")
    rollback.add_argument("--dry-run", action="store_true",
                          help="only say what would be taken back (how many pairs, from which sources)")
    for parser in (report, weight, rollback, *(verbs.choices[n] for n in ("freeze", "unfreeze"))):
        parser.add_argument("--token", default=None, help="bearer token for a server URL (default: $TOOLSCOUT_TOKEN)")
    p.set_defaults(handler=cmd_learning)


def cmd_learning(args: argparse.Namespace) -> int:
    import os

    # every argument is read before anything is opened or changed
    before = parse_time(args.before) if args.verb == "rollback" else None
    weights = parse_weight(args.weight, args.namespace) if args.verb == "weight" else None
    token = args.token if args.token is not None else os.environ.get("TOOLSCOUT_TOKEN")
    # a report and a dry run read a directory as its server serves it: no lock, and nothing written (opening it
    # for writing would save the journal's writes into a new snapshot)
    reads_only = args.verb == "report" or (args.verb == "rollback" and args.dry_run)
    target = LearningTarget.of(args.target, token, read_only=reads_only, command=f"learning {args.verb}",
                               argv=" ".join(_as_given(args)))
    try:
        if args.verb == "report":
            report = target.report()
            print(json.dumps(report, indent=2) if args.json else render_report(report))
        elif args.verb == "rollback":
            print(said_rollback(target.rollback(before, args.dry_run), before), file=sys.stderr)
        else:
            freeze = {"freeze": True, "unfreeze": False}.get(args.verb)
            print(said_settings(target.settings(weights, freeze), args.verb), file=sys.stderr)
            if weights and weights[args.namespace] is not None and args.namespace != "*" and \
                    args.namespace not in target.namespaces():
                print(f"warning: no tool is in namespace {args.namespace!r} now (a typo?); its weight applies to "
                      "tools added there later", file=sys.stderr)
    finally:
        target.close()
    return 0


def _as_given(args: argparse.Namespace) -> list[str]:
    """The learning command as given, with the server's URL for its target (what to run instead of it on a
    directory a server holds)."""
    rest = {"weight": [getattr(args, "namespace", ""), getattr(args, "weight", "")],
            "rollback": ["--before", getattr(args, "before", "")]}.get(args.verb, [])
    flags = [flag for flag, on in (("--dry-run", getattr(args, "dry_run", False)),
                                   ("--json", getattr(args, "json", False))) if on]
    return ["toolscout", "learning", args.verb, "http://HOST:PORT", *rest, *flags]


def said_rollback(said: dict, before: float) -> str:
    """What a rollback took back (or would: --dry-run), in words: learned pairs apart from those only held by
    a freeze, and from which sources."""
    when = datetime.fromtimestamp(before, timezone.utc).isoformat()
    if not said["taken_back"]:
        return f"nothing was learned or held at or after {when}: nothing to take back, nothing changed"
    held = said.get("held_by_freeze", 0)
    pairs = f"{said['taken_back'] - held} (request, tool) pairs learned" + (
        f" and {held} held by the freeze (never learned)" if held else "")
    sources = ", ".join(f"{source!r} {n}" for source, n in said.get("sources", {}).items())
    verb = "would take back" if said.get("dry_run") else "took back"
    tail = "; --dry-run: nothing changed" if said.get("dry_run") else ""
    return f"{verb} {pairs} at or after {when}, from {sources or 'no source'}{tail}"


def said_settings(settings: dict, verb: str) -> str:
    """What `weight`, `freeze` or `unfreeze` left learning's settings at, in words."""
    frozen = settings.get("frozen_at")
    state = "learning is frozen since " + _when(frozen) + " (taught events are recorded and scored, not learned)" \
        if frozen is not None else "learning is on"
    weights = settings.get("weights") or {}
    hand = ", ".join(f"{'every other namespace' if ns == '*' else repr(ns)} {w:.2f}" for ns, w in sorted(weights.items()))
    return f"{verb}: {state}; weights set by hand: {hand or 'none (every namespace automatic)'}"


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def parse_time(text: str) -> float:
    """--before: an ISO 8601 time or seconds since the epoch, from 1970 to now (`checked_rollback_time`)."""
    from ..feedback import checked_rollback_time

    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    formats = "an ISO 8601 time (2026-11-27T12:00:00Z) or seconds since the epoch"
    if seconds is not None:
        return checked_rollback_time(seconds, f"--before {text!r}", formats)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--before {text!r}: give {formats}") from None
    return checked_rollback_time((when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp(),
                                 f"--before {text!r}", formats)


def parse_weight(text: str, namespace: str) -> dict[str, float | None]:
    """`{namespace: weight}` from a number (checked as every setter checks it, `check_settings`, before it is
    sent anywhere: a NaN cannot even travel as JSON) or auto (None)."""
    from ..learning import check_settings

    if text == "auto":
        return {namespace: None}
    try:  # check_settings' InvalidRequest (a ValueError) speaks of JSON's null; here the word is auto
        weights = {namespace: float(text)}
        check_settings(weights, None)
    except ValueError:
        raise ValueError(f"weight {text!r}: give a number from 0 to 1, or auto") from None
    return weights


class LearningTarget:
    """A directory or database opened here, or a running server reached over HTTP."""

    def __init__(self, service=None, url: str | None = None, token: str | None = None, pipeline=None):
        self.service, self.url, self.token, self.pipeline = service, url, token, pipeline

    @classmethod
    def of(cls, target: str, token: str | None, read_only: bool = False, command: str = "learning",
           argv: str = "toolscout learning VERB http://HOST:PORT") -> "LearningTarget":
        """`read_only`: a directory is read as its server serves it, beside the server (a stdio gateway has
        no URL to ask), instead of opened for writing, which a server holding it refuses. `command`: what is
        refused, by name, on a PostgreSQL tenant that has no catalog; `argv`: the command to run against a
        server instead, told when a server holds the directory."""
        if target.startswith(("http://", "https://")):
            return cls(url=target.rstrip("/"), token=token)
        from ..postgres import recorded_spec, require_catalog
        from ..serve.held import current_pipeline
        from ..store.pgvector import is_postgres_spec

        scheme = target.split("://", 1)[0] if "://" in target else None
        if scheme and not is_postgres_spec(target):  # ftp://..., a typo of http: not a directory named so
            raise ValueError(f"{target}: unsupported scheme {scheme!r}; give {TARGETS}")
        target = _index_of_gateway_config(target)
        spec = target if is_postgres_spec(target) else recorded_spec(target)
        if spec:
            require_catalog(spec, command)
        if read_only and not spec:
            return cls(pipeline=current_pipeline(target))
        return cls(open_held(spec or target, f"run it against the server: {argv}"))

    def report(self) -> dict:
        if self.pipeline is not None:
            return self.pipeline.learning_report()
        if not self.url:
            return self.service.learning()
        report = self._http("GET", "/learning")
        missing = [k for k in ("requests", "tools_taught", "events_scored", "measured", "weights") if k not in report]
        if missing:
            raise ValueError(f"{self.url}/learning: JSON without {', '.join(missing)}: not a toolscout server's "
                             "learning report; give a toolscout server's URL (http://HOST:PORT)")
        return report

    def settings(self, weights, freeze) -> dict:
        if self.url:
            return self._http("POST", "/learning", {"weights": weights, "freeze": freeze})
        return self.service.set_learning(weights=weights, freeze=freeze)

    def namespaces(self) -> set[str]:
        """The namespaces the target's catalog holds tools in (that the token may see)."""
        if self.url:
            return set(self._http("GET", "/namespaces")["namespaces"])
        if self.pipeline is not None:
            return {t.namespace or "" for t in self.pipeline.tools}
        return set(self.service.namespaces())

    def rollback(self, before: float, dry_run: bool = False) -> dict:
        if self.pipeline is not None:  # read only: what a rollback would take back
            from ..feedback import rolled_back

            if not dry_run:
                raise ValueError("a directory read beside its server cannot be rolled back here")
            pairs = [(u.source, u.time) for u in self.pipeline.rollback_preview(before)]
            return rolled_back(pairs, self.pipeline.learning.settings.frozen_at, dry_run=True)
        if self.url:
            body = {"before": before, **({"dry_run": True} if dry_run else {})}  # an older server knows no dry_run
            return self._http("POST", "/learning/rollback", body)
        return self.service.rollback_learning(before, dry_run=dry_run)

    def _http(self, method: str, path: str, body: dict | None = None) -> dict:
        from ..errors import require

        require("httpx", feature="talking to a running server's /learning", extra="serve")
        import httpx

        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx.request(method, self.url + path, json=body, headers=headers, timeout=60)
        except httpx.HTTPError as exc:  # nothing listening, a refused connection, a timeout
            raise ValueError(f"{self.url}: cannot reach the server: {exc or type(exc).__name__}") from None
        return self._answer(response, path)

    def _answer(self, response, path: str) -> dict:
        """The JSON a toolscout server answers; a clear error for anything else (another web server's page,
        the gateway's /mcp endpoint given as the server's URL)."""
        where = f"{self.url}{path}"
        mcp = (f"; {self.url} is an MCP endpoint: give the server's URL without /mcp "
               f"({self.url.removesuffix('/mcp')})" if self.url.endswith("/mcp") else "")
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 400:
            message = data.get("error", {}).get("message") if isinstance(data, dict) and \
                isinstance(data.get("error"), dict) else None
            if not isinstance(message, str):  # not toolscout's error JSON: say what it is, not the whole page
                raise ValueError(f"{where}: HTTP {response.status_code}, not a toolscout server's answer "
                                 f"({_content_type(response)}){mcp}; give a toolscout server's URL (http://HOST:PORT)")
            raise ValueError(f"{where}: HTTP {response.status_code}: {message}{mcp}")
        if not isinstance(data, dict):
            raise ValueError(f"{where}: HTTP {response.status_code} with {_content_type(response)}, not a toolscout "
                             f"server's JSON{mcp}; give a toolscout server's URL (http://HOST:PORT)")
        return data

    def close(self) -> None:
        if self.service is not None:
            self.service.close()


TARGETS = "a pipeline directory, a gateway's config file, postgresql://... or a server's URL (http://HOST:PORT)"


def _content_type(response) -> str:
    return (response.headers.get("content-type") or "no content type").split(";")[0]


def _index_of_gateway_config(target: str) -> str:
    """A gateway's config file stands for the index the gateway keeps for it (`toolscout gateway`'s default);
    any other file is refused, naming what it lacks."""
    from pathlib import Path

    from .gateway import default_index

    if not Path(target).is_file():
        return target
    try:
        data = json.loads(Path(target).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        data = None
    if not (isinstance(data, dict) and ("mcpServers" in data or "openapi" in data)):
        raise ValueError(f"{target}: a file, but not a gateway config (no \"mcpServers\" section); give {TARGETS}")
    index = default_index(Path(target))
    if not index.is_dir():
        raise ValueError(f"{target}: a file, so read as a gateway config, but no gateway has kept an index for it "
                         f"({index} does not exist; a gateway given --index DIR or --store keeps it there)")
    return str(index)


REPORT_COLUMNS = "| namespace | (event, tool) pairs: first-seen + repeats | first-seen: MRR served / untaught / " \
                 "full weight | first-seen: top-1 served / untaught | repeats: MRR served / untaught | tools new to " \
                 "learning: MRR served / untaught (pairs) | weight |"


def report_footnote() -> list[str]:
    """What each column of the report's table means."""
    from ..learning.scorecard import WINDOW

    return [
        "Each (event, tool) pair is scored before it is learned: where the ranking as served (learning at the "
        "weight in force), the untaught ranking and learning at full weight put the tool the event used (MRR: mean "
        "of 1/rank; top-1: how often it came first).",
        "first-seen: pairs whose request (case and spaces aside) had not been scored for that tool before: what "
        "learning does to new tasks; watch served vs untaught here.",
        "repeats: the same request again for the same tool; its earlier copy taught the answer, so once learning "
        "lifts, it ranks the tool at or near the top by construction (memorisation, not help to other tasks).",
        "tools new to learning: pairs whose tool no earlier batch had taught.",
        f"weight: automatic, read from the namespace's last {WINDOW:,} first-seen pairs (full weight ranking below "
        "untaught there, beyond noise, turns it down); or set by hand. docs/learning.md, 'Every deployment measures "
        "its own learning'."]


def render_report(report: dict) -> str:
    """The report as a table: per namespace, the used tools' ranks before they were learned, for first-seen
    requests and repeats apart, and learning's weight; then what each column means."""
    from ..eval.report import counted

    lines = [f"learned requests: {report['requests']} over {counted(report['tools_taught'], 'tool')}; "
             f"{report['events_scored']} (event, tool) pairs scored (an event counts once per tool it names)"
             + (f"; frozen since {datetime.fromtimestamp(report['frozen_at'], timezone.utc).isoformat()}"
                if report.get("frozen_at") else ""),
             *([f"{report['dormant']} (docs/learning.md, 'How it learns', step 3)"] if report.get("dormant") else []),
             "", REPORT_COLUMNS, "|---|---|---|---|---|---|---|"]
    weights = report["weights"]
    for ns, figures in report["measured"]["namespaces"].items():
        first = figures.get("first_seen", figures["all"])  # an older server: no repeats told apart
        repeats, new = figures.get("repeats"), figures["new_tools"]
        w = weights.get(ns, {"weight": 1.0, "how": "automatic"})
        lines.append(f"| {ns or '(none)'} | {first['events']} + {repeats['events'] if repeats else '?'} | "
                     f"{_mrrs(first, 'served', 'untaught', 'learned')} | {first['served']['top1']:.3f} / "
                     f"{first['untaught']['top1']:.3f} | {_mrrs(repeats, 'served', 'untaught')} | "
                     f"{_mrrs(new, 'served', 'untaught')} ({new['events']}) | {w['weight']:.2f} ({w['how']}) |")
    history = _weight_history(report.get("weight_history") or [])
    return "\n".join([*lines, "", *report_footnote(), *history])


def _mrrs(figures: dict | None, *rankings: str) -> str:
    if not figures or not figures["events"]:
        return "-"  # no pairs: a mean of nothing would read as 0
    return " / ".join(f"{figures[r]['mrr']:.3f}" for r in rankings)


def _weight_history(history: list[dict], shown: int = 10) -> list[str]:
    """The automatic weights' last changes, each with its time (they happened when learned, not now)."""
    if not history:
        return []
    more = f" (the last {shown} of {len(history)}; --json has them all)" if len(history) > shown else ""
    return ["", f"automatic weight changes{more}:",
            *(f"- {_when(h['time']) if h.get('time') else 'time not known'}: namespace {h['namespace'] or '(none)'!r} "
              f"{h['from']:.2f} -> {h['to']:.2f} ({h['why']})" for h in history[-shown:])]
