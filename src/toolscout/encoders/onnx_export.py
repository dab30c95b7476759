"""The ONNX export: a SentenceTransformer's transformer + pooling + L2 normalisation as one ONNX graph
(fp32, optionally fused by onnxruntime's transformer optimizer, or int8-quantised), and the check that
an export gives the torch model's embeddings."""

from __future__ import annotations

import copy
import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MissingDependency
from .onnx_runtime import OnnxEncoder
from .torch_utils import st_dimension

logger = logging.getLogger(__name__)

ONNX_EXPORT_FORMAT = 3  # bump when the exported graph or meta.json changes meaning (2: int8 quantises the fused
# graph; 3: a second output, "tokens", the token vectors late chunking pools)
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens")
MIN_PROBE_COSINE = {"onnx": 0.9999, "onnx-int8": 0.95}  # int8 is checked for sanity only
FUSED_GRAPHS = ("fused", "int8-fused")  # graphs with a plain fallback when they fail their check


class OnnxUnavailable(Exception):
    """Why the ONNX backend cannot be used for a model (the message is logged on fallback)."""


# Probe texts for the export check: mixed case, accents, non-Latin scripts, code, an empty string and a
# text far longer than any max_seq_length (so truncation is checked too).
PROBE_TEXTS = (
    "book a flight to Paris next Tuesday",
    "What's the WEATHER like in Zürich? Café, naïve, résumé.",
    "get_weather_forecast(cityName: str, days: int = 3) -> dict",
    "",
    "   ",
    "天气预报 北京 明天",
    "Send an email to bob@example.com with subject 'Q3 numbers' and attach report.pdf",
    "convert 250 USD to EUR",
    "🙂 emoji and symbols: <>&%$#@!",
    "List the calendar events between 2024-01-01 and 2024-02-01 for the team.",
    " ".join(["Search the product catalog for running shoes in size 42 and sort by price."] * 60),
    "a",
)


def pooling_spec(st_model) -> dict[str, Any]:
    """What the ONNX graph must reproduce of a SentenceTransformer pipeline; raises OnnxUnavailable."""
    modules = list(st_model)
    kinds = [type(m).__name__ for m in modules]
    if not kinds or kinds[0] != "Transformer":
        raise OnnxUnavailable(f"pipeline {kinds} does not start with a Transformer module")
    if len(kinds) < 2 or kinds[1] != "Pooling" or any(k != "Normalize" for k in kinds[2:]):
        raise OnnxUnavailable(f"pipeline {kinds}: only Transformer + Pooling (+ Normalize) can be exported")
    pooling = modules[1]
    modes = getattr(pooling, "pooling_mode", None)
    if modes is None and hasattr(pooling, "get_pooling_mode_str"):  # sentence-transformers < 6
        modes = pooling.get_pooling_mode_str().split("+")
    modes = [modes] if isinstance(modes, str) else list(modes or [])
    unsupported = [m for m in modes if m not in POOLING_MODES]
    if not modes or unsupported:
        raise OnnxUnavailable(f"pooling mode {modes} is not supported by the ONNX export (supported: {POOLING_MODES})")
    prompt_name = getattr(st_model, "default_prompt_name", None)
    if prompt_name and (getattr(st_model, "prompts", None) or {}).get(prompt_name):
        raise OnnxUnavailable(f"the model applies a default prompt ({prompt_name!r}); not exported")
    tokenizer = getattr(st_model, "tokenizer", None)
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise OnnxUnavailable("the model has no fast (Rust) tokenizer to export")
    inputs = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]
    if "input_ids" not in inputs or "attention_mask" not in inputs:
        raise OnnxUnavailable(f"tokenizer inputs {tokenizer.model_input_names} lack input_ids/attention_mask")
    config = modules[0].auto_model.config
    return {
        "pooling": modes,
        "inputs": inputs,
        "dim": st_dimension(st_model),
        "max_seq_length": int(st_model.max_seq_length or tokenizer.model_max_length),
        "max_positions": int(getattr(config, "max_position_embeddings", 0) or 0) or None,
        "model_type": getattr(config, "model_type", None),
        "num_heads": getattr(config, "num_attention_heads", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "pad_id": int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
        "pad_type_id": int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
    }


def export_onnx(st_model, folder: Path, variant: str = "onnx", fuse: bool = True,
                max_seq_length: int | None = None) -> dict[str, Any]:
    """Write `model.onnx`, `tokenizer.json` and `meta.json` for `st_model` into `folder`.

    'onnx': fp32, fused by onnxruntime's transformer optimizer when it knows the architecture
    (otherwise the plain export); 'onnx-int8': dynamic int8 quantisation of the same graph (the fused one
    where fusion applies: its attention runs as one int8 kernel, ~20% less CPU per query than the
    quantised plain graph on a 2-core EPYC, for the same vectors to 1e-3).
    `max_seq_length` is recorded as the export's default truncation (default: the model's current one).
    The result is not checked here: see `check_onnx_export`.
    """
    try:
        import onnx  # noqa: F401
        import torch
    except ImportError:
        raise MissingDependency("onnx", "the ONNX encoder backend", extra="fast") from None
    spec = pooling_spec(st_model)
    if max_seq_length:
        spec["max_seq_length"] = int(max_seq_length)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    transformer = copy.deepcopy(st_model[0].auto_model).to("cpu").eval()
    # eager attention traces a plain masked softmax; the sdpa path can drop an all-ones mask at trace time
    if hasattr(transformer, "set_attn_implementation"):
        try:
            transformer.set_attn_implementation("eager")
        except Exception:  # older transformers: the config attribute is what counts
            transformer.config._attn_implementation = "eager"
    from .onnx_graph import EmbeddingGraph

    graph = EmbeddingGraph(transformer, spec["inputs"], spec["pooling"]).eval()
    # a padded batch of two different lengths, so nothing about the mask is constant while tracing
    dummy = st_model.tokenizer(["a short probe", "a somewhat longer probe sentence for tracing the export"],
                               padding=True, return_tensors="pt")
    args = tuple(dummy[name].to(torch.int64) for name in spec["inputs"])
    plain = folder / "plain.onnx"
    _torch_export(graph, args, spec["inputs"], plain)
    model_file = folder / "model.onnx"
    spec["variant"] = variant
    spec["graph"] = "plain"
    if variant == "onnx-int8":
        fused = folder / "fused.onnx"
        is_fused = fuse and _fuse(plain, fused, spec)
        _quantize_int8(fused if is_fused else plain, model_file)
        spec["graph"] = "int8-fused" if is_fused else "int8"
        fused.unlink(missing_ok=True)
    elif fuse and _fuse(plain, model_file, spec):
        spec["graph"] = "fused"
    else:
        shutil.copyfile(plain, model_file)
    _write_tokenizer(st_model.tokenizer, folder / "tokenizer.json")
    spec["format"] = ONNX_EXPORT_FORMAT
    (folder / "meta.json").write_text(json.dumps(spec, indent=2))
    plain.unlink()
    return spec


def _torch_export(graph, args, input_names: list[str], path: Path) -> None:
    import torch

    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings: the export is checked afterwards
        try:  # the TorchScript exporter needs only `onnx`; it is deprecated but exact for these models
            torch.onnx.export(
                graph, args, str(path), dynamo=False, input_names=input_names, output_names=["embedding", "tokens"],
                dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in input_names}, "embedding": {0: "batch"},
                              "tokens": {0: "batch", 1: "sequence"}},
                opset_version=17, do_constant_folding=True,
            )
            return
        except TypeError:  # a torch without the `dynamo` switch or without the old exporter
            pass
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
        program = torch.onnx.export(graph, args, dynamo=True, input_names=input_names,
                                    output_names=["embedding", "tokens"],
                                    dynamic_shapes=tuple({0: batch, 1: seq} for _ in input_names))
        program.save(str(path))


