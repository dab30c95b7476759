"""The on-disk cache of ONNX exports: where an export lives, what its folder name is keyed by, and how
an export is written into it (beside the target, checked, then renamed: a crash leaves no half export).

A folder is keyed by the model folder's path and its files' names, sizes and mtimes (plus the variant,
the export format and the onnxruntime version), so a re-trained model saved over the old one gets a
fresh export. A model that is not a local folder is keyed by a digest of its weights.

An export of a local folder records which folder and which state of it it was made from (`SOURCE_FILE`);
each new export removes the exports whose folder is gone or has been saved over since, which nothing can
load again (every retraining of a deployment's model would otherwise leave its export behind for good).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..artifacts import file_lock
from ..errors import MissingDependency
from .onnx_export import (
    FUSED_GRAPHS,
    MIN_PROBE_COSINE,
    ONNX_EXPORT_FORMAT,
    OnnxUnavailable,
    check_onnx_export,
    export_onnx,
)
from .onnx_runtime import OnnxEncoder, split_layer_norms
from .quality import QUALITY_FILE
from .torch_utils import state_digest

logger = logging.getLogger(__name__)


SOURCE_FILE = "source.json"


def default_onnx_cache() -> Path:
    return Path.home() / ".cache" / "toolscout" / "onnx"


def folder_fingerprint(folder: Path) -> str:
    """The folder's path plus each file's relative name, size and mtime (changes when weights are re-saved). The
    int8 quality record is left out: recording a check changes nothing an export is made from (a packaged
    model records it in its manifest, which its assembled folder's name leaves out: `packaged.assemble`)."""
    parts = [str(folder)]
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and relative.as_posix() != QUALITY_FILE and not any(p.startswith(".") for p in relative.parts):
            stat = path.stat()
            parts.append(f"{relative.as_posix()}\t{stat.st_size}\t{stat.st_mtime_ns}")
    return "\n".join(parts)


def weights_digest(st_model) -> str:
    return state_digest(st_model.state_dict())


def cache_key(key_source: str, variant: str) -> str:
    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "none"
    text = f"format={ONNX_EXPORT_FORMAT}\nvariant={variant}\nonnxruntime={ort_version}\n{key_source}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).name or name)[:60] or "model"


def export_folder(cache: Path, name: str, variant: str, key_source: str) -> Path:
    """Where the `variant` export of model `name` (identified by `key_source`) lives in `cache`."""
    return cache / f"{slug(name)}-{variant}-{cache_key(key_source, variant)}"


def failed_marker(target: Path) -> Path:
    """The file that records why exporting into `target` failed (so it is not retried on every load)."""
    return target.with_name(target.name + ".failed")


@contextlib.contextmanager
def export_lock(cache: Path, target: Path) -> Iterator[None]:
    """One process at a time exports or rewrites the cache folder `target` (replicas and test workers start
    together, and each would export the same model). A cache where no lock can be taken (read-only, or no
    flock) goes on without one: an export's final rename already settles a race, only the work is doubled."""
    with contextlib.ExitStack() as held:
        try:
            (cache / ".locks").mkdir(parents=True, exist_ok=True)
            held.enter_context(file_lock(cache / ".locks" / f"{target.name}.lock", waiting=lambda: logger.warning(
                "export cache %s: another process is exporting %s; waiting for it", cache, target.name)))
        except OSError as exc:
            logger.info("export cache %s: no lock for %s (%s); going on without one", cache, target.name, exc)
        yield


def export_into_cache(st_model, target: Path, variant: str, native_max_seq_length: int | None,
                      max_seq_length: int | None, label: str, source: Path | None = None) -> None:
    """Export `st_model` into `target`, checked against the torch model at `max_seq_length` (the length the
    torch model truncates at too); `native_max_seq_length` is recorded as the export's default. A fused
    graph that fails its check is replaced by the plain one. `source`: the local model folder it is made
    from (recorded; see `prune_stale_exports`). Raises OnnxUnavailable (also recorded in the failed marker)
    or MissingDependency."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        logger.info("encoder %s: exporting to ONNX (%s), once, into %s", label, variant, target)
        _export_checked(st_model, tmp, variant, native_max_seq_length, max_seq_length, label)
        split_layer_norms(tmp)  # stored as onnxruntime runs it: a server loads it without the `onnx` package
        if source is not None:
            (tmp / SOURCE_FILE).write_text(json.dumps({"folder": str(source), "state": folder_state(source)}))
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished the same export first: use theirs
            if not (target / "meta.json").exists():
                raise
        prune_stale_exports(target.parent)
    except OnnxUnavailable as exc:
        failed_marker(target).write_text(str(exc) + "\n")
        raise
    except MissingDependency:
        raise
    except Exception as exc:  # exporters fail in many ways; the torch backend still works
        reason = f"ONNX export failed: {type(exc).__name__}: {exc}"
        failed_marker(target).write_text(reason + "\n")
        raise OnnxUnavailable(reason) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def folder_state(folder: Path) -> str:
    """A digest of `folder_fingerprint`: changes when the folder's files are saved over."""
    return hashlib.sha256(folder_fingerprint(folder).encode("utf-8")).hexdigest()


def prune_stale_exports(cache: Path) -> list[Path]:
    """Remove the exports in `cache` made from a local folder that is gone or saved over since (their key
    can never be asked for again); exports that recorded no folder, and exports being written, stay."""
    removed = []
    for export in sorted(cache.iterdir()):
        record = export / SOURCE_FILE
        if export.name.startswith(".") or not record.is_file():
            continue
        try:
            made_from = json.loads(record.read_text(encoding="utf-8"))
            folder = Path(made_from["folder"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: not ours to judge
        if folder.is_dir() and folder_state(folder) == made_from.get("state"):
            continue
        logger.info("ONNX cache: removing %s (its model folder %s is gone or was saved over)", export, folder)
        shutil.rmtree(export, ignore_errors=True)
        removed.append(export)
    return removed


def _export_checked(st_model, folder: Path, variant: str, native_max_seq_length: int | None,
                    max_seq_length: int | None, label: str) -> None:
    spec = export_onnx(st_model, folder, variant, max_seq_length=native_max_seq_length)
    try:
        check_onnx_export(st_model, OnnxEncoder(folder, max_seq_length), MIN_PROBE_COSINE[variant])
    except OnnxUnavailable as exc:
        if spec["graph"] not in FUSED_GRAPHS:
            raise
        logger.info("encoder %s: fused ONNX graph failed its check (%s); trying the plain graph", label, exc)
        export_onnx(st_model, folder, variant, fuse=False, max_seq_length=native_max_seq_length)
        check_onnx_export(st_model, OnnxEncoder(folder, max_seq_length), MIN_PROBE_COSINE[variant])
