"""Saved artefacts: a directory of plain files with a `config.json`, written atomically.

Layout of an artefact directory `DIR`:

    DIR/CURRENT          one line: the name of the live version folder, e.g. `v000003`
    DIR/v000003/config.json, ...   the files of that version

`write_artifact` builds a new version folder beside the live one, fsyncs it, then swaps `CURRENT` with
one `os.replace` — a single atomic rename. A crash at any point leaves the previous version loadable;
leftovers of an interrupted write are removed by the next successful one. Each writer claims its version
number (a locked `.vNNNNNN.writing` file), so writers that start together never take one number, and a
commit removes the versions it replaced but never one another writer is still writing.

A write never silently discards another writer's: it is refused (`SaveRefused`) while a server holds the
directory (`DIR/serve.lock`: the server's next snapshot would replace it), and, for a writer that says which
version it read (`expected_version`), when another writer has made a newer one live since (a lost update).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .errors import ArtifactError, DamagedFile, SaveRefused  # defined with the other errors; imported from here too

POINTER = "CURRENT"
CONFIG = "config.json"
WRITE_LOCK = "write.lock"  # held by a save from its version check to its commit (`write_artifact`)
_CLAIM = ".writing"  # `.vNNNNNN.writing`: held by the writer of that version (`_claim_version`)
CLAIM_LOCK = "claim.lock"  # held while a version number is claimed, or while a commit decides what to remove
SERVE_LOCK = "serve.lock"  # what a server serving the directory holds locked (`serve/directory.py`)


DAMAGED_INDEX = "the index folder {} is damaged: index the catalog again, or restore the folder"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb+") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(root))


def replace_file(path: Path, data: bytes | str, *, fsync: bool = False, mode: int = 0o644) -> None:
    """Write `data` to a file beside `path`, then rename it over `path`: a reader, or a crash, sees the old file
    or the new one whole. `mode`: the new file's (a temporary file is made owner-only); `fsync`: on disk first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    """The JSON value in `path`; a file missing, cut short or not JSON is a `DamagedFile` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedFile(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise DamagedFile(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise DamagedFile(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def read_json_lines(path: Path) -> list[Any]:
    """One JSON value per line of `path` (blank lines skipped); errors name the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedFile(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise DamagedFile(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    out = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DamagedFile(f"{path}:{lineno}: invalid JSON at column {exc.colno}: {exc.msg}") from None
    return out


def load_array(path: Path) -> Any:
    """The numpy array saved in `path` (`.npy`), or an `.npz`'s arrays as a dict, read whole; a file missing
    or cut short is a `DamagedFile` naming it."""
    import numpy as np

    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):  # its arrays are read when asked for: read them now
            with data:
                return {name: data[name] for name in data.files}
        return data
    except FileNotFoundError:
        raise DamagedFile(f"{path}: file not found") from None
    except (EOFError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise DamagedFile(f"{path}: not a whole numpy file ({exc})") from None


def current_version(root: Path) -> Path | None:
    pointer = root / POINTER
    if not pointer.exists():
        return None
    name = _pointed(root)
    folder = root / name
    return folder if name and folder.is_dir() else None


def _pointed(root: Path) -> str:
    """The version `root/CURRENT` names ("" when it names none: empty, or not text)."""
    try:
        return (root / POINTER).read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        return ""


def resolve(root: str | os.PathLike) -> Path:
    """The folder holding the live files of artefact `root` (also accepts a plain folder with config.json)."""
    root = Path(root)
    if not root.exists():
        raise ArtifactError(f"{root}: no such directory")
    live = current_version(root)
    if live is not None:
        return live
    if (root / POINTER).exists():
        name = _pointed(root)
        said = f"names the version {name!r}, which is not there" if name else "is empty, naming no version"
        raise ArtifactError(f"{root}: {POINTER} {said} (the directory was damaged or copied in part); restore it, "
                            "or index the catalog again")
    if (root / CONFIG).exists():
        return root
    raise ArtifactError(f"{root}: not a toolscout artefact (no {POINTER} file and no {CONFIG})")


def read_config(root: str | os.PathLike, kind: str | None = None, *, max_format: int) -> tuple[Path, dict]:
    """Load the config of the artefact at `root`, checking its kind and that its format version is one this
    toolscout reads (`max_format`: each kind's own; no default, so no reader refuses what its writer writes)."""
    folder = resolve(root)
    config = read_json(folder / CONFIG)
    if kind is not None and config.get("kind") != kind:
        raise ArtifactError(f"{root}: holds a {config.get('kind')!r} artefact, expected {kind!r}")
    check_format(root, config, max_format)
    return folder, config


def check_format(root: str | os.PathLike, config: Mapping[str, Any], max_format: int) -> None:
    """Refuse an artefact config whose format_version this toolscout does not read, naming `root`."""
    fmt = config.get("format_version")
    if "format_version" not in config:  # every toolscout writes one: upgrading will not help
        raise ArtifactError(f"{root}: its {CONFIG} has no format_version, so it is not a toolscout index or model "
                            "config, or it is damaged")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise ArtifactError(f"{root}: its {CONFIG} has format_version {fmt!r}, which no toolscout writes "
                            "(formats are whole numbers from 1); the folder is damaged")
    if fmt > max_format:
        raise ArtifactError(
            f"{root}: format_version {fmt!r} is not supported (this toolscout reads up to {max_format}); upgrade toolscout"
        )


# what each kind of artefact is, in the words of the commands that write it (for refusals)
KIND_WORDS = {"toolscout.pipeline": "an index", "toolscout.model": "a trained model"}


def describe(config: Mapping[str, Any]) -> str:
    """An artefact's config in words: 'an index', "a trained 'tool2vec' model", "a 'toolscout.x' artefact"."""
    kind, method = config.get("kind"), config.get("method")
    if kind == "toolscout.model" and method:
        return f"a trained {method!r} model"
    return KIND_WORDS.get(kind, f"a {kind!r} artefact")


def check_replaceable(root: str | os.PathLike, config: Mapping[str, Any]) -> None:
    """Refuse to write an artefact like `config` into `root` when the new version would replace something
    else: a file, a folder that is not an artefact (a benchmark folder...), or an artefact of another kind
    (an index written over a trained model). Every save goes through here (`write_artifact`); commands call
    it before their work too, so that the refusal comes first."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ArtifactError(f"{root}: exists and is not a directory")
    if not root.is_dir():
        return
    held = _live_config(root)
    if held is None:
        if not (root / POINTER).exists() and not unfinished_first_save(root):
            raise ArtifactError(f"{root}: directory exists, is not empty and is not a toolscout artefact; "
                                "refusing to write into it")
        return
    held = held if isinstance(held, dict) else {}
    if held.get("kind") != config["kind"]:
        raise ArtifactError(f"{root}: holds {describe(held)}; writing {describe(config)} there would replace it. "
                            "Give another folder, or remove that one first")


def _live_config(root: Path, tries: int = 5) -> Any:
    """The live version's config (None: no live version). A version another writer's commit replaced and
    removed while it was being read is read again at the new one; one that cannot be read while it stays
    live is refused: what it holds is unknown, so nothing is written over it."""
    for _ in range(tries):
        live = current_version(root)
        if live is None:
            return None
        try:
            return read_json(live / CONFIG)
        except ArtifactError as exc:
            if current_version(root) == live:
                raise ArtifactError(f"{root}: its live version cannot be read ({exc}), so what it holds is unknown; "
                                    "give another folder, or remove that one first") from None
    raise ArtifactError(f"{root}: its live version changed {tries} times while it was read (other writers are "
                        "saving there); try again")


def unfinished_first_save(root: Path) -> bool:
    """Whether `root`, which has no CURRENT, holds nothing but what a first save makes before its commit (or
    left when it died): empty, or version folders, claims, locks and pointer files. Another first save may be
    under way; a crashed one left its folder. Either way the directory is this writer's to save into."""
    return all(_version_number(entry.name) is not None or entry.name in (WRITE_LOCK, CLAIM_LOCK)
               or (entry.name.startswith(".v") and entry.name.endswith(_CLAIM))
               or (entry.name.startswith(f".{POINTER}.") and entry.name.endswith(".tmp"))
               for entry in root.iterdir())


def live_version_name(root: str | os.PathLike) -> str | None:
    """The name of `root`'s live version folder (what `CURRENT` names), or None when it has no `CURRENT`."""
    return _pointed(Path(root)) if (Path(root) / POINTER).exists() else None


def check_not_served(root: Path, held_lock: int | None = None) -> None:
    """Refuse to write into `root` while a live process holds its serve lock (`toolscout serve`): that server
    keeps its own catalog in memory and its next snapshot would replace the write. `held_lock`: the open lock
    file of a caller that holds the lock itself (the server's own snapshot, `toolscout index --out`)."""
    try:
        fd = os.open(root / SERVE_LOCK, os.O_RDONLY)
    except OSError:  # no lock file (never served), or none that can be opened: no server can hold it either
        return
    try:
        if held_lock is not None and os.path.samestat(os.fstat(fd), os.fstat(held_lock)):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as the probe is closed
        except BlockingIOError:
            raise SaveRefused(f"{root}: a toolscout server is serving this directory (a live process holds "
                              f"{root / SERVE_LOCK}); its next snapshot would replace what is saved here. Write "
                              "through the server's HTTP API (POST /tools, DELETE /tools/ID), or stop the server "
                              "first") from None
    finally:
        os.close(fd)


def check_live_version(root: Path, expected: str | None) -> None:
    """Refuse to write into `root` when its live version is no longer `expected`, the one the writer read or
    last wrote (None: the writer read none of it, and replaces it knowingly)."""
    live = None if expected is None else live_version_name(root)
    if live is not None and live != expected:
        raise SaveRefused(f"{root}: its live version is {live}, but this was loaded from (or last saved as) "
                          f"{expected}: another writer saved the directory since, and saving now would discard "
                          "what it wrote. Load the directory again and redo the changes, or save with "
                          "overwrite=True to replace it anyway")


@contextmanager
def write_artifact(root: str | os.PathLike, config: Mapping[str, Any], *, expected_version: str | None = None,
                   held_lock: int | None = None) -> Iterator[Path]:
    """Yield a fresh folder to write an artefact's files into; on success make it the live version.

    `config` must name `kind` and `format_version`; it is written as `config.json`. If the body
    raises, the new folder is removed and the previous version stays live. Refused before and again at the
    commit (`SaveRefused`): while another process serves `root` (`check_not_served`; `held_lock`: the
    caller's own hold of it), and when `expected_version` is given and no longer live (`check_live_version`).
    """
    if "kind" not in config or "format_version" not in config:
        raise ValueError("artefact config needs 'kind' and 'format_version'")
    root = Path(root)
    check_replaceable(root, config)
    check_not_served(root, held_lock)
    check_live_version(root, expected_version)
    root.mkdir(parents=True, exist_ok=True)
    staging, claim = _claim_version(root)
    try:
        yield staging
        write_json(staging / CONFIG, dict(config))
        _fsync_tree(staging)
        with _write_lock(root):  # no other writer between the checks and the commit
            check_not_served(root, held_lock)  # again, as late as can be: the write took a while
            check_live_version(root, expected_version)
            tmp_pointer = root / f".{POINTER}.{os.getpid()}.tmp"
            tmp_pointer.write_text(staging.name + "\n", encoding="utf-8")
            with open(tmp_pointer, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp_pointer, root / POINTER)  # the commit point
            _fsync_dir(root)
            # The replaced versions go only after the pointer moved, so a reader always finds a whole one;
            # a version another writer still holds (`_claim_version`) stays.
            _remove_stale_versions(root, live=staging.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        _release_claim(root, staging.name, claim)


def _claim_version(root: Path) -> tuple[Path, int]:
    """A new version folder for one writer, and its claim: the locked file `.vNNNNNN.writing`, held until the
    writer commits or gives up, so that no other writer takes the same number and no other commit sweeps the
    folder away while it is being written. Claimed under CLAIM_LOCK, as the sweep decides, not the write lock: a
    writer starts while another is checked and committed."""
    with file_lock(root / CLAIM_LOCK):
        names = [p.name for p in root.glob("v[0-9]*")]
        names += [p.name[1:-len(_CLAIM)] for p in root.glob(f".v[0-9]*{_CLAIM}")]
        taken = [n for n in map(_version_number, names) if n is not None]
        staging = root / f"v{1 + max(taken, default=0):06d}"
        claim = os.open(root / f".{staging.name}{_CLAIM}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(claim, fcntl.LOCK_EX)
            staging.mkdir()
        except BaseException:
            _release_claim(root, staging.name, claim)
            raise
        return staging, claim


def _version_number(name: str) -> int | None:
    """The number of a version folder's name (`v000003`: 3), or None for any other name."""
    return int(name[1:]) if name.startswith("v") and name[1:].isdigit() else None


def _release_claim(root: Path, name: str, claim: int) -> None:
    (root / f".{name}{_CLAIM}").unlink(missing_ok=True)
    os.close(claim)  # releases the lock


def _claimed(root: Path, name: str) -> bool:
    """Whether a live writer holds version `name` (a claim left by one that died is not held)."""
    try:
        fd = os.open(root / f".{name}{_CLAIM}", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _write_lock(root: Path) -> Iterator[None]:
    """Hold `root`'s WRITE_LOCK: one writer at a time checks the live version and commits over it (a check
    without it lets two processes that loaded the same version both pass it)."""
    return file_lock(root / WRITE_LOCK)


@contextmanager
def file_lock(path: Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (made if missing) for the block (across processes).
    `waiting` is called once before waiting, when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove_stale_versions(root: Path, live: str) -> None:
    """Remove every version but `live` (the one just made live) and those other writers hold, with the claims
    and pointer files that writers which died left behind (the caller holds the write lock)."""
    with file_lock(root / CLAIM_LOCK):  # no claim made while deciding; none is made later for these numbers
        stale = [entry for entry in root.iterdir() if _version_number(entry.name) is not None
                 and entry.name != live and not _claimed(root, entry.name)]
        stale_claims = [entry for entry in root.glob(f".v*{_CLAIM}")
                        if not (root / entry.name[1:-len(_CLAIM)]).exists()]  # its writer died before the folder
    for entry in stale:
        shutil.rmtree(entry, ignore_errors=True)
        (root / f".{entry.name}{_CLAIM}").unlink(missing_ok=True)
    for entry in stale_claims + list(root.glob(f".{POINTER}.*.tmp")):
        entry.unlink(missing_ok=True)