def _fuse(src: Path, dst: Path, spec: dict) -> bool:
    """onnxruntime's transformer optimizer (fused attention, layer norm, GELU); False if not applicable."""
    if spec.get("model_type") not in ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra") \
            or not spec.get("num_heads") or not spec.get("hidden_size"):
        return False
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        optimized = optimize_model(str(src), model_type="bert", num_heads=int(spec["num_heads"]),
                                   hidden_size=int(spec["hidden_size"]), opt_level=0)
        optimized.save_model_to_file(str(dst))
        return True
    except Exception as exc:  # the optimizer is best-effort; the plain graph is still exact
        logger.info("onnxruntime transformer optimizer skipped: %s", exc)
        return False


def _quantize_int8(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    root.addFilter(_quantiser_advice)  # it advises "pre-processing" on the root logger; the export is checked
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.removeFilter(_quantiser_advice)


def _quantiser_advice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Please consider to run pre-processing before quantization")


def _write_tokenizer(hf_tokenizer, path: Path) -> None:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    backend.save(str(path))


def check_onnx_export(st_model, onnx_encoder: OnnxEncoder, min_cosine: float) -> None:
    """Raise OnnxUnavailable unless the export matches `st_model` on PROBE_TEXTS, one by one and batched."""
    texts = list(PROBE_TEXTS)
    reference = st_model.encode(texts, batch_size=len(texts), convert_to_numpy=True, normalize_embeddings=True,
                                show_progress_bar=False)
    batched = onnx_encoder.encode(texts, batch_size=len(texts))
    single = np.concatenate([onnx_encoder.encode([t]) for t in texts])
    for label, got in (("batched", batched), ("one by one", single)):
        if got.shape != reference.shape:
            raise OnnxUnavailable(f"export check: shape {got.shape} != torch {reference.shape}")
        cosine = np.sum(got * reference, axis=1)
        worst = int(np.argmin(cosine))
        if not cosine[worst] >= min_cosine:
            raise OnnxUnavailable(f"export check ({label}): cosine {cosine[worst]:.6f} < {min_cosine} "
                                  f"vs torch on probe text {texts[worst][:40]!r}")

