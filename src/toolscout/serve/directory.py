"""A pipeline directory as the service's storage: `toolscout serve DIR`.

`DirectoryStorage.open(DIR)` loads the pipeline directory (written by `toolscout index` or
`ToolScout.save`), takes its lock (one server per directory) and replays the journal of writes
acknowledged since its last snapshot.

Concurrency: searches and reads run in parallel (the pipeline's shared lock); a write is applied under
the pipeline's exclusive lock, so a search sees the catalog before or after a write, never half of one.
Writers queue on one mutex, which also orders the journal.

Durability: a write is appended to `DIR/journal.log` and fsync'd *before* it is applied and
acknowledged (see `journal.py`); only the changed tools are re-embedded (`ToolScout.add`). When the
journal holds `compact_every` items (`journal.items`: each write, event, tool and id counts, since replay
embeds each again) or `compact_bytes`, and at `close`, the whole pipeline is saved atomically
(`ToolScout.save`, searches keep running, writers wait) with the journal position in its config, and the
journal starts afresh. On `open`, the journal's net effect (last write per id wins) is applied in one
batch, so a long journal replays in one re-embedding pass; feedback replays with the ranks it was scored
by (journalled with it: no search again), and a journal replayed at `open` is compacted at once (in the
background), so a second crash does not replay it again.

One directory holds one catalog: tenants need the PostgreSQL store.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from ..artifacts import POINTER, SERVE_LOCK
from ..errors import Conflict, InvalidRequest, NotFound, ToolScoutError
from ..feedback import FeedbackEvent, LearnResult
from ..learning.scorecard import Ranks
from ..pipeline import ToolScout
from ..postgres import recorded_spec
from ..retrievers.base import task_encoders
from ..tool import Tool
from ..train.feedback import Retrained
from .errors import DirectoryHeld, ServiceError, ServiceUnavailable
from .journal import COMPACT_EVERY, Journal, to_apply
from .storage import Authorize, Visible, WriteResult

LOCK_FILE = SERVE_LOCK
LEARNING_OPS = ("feedback", "forget", "rollback", "learning")  # journal records about learning from use
MODELS = "models"  # models a retraining trained, which the pipeline swapped in refers to
logger = logging.getLogger(__name__)


class DirectoryStorage:
    """The storage of one pipeline directory (its one catalog), safely from many threads. See the module doc."""

    kind = "directory"
    versions_are_local = True

    def __init__(self, scout: ToolScout, folder: str | os.PathLike, *, journal: Journal, seq: int = 0,
                 compact_every: int = COMPACT_EVERY, compact_bytes: int = 64 << 20, lock_fd: int | None = None):
        self.scout = scout
        self.folder = Path(folder)
        self.journal = journal
        self.seq = seq
        self.compact_every = compact_every
        self.compact_bytes = compact_bytes
        self.compactions = 0
        self.last_compaction_s: float | None = None
        self.failed: str | None = None  # set when a write could not be recorded; writes are refused
        self.snapshot_failed: str | None = None  # why the last snapshot could not be saved (writes go on)
        self._writer = threading.Lock()
        self._compactor: threading.Thread | None = None
        self._lock_fd = lock_fd
        self._closed = False
        self._retraining = False

    # lifecycle -----------------------------------------------------------------------------
    @classmethod
    def open(cls, folder: str | os.PathLike, *, fsync: bool = True, fast_queries: bool | str | None = None,
             **options: Any) -> "DirectoryStorage":
        """Load `folder`, take its lock (one server per directory) and replay its journal. `fast_queries`:
        how tasks are encoded (`ToolScout.load`: None, as the directory was saved)."""
        folder = Path(folder)
        check_servable(folder)
        lock_fd = lock_directory(folder)
        try:
            scout = ToolScout.load(folder, fast_queries=fast_queries)
            journal = Journal(folder, fsync=fsync)
            seq = replay_journal(scout, list(journal.replay()), snapshot_seq(scout), journal.path)
            storage = cls(scout, folder, journal=journal, seq=seq, lock_fd=lock_fd, **options)
        except BaseException:
            os.close(lock_fd)
            raise
        if journal.records:  # replayed: saved now, so a second crash does not replay it all again
            storage._compact_soon()
        return storage

    def close(self, compact: bool = True) -> None:
        """Save a snapshot if the journal holds writes (unless `compact=False` or a write failed: then the
        directory is left as a crash would leave it), and release the directory."""
        if self._closed:
            return
        compactor = self._compactor
        if compactor is not None:
            compactor.join()
        if compact and self.failed is None:
            try:
                self.compact()
            except ServiceUnavailable as exc:  # the journal holds every write: the next start replays it
                logger.error("%s", exc)
        with self._writer:
            self._closed = True
            self.journal.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def tenant(self, name: str | None) -> "DirectoryStorage":
        if name is not None:
            raise InvalidRequest(f"tenant {name!r}: a pipeline directory holds one catalog; tenants need the "
                                 "PostgreSQL store (--store postgresql://...)")
        return self

    def describe(self) -> str:
        return str(self.folder)

    def set_feedback_cap(self, cap: int) -> None:
        if cap < 1:
            raise InvalidRequest(f"the feedback cap must be at least 1, got {cap}")
        with self._writer:
            self.scout.ledger.per_source_cap = int(cap)  # saved with the next snapshot

    # reads: the service reads the pipeline itself ---------------------------------------------
    def pipeline(self, fresh: bool = True) -> ToolScout:
        return self.scout  # one process owns the directory: its pipeline is always current

    def held(self) -> ToolScout:
        return self.scout

    def version(self) -> int:
        return self.seq

    def current_version(self) -> int:
        return self.seq  # one process owns the directory: what it knows is current

    # writes --------------------------------------------------------------------------------
    def upsert(self, tools: Sequence[Tool], authorize: Authorize) -> WriteResult:
        with self._writer:
            self._check_open()
            result = WriteResult(self.seq)
            changed = []
            for tool in tools:
                old = self.scout.get(tool.id, None)
                authorize(tool, old)
                if tool.same_as(old):
                    result.unchanged.append(tool.id)
                    continue
                (result.created if old is None else result.updated).append(tool.id)
                changed.append((tool, old))
            if changed:
                now = time.time()
                self._apply({"op": "upsert", "tools": [t.to_record() for t, _old in changed], "time": now},
                            lambda: self.scout.add([t for t, _old in changed], when=now))
            result.seq = self.seq
        self._maybe_compact()
        return result

    def delete(self, ids: Sequence[str], visible: Visible) -> WriteResult:
        with self._writer:
            self._check_open()
            tools = [self.scout.get(i, None) for i in ids]
            unknown = [i for i, t in zip(ids, tools) if t is None or not visible(t.namespace)]
            if unknown:
                raise NotFound(f"no tool with id {unknown[0]!r}" if len(unknown) == 1
                               else f"no tools with ids {unknown[:5]}")
            if ids:
                self._apply({"op": "delete", "ids": list(ids)}, lambda: self.scout.remove(ids))
            result = WriteResult(self.seq, deleted=list(ids))
        self._maybe_compact()
        return result

    # feedback ------------------------------------------------------------------------------
    def learn(self, events: Sequence[FeedbackEvent]) -> LearnResult:
        """Journal the events with their times (durable first), then learn from them (`ToolScout.learn`)."""
        now = time.time()
        events = [e.at(now) for e in events]
        with self._writer:
            self._check_open()
            ranks = self.scout.measure(events)  # journalled with the events: a replay need not search again
            result: list[LearnResult] = []
            record = {"op": "feedback", "events": [e.to_dict() for e in events],
                      "ranks": ranks_record(events, ranks), "time": now}
            self._apply(record, lambda: result.append(self.scout.learn(events, ranks)))
        self._maybe_compact()
        return result[0]

    def rollback(self, before: float, dry_run: bool = False) -> list[tuple[str, float]]:
        with self._writer:
            self._check_open()
            if dry_run or not self.scout.holds_feedback_since(before):  # no write, no new version
                return [(u.source, u.time) for u in self.scout.rollback_preview(before)]
            removed: list[list] = []
            self._apply({"op": "rollback", "before": before, "time": time.time()},
                        lambda: removed.append([(u.source, u.time) for u in self.scout.rollback(before)]))
        return removed[0]

    def set_learning(self, weights: dict[str, float | None] | None = None, freeze: bool | None = None) -> dict:
        record = {"op": "learning", "weights": weights or {}, "freeze": freeze, "when": time.time()}
        with self._writer:
            self._check_open()
            settings: list = []
            self._apply(record, lambda: settings.append(_set_learning(self.scout, record)))
        return settings[0].to_dict()

    def forget(self, source: str) -> list[str] | None:
        with self._writer:
            self._check_open()
            if not self.scout.holds_feedback_of(source):  # nothing to take back: no write, no new version
                return None
            touched: list[list[str]] = []
            self._apply({"op": "forget", "source": source, "time": time.time()},
                        lambda: touched.append(self.scout.forget(source)))
        self._maybe_compact()
        return touched[0]

    def check_retraining(self, method: str, **options: Any) -> None:
        from ..train.feedback import check_retraining

        if self._retraining:
            raise Conflict("a retraining is already running on this index")
        check_retraining(self.scout, method, options)

    def retrain(self, method: str, workdir: str | os.PathLike | None = None, **options: Any) -> Retrained:
        """Heavier learning (`toolscout.train.feedback`): train `method` on the feedback so far while searches
        and writes go on; when held-back feedback says the result ranks better, swap it in, in one step,
        with every write made meanwhile, and save a snapshot. Otherwise nothing changes."""
        from ..train.feedback import retrain

        with self._writer:
            self._check_open()
            if self._retraining:
                raise Conflict("a retraining is already running on this index")
            self._retraining, since = True, self.seq
        try:  # the model stays with the index, which refers to it (a temporary folder may be cleaned away)
            model_dir = self._new_model_dir(method)
            result = retrain(self.scout, method, workdir, model_dir=model_dir, **options)
            if result.improved:
                with self._writer:  # writes made while it trained go into the new pipeline too
                    replay_journal(result.scout, self.journal.records_after(since), since, self.journal.path,
                                   rescore=True)  # the ranks journalled were the old pipeline's
                    self.scout = result.scout
        finally:
            self._retraining = False
        if not result.improved:  # nothing refers to it: it would only fill the index folder
            shutil.rmtree(model_dir, ignore_errors=True)
        if result.improved:
            try:  # saved even with no write journalled since the last snapshot: the pipeline itself changed
                self.compact(force=True)
            except ServiceUnavailable as exc:
                logger.error("the retrained pipeline serves, but %s; a restart before a snapshot succeeds serves "
                             "the previous one", exc)
        return result

    def _new_model_dir(self, method: str) -> Path:
        """A folder no earlier retraining wrote: a retraining not swapped in removes its folder, which must
        never be the one the serving pipeline refers to (two retrainings can end within one second)."""
        stem = f"{method}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        taken = self.folder / MODELS / stem
        n = 1
        while taken.exists():
            n += 1
            taken = self.folder / MODELS / f"{stem}-{n}"
        return taken

    def feedback_of(self, tool_id: str) -> dict[str, int]:
        return self.scout.ledger.summary(tool_id)

    def learned_of(self, tool_ids: Sequence[str]) -> dict[str, int]:
        return {tool_id: self.scout.ledger.summary(tool_id)["learned"] for tool_id in tool_ids}

    def feedback_totals(self) -> dict[str, Any]:
        ledger = self.scout.ledger
        return {"events": ledger.events, "failures": ledger.failures, "sources": ledger.sources()}

    def _apply(self, record: dict[str, Any], apply) -> None:
        """Journal `record` as the next write (durable first), then apply it. A write that fails to apply
        is marked aborted in the journal, and its number stays spent."""
        seq = self.seq + 1
        self._record({"seq": seq, **record})
        try:
            apply()
        except BaseException:
            self._abort(seq)
            raise
        finally:
            self.seq = seq

    def compact(self, force: bool = False) -> bool:
        """Save a full snapshot and empty the journal (searches go on; writes wait). False if nothing to do
        (no write journalled, unless `force`), and while a retraining runs (it needs the journal's records
        since it began)."""
        with self._writer:
            if self._closed or (self.journal.records == 0 and not force) or self._retraining:
                return False
            start = time.perf_counter()
            try:
                self.scout.save(self.folder, extra_config={"journal_seq": self.seq}, held_lock=self._lock_fd)
            except OSError as exc:  # a full or read-only disk: the next compaction tries again
                self.snapshot_failed = f"could not save a snapshot in {self.folder}: {exc}"
                raise ServiceUnavailable(f"{self.snapshot_failed}; every acknowledged write is still in the "
                                         "journal") from exc
            self.snapshot_failed = None
            self.journal.reset(self.seq)
            self.compactions += 1
            self.last_compaction_s = time.perf_counter() - start
            return True

    def stats(self) -> dict[str, Any]:
        return {"retriever": self.scout.retriever.name, "fast_queries": self.scout.fast_queries is not None,
                "task_encoders": task_encoders(self.scout.retriever),
                "journal_records": self.journal.records, "journal_items": self.journal.items,
                "journal_bytes": self.journal.bytes, "compactions": self.compactions,
                "last_compaction_s": self.last_compaction_s,
                "snapshots": "failed: " + self.snapshot_failed if self.snapshot_failed else "ok"}

    # internals -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ServiceError("the service is closed")
        if self.failed is not None:
            raise ServiceUnavailable(f"writes are disabled: {self.failed}; restart the server")

    def _record(self, record: dict[str, Any]) -> None:
        try:
            self.journal.append(record)
        except OSError as exc:  # nothing applied, nothing acknowledged; the file may hold a torn tail
            self.failed = f"could not append to {self.journal.path}: {exc}"
            raise ServiceUnavailable(self.failed) from exc

    def _abort(self, seq: int) -> None:
        """A journalled write failed to apply: record that it must be skipped on replay."""
        try:
            self.journal.append({"seq": seq, "op": "abort"})
        except OSError as exc:
            self.failed = f"write {seq} failed and its abort could not be journalled: {exc}"

    def _maybe_compact(self) -> None:
        if self.journal.items < self.compact_every and self.journal.bytes < self.compact_bytes:
            return
        self._compact_soon()

    def _compact_soon(self) -> None:
        """Compact in the background (searches go on; writes wait for the snapshot), unless one runs."""
        with self._writer:
            running = self._compactor is not None and self._compactor.is_alive()
            if running or self._closed:
                return
            self._compactor = threading.Thread(target=self._compact_in_background, name="toolscout-compact",
                                               daemon=True)
            self._compactor.start()

    def _compact_in_background(self) -> None:
        try:
            self.compact()
        except Exception as exc:  # the journal still holds every write; the next trigger retries
            logger.error("compaction of %s failed: %s", self.folder, exc)


def check_servable(folder: Path) -> None:
    if not (folder / POINTER).is_file():
        raise ServiceError(f"{folder}: not a pipeline directory written by `toolscout index` or ToolScout.save "
                           f"(no {POINTER} file); index a catalog into it first")
    store = recorded_spec(folder)
    if store:  # its catalog is the database's: writes and feedback belong there, not in a journal here
        raise ServiceError(f"{folder}: was indexed into PostgreSQL ({store}); serve the database: "
                           "ToolService.open(DIR's store spec), or `toolscout serve DIR`, which does")


def snapshot_seq(scout: ToolScout) -> int:
    """The last journal record the snapshot `scout` was loaded from holds."""
    return int(scout.saved_config.get("journal_seq", 0))


def lock_directory(folder: Path) -> int:
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ServiceError(f"{folder}: cannot open {LOCK_FILE} for writing ({exc.strerror}): a server, and a "
                           "command that changes the directory, write there (`toolscout search DIR` only reads)"
                           ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DirectoryHeld(f"{folder}: another toolscout server is serving this directory "
                           f"(it holds {folder / LOCK_FILE}); stop it first") from None
    return fd


def replay_journal(scout: ToolScout, records: list[dict[str, Any]], snapshot_seq: int, where: Path,
                   rescore: bool = False) -> int:
    """Apply the journal records newer than the snapshot, in order; return the last sequence number.
    Runs of tool writes are applied as one batch (their net effect: last write per id wins), so a long
    journal re-embeds in one pass; feedback records are applied where they stand between them, scored by
    the ranks journalled with them (`rescore`: scored anew, on a pipeline other than the one that wrote them)."""
    pending: dict[str, Tool | None] = {}  # id -> its last written state in the current run (None: deleted)
    joined: dict[str, float] = {}  # id -> when it was first written in the current run
    for record in to_apply(records, snapshot_seq):
        op = record.get("op")
        if op == "upsert":
            pending.update({row["id"]: Tool.from_record(row) for row in record["tools"]})
            for row in record["tools"]:
                joined.setdefault(row["id"], float(record.get("time", 0.0)))
        elif op == "delete":
            pending.update(dict.fromkeys(record["ids"]))
        elif op in LEARNING_OPS:
            _write_tools(scout, pending, joined)
            pending, joined = {}, {}
            with scout.replaying(_made_at(record)):
                _learning_record(scout, record, rescore)
        else:
            raise ToolScoutError(f"{where}: unknown journal record type {op!r} (written by a newer toolscout?)")
    _write_tools(scout, pending, joined)
    return max([snapshot_seq, *(r["seq"] for r in records)])


def _made_at(record: dict[str, Any]) -> float | None:
    """When a journalled learning write was first made (records written before they kept it: the last event's
    time for feedback, else not known)."""
    when = record.get("time", record.get("when"))
    if when is None and record.get("events"):
        when = max((e.get("time") or 0.0) for e in record["events"]) or None
    return when


def _learning_record(scout: ToolScout, record: dict[str, Any], rescore: bool) -> None:
    """Apply one journalled record about learning: feedback, a source taken back, a rollback, settings.
    Feedback journalled without its ranks (before they were kept) is scored anew."""
    op = record["op"]
    if op == "feedback":
        events = [FeedbackEvent.from_dict(e) for e in record["events"]]
        journalled = "ranks" in record and not rescore
        scout.learn(events, ranks_of_record(events, record["ranks"]) if journalled else None)
    elif op == "forget":
        scout.forget(record["source"])
    elif op == "rollback":
        scout.rollback(float(record["before"]))
    else:
        _set_learning(scout, record)


def ranks_record(events: Sequence[FeedbackEvent], ranks: dict[tuple[str, str], Ranks]) -> list[list]:
    """`ranks` as a feedback record keeps them: per event, per tool id, [served, untaught, learned, passed_by]
    (null: not scored)."""
    def one(query: str, tool: str) -> list | None:
        r = ranks.get((query, tool))
        return None if r is None else [r.served, r.untaught, r.learned, list(r.passed_by)]
    return [[one(e.query, t) for t in e.tool_ids] for e in events]


def ranks_of_record(events: Sequence[FeedbackEvent], rows: list[list]) -> dict[tuple[str, str], Ranks]:
    """What `ranks_record` wrote, back as `ToolScout.measure` gave it."""
    return {(e.query, t): Ranks(r[0], r[1], r[2], tuple(r[3]))
            for e, row in zip(events, rows) for t, r in zip(e.tool_ids, row) if r is not None}


def _set_learning(scout: ToolScout, record: dict[str, Any]):
    return scout.set_learning(weights=record.get("weights") or None, freeze=record.get("freeze"),
                              when=record.get("when"))


def _write_tools(scout: ToolScout, final: dict[str, Tool | None], joined: dict[str, float]) -> None:
    """The run's net effect; each new tool joins when its first write was journalled, as it did live."""
    upserts = [t for t in final.values() if t is not None]
    deletes = [i for i, t in final.items() if t is None and i in scout]
    for when in sorted({joined.get(t.id, 0.0) for t in upserts if t.id not in scout}):
        scout.add([t for t in upserts if t.id not in scout and joined.get(t.id, 0.0) == when], when=when)
    if upserts:
        scout.add(upserts)
    if deletes:
        scout.remove(deletes)
