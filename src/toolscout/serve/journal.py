"""An append-only, fsync'd journal of catalog writes, kept inside a pipeline directory.

    DIR/CURRENT, DIR/v000007/...   the last full snapshot (`ToolScout.save`, atomic)
    DIR/journal.log                writes acknowledged since that snapshot, one record per line

A line is `CRC32 JSON\\n`: the CRC (8 hex digits) covers the JSON text. A write is acknowledged only
after its line is written and fsync'd, so a crash loses nothing that was acknowledged. On start the
journal is read back: a last line that is incomplete or fails its CRC is the write that was in flight
when the process died (never acknowledged) and is cut off; a bad line *before* the last one means the
file was damaged, and reading stops with an error naming the line rather than dropping acknowledged
writes.

Records: `{"seq": N, "op": "upsert", "tools": [Tool rows]}`, `{"seq": N, "op": "delete", "ids": [...]}`,
tool-use feedback `{"seq": N, "op": "feedback", "events": [...]}` and `{"seq": N, "op": "forget",
"source": S}`, and, first in a file written by a compaction, `{"seq": N, "op": "base"}` (sequence
numbers continue across compactions). A snapshot records the last sequence number it holds, and replay
skips every record up to it, so a crash between a snapshot and the journal's reset applies nothing twice.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any, Iterator

from ..errors import ToolScoutError

JOURNAL = "journal.log"
COMPACT_EVERY = 2_000  # journal items (`items`) between snapshots, by default: bounds what a restart replays


class JournalError(ToolScoutError):
    """The journal is damaged before its last record; acknowledged writes would be lost by going on."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_record(record: dict[str, Any]) -> bytes:
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)
    if "\n" in text:  # json.dumps escapes newlines inside strings; this guards the line framing
        raise ValueError("journal record must not contain a raw newline")
    data = text.encode("utf-8")
    return b"%08x " % zlib.crc32(data) + data + b"\n"


def _decode_line(line: bytes) -> dict[str, Any] | None:
    """The record on one complete line, or None when the line is damaged."""
    if len(line) < 10 or line[8:9] != b" " or not line.endswith(b"\n"):
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("seq"), int) else None


def to_apply(records: list[dict[str, Any]], snapshot_seq: int) -> list[dict[str, Any]]:
    """The writes among `records` that a snapshot saved at `snapshot_seq` does not hold, in order: what a
    replay applies (a write whose apply failed is followed by an abort record with its sequence number)."""
    aborted = {r["seq"] for r in records if r.get("op") == "abort"}
    return [r for r in records
            if r.get("op") not in ("base", "abort") and r["seq"] > snapshot_seq and r["seq"] not in aborted]


def items(record: dict[str, Any]) -> int:
    """What replaying `record` costs, counted as one plus each event, tool or id it holds: replay embeds every
    new request and tool again, so one record of 10,000 events weighs as 10,000 records of one."""
    held = record.get("events") or record.get("tools") or record.get("ids") or ()
    return 1 + len(held)


class Journal:
    """The journal file of one pipeline directory. Not thread-safe: the service serialises writers."""

    def __init__(self, folder: str | os.PathLike, fsync: bool = True):
        self.folder = Path(folder)
        self.path = self.folder / JOURNAL
        self.fsync = fsync
        self.records = 0  # records in the file now (its base aside)
        self.items = 0  # what they hold (`items`): what replaying them costs, which the compaction policy reads
        self.bytes = 0
        self._fd: int | None = None

    # reading -------------------------------------------------------------------------------
    def replay(self) -> Iterator[dict[str, Any]]:
        """Every intact record, in order; cuts off a torn last record. Call once, before `append`."""
        return self._read(cut_torn=True)

    def read(self) -> Iterator[dict[str, Any]]:
        """Every intact record, in order, changing nothing: what a reader beside a running server sees (a
        torn last record is the write in flight, not acknowledged yet)."""
        return self._read(cut_torn=False)

    def _read(self, cut_torn: bool) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        offset, lineno = 0, 0
        while offset < len(data):
            end = data.find(b"\n", offset)
            line = data[offset:] if end < 0 else data[offset:end + 1]
            lineno += 1
            record = _decode_line(line)
            if record is None:
                if offset + len(line) >= len(data):  # the last line: a write that never completed
                    if cut_torn:
                        self._truncate(offset)
                    break
                raise JournalError(
                    f"{self.path}:{lineno}: damaged journal record before the end of the file; the records after "
                    "it were acknowledged to clients. Restore the file from a backup, or move it away to start "
                    "from the last snapshot (losing the writes it holds)")
            offset += len(line)
            if record.get("op") != "base":
                self.records += 1
                self.items += items(record)
            yield record
        self.bytes = offset

    def records_after(self, seq: int) -> list[dict[str, Any]]:
        """The intact records after `seq`, read from the file as it is now (nothing changed: the caller
        holds the writers' lock, so no append is half done)."""
        if not self.path.exists():
            return []
        records = [_decode_line(line + b"\n") for line in self.path.read_bytes().split(b"\n") if line]
        return [r for r in records if r is not None and r["seq"] > seq]

    def _truncate(self, size: int) -> None:
        with open(self.path, "rb+") as fh:
            fh.truncate(size)
            os.fsync(fh.fileno())

    # writing -------------------------------------------------------------------------------
    def _open(self) -> int:
        if self._fd is None:
            existed = self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if not existed and self.fsync:
                _fsync_dir(self.folder)
        return self._fd

    def append(self, record: dict[str, Any]) -> None:
        """Write one record; it is on disk when this returns (with `fsync`)."""
        data = encode_record(record)
        fd = self._open()
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if self.fsync:
            os.fdatasync(fd)
        self.records += 1
        self.items += items(record)
        self.bytes += len(data)

    def reset(self, base_seq: int) -> None:
        """Start an empty journal (after a snapshot that holds every record up to `base_seq`)."""
        tmp = self.folder / f".{JOURNAL}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(encode_record({"seq": base_seq, "op": "base"}))
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        self.close()
        os.replace(tmp, self.path)
        if self.fsync:
            _fsync_dir(self.folder)
        self.records = self.items = 0
        self.bytes = self.path.stat().st_size

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
