"""A pipeline directory seen by a command beside the server that may hold it (`serve/directory.py`: one
server per directory, its writes in a journal beside the snapshot): `toolscout search` and `toolscout learning
report` read it as that server serves it, and `toolscout index --out DIR` replaces it only while no server
holds it, so the old catalog's journal is never replayed over the new one."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

from ..artifacts import POINTER, ArtifactError, check_replaceable, current_version
from ..errors import ToolScoutError
from ..pipeline import FEEDBACK_FILE, LEARNING_FOLDER, ToolScout
from ..spec import PIPELINE_KIND, read_pipeline_config
from .directory import LEARNING_OPS, DirectoryStorage, check_servable, lock_directory, replay_journal, snapshot_seq
from .errors import DirectoryHeld, ServiceError
from .journal import Journal, to_apply

READ_TRIES = 3  # a reader beside a server reads again this often when a compaction moves under it
logger = logging.getLogger(__name__)


def current_pipeline(folder: str | os.PathLike, *, fast_queries: bool | str | None = None) -> ToolScout:
    """The pipeline of a directory as a server would serve it now: its snapshot with the journal's writes
    and feedback applied. Reads only (no lock, the journal untouched), so it may run beside the server
    that holds the directory; a compaction by that server between reading the snapshot and the journal
    (the journal then starts after the snapshot read) is read again."""
    folder = Path(folder)
    check_servable(folder)
    for attempt in range(READ_TRIES):
        live = current_version(folder)
        try:
            scout = ToolScout.load(folder, fast_queries=fast_queries)
        except (ArtifactError, OSError):  # the version being read was removed by a compaction (else: damaged)
            if attempt == READ_TRIES - 1 or current_version(folder) == live:
                raise
            continue
        journal = Journal(folder, fsync=False)
        records = list(journal.read())
        base = next((r["seq"] for r in records if r.get("op") == "base"), None)
        if base is None or base <= snapshot_seq(scout):  # the journal goes on from this snapshot
            replay_journal(scout, records, snapshot_seq(scout), journal.path)
            return scout
    raise ServiceError(f"{folder}: its server compacted it {READ_TRIES} times while it was read; try again")


class Replacement:
    """A directory held while a new pipeline replaces the one in it (`replacing`). `config` is what the new
    snapshot must carry so that no record of the old journal (writes to the catalog being replaced) is ever
    replayed over it; `saved()`, once it is saved, starts the journal afresh."""

    def __init__(self, folder: Path, journal: Journal | None = None, last: int = 0, pending: int = 0,
                 journal_learned: bool = False, lock_fd: int | None = None):
        self.folder, self.journal, self.last, self.pending = folder, journal, last, pending
        self.lock_fd = lock_fd  # the directory's serve lock, held: what saving the new pipeline passes on
        self.journal_learned = journal_learned  # its journal holds feedback or learning settings since the snapshot

    def holds_learning(self) -> bool:
        """Whether the index being replaced learned from feedback (or has learning settings): in its snapshot
        or its journal. Reads no index file, so a damaged index can still be replaced when it learned nothing."""
        live = current_version(self.folder)
        return live is not None and (self.journal_learned or (live / FEEDBACK_FILE).exists()
                                     or (live / LEARNING_FOLDER).exists())

    def learned(self) -> ToolScout | None:
        """The index being replaced as its server would serve it, when it learned from feedback (what the new
        index takes over, `ToolScout.carry_learning`); None when it learned nothing."""
        return current_pipeline(self.folder) if self.holds_learning() else None

    @property
    def config(self) -> dict[str, int]:
        return {"journal_seq": self.last} if self.journal is not None else {}

    def saved(self) -> None:
        if self.journal is None:
            return
        if self.pending:
            logger.warning("%s: its journal held %d catalog writes made since its last snapshot; they belonged to the "
                           "catalog now replaced", self.folder, self.pending)
        if self.journal.path.exists():
            self.journal.reset(self.last)


@contextlib.contextmanager
def replacing(folder: str | os.PathLike) -> Iterator[Replacement]:
    """Hold a directory while a new pipeline replaces the one in it (`toolscout index --out DIR`, into a
    directory or PostgreSQL): refused while a server serves it (see `Replacement`), and, before any work, when
    it holds something an index would replace (a trained model, a benchmark folder: `check_replaceable`)."""
    folder = Path(folder)
    check_replaceable(folder, {"kind": PIPELINE_KIND})
    if not (folder / POINTER).is_file():
        yield Replacement(folder)
        return
    lock_fd = lock_directory(folder)
    try:
        journal = Journal(folder)
        records = journal.records_after(-1)  # every intact record: a damaged journal is being replaced anyway
        pending = to_apply(records, _saved_journal_seq(folder))
        learned = [r for r in pending if r.get("op") in LEARNING_OPS]  # the new index takes these over
        yield Replacement(folder, journal, max((r["seq"] for r in records), default=0),
                          len(pending) - len(learned), bool(learned), lock_fd)
    finally:
        os.close(lock_fd)


@contextlib.contextmanager
def held_for_copy(folder: str | os.PathLike) -> Iterator[int]:
    """Hold a directory while a copy of its snapshot is made (`toolscout migrate`): with every acknowledged write
    in it, and no server serving it meanwhile. Writes a server journalled and did not save (it stopped without
    saving) are saved into a new snapshot first, as a server's start does; yields how many. Refused
    (`DirectoryHeld`) while a server serves it; a failed save raises (`ServiceUnavailable`) and copies nothing."""
    folder = Path(folder)
    if not (folder / POINTER).is_file():  # not an index directory: the copy says what it is instead
        yield 0
        return
    unsaved = len(_unsaved_writes(folder))
    if unsaved:
        storage = DirectoryStorage.open(folder)  # takes the lock and replays the journal
        try:
            storage.compact(force=True)
        finally:
            storage.close(compact=False)
    lock_fd = lock_directory(folder)
    try:
        if _unsaved_writes(folder):  # a server started and wrote between the save and the lock
            raise DirectoryHeld(f"{folder}: a server wrote to it while it was being saved; stop it first")
        yield unsaved
    finally:
        os.close(lock_fd)


def _unsaved_writes(folder: Path) -> list[dict]:
    """The journal's records its snapshot does not hold (what a server's start would replay)."""
    return to_apply(Journal(folder, fsync=False).records_after(-1), _saved_journal_seq(folder))


def _saved_journal_seq(folder: Path) -> int:
    try:
        return int(read_pipeline_config(folder)[1].get("journal_seq", 0))
    except (ToolScoutError, OSError, ValueError):  # an unreadable snapshot holds none of the journal
        return 0
