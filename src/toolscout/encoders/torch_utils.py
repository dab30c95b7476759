"""Small torch / transformers helpers shared by every model that runs a transformer."""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager

from ..errors import require


@contextmanager
def quiet_transformers():
    """Silence transformers' load report ("newly initialized: classifier...") and its progress bars
    ("Loading weights", "Writing model shards"): loading or saving a known model is not news, and a
    fresh head is the point when training starts. Every model loaded through transformers passes here, so a
    missing install fails here, naming its command."""
    require("transformers", "torch", feature="a model that runs on transformers and torch", extra="train")
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


_TORCH_THREADS_LOCK = threading.Lock()  # torch's thread count is process-wide: one changer at a time
SMALL_TORCH_BATCH = 4  # rows up to which a torch forward runs on one thread


@contextmanager
def few_torch_threads(rows: int, device: str = "cpu", limit: int = SMALL_TORCH_BATCH):
    """Run a torch forward over `rows` ≤ `limit` inputs on one thread, then restore the thread count.

    Why: for one short sequence the work per matrix product is tiny, and splitting it over two threads
    costs more in handoffs than it saves; on cores that are also busy with other work (a server's
    batcher, an indexing job) the second thread waits for a core, and the forward takes 5-10× longer
    (measured: ToolCLIP's task tower, one query, 2 busy cores: 29 ms on one thread, 265 ms on two).
    Larger batches, and forwards on a GPU, keep every thread."""
    if rows > limit or device != "cpu":
        yield
        return
    import torch

    with _TORCH_THREADS_LOCK:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def weights_version(model) -> int:
    """Sum of the parameters' in-place modification counters: changes when training updates weights."""
    return sum(int(p._version) for p in model.parameters())


def state_digest(state) -> str:
    """SHA-256 (hex) of a state dict's names and tensor bytes, in name order: equal weights, equal digest."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def st_dimension(st_model) -> int:
    """The sentence embedding size of a SentenceTransformer (the getter was renamed in v5)."""
    getter = getattr(st_model, "get_embedding_dimension", None) or st_model.get_sentence_embedding_dimension
    return int(getter())
