"""One training loop for every trainable model: seeds, progress, checkpoints and resume, early stopping
on validation nDCG@10, and a run summary saved with the model.

A method supplies a torch module, a function turning a batch into a loss, a function yielding the
batches of an epoch (deterministic for a given epoch number, so a resumed run skips exactly the batches
it already did), and optionally a validation function returning nDCG@10 in points. A module with a
`param_groups(lr)` method gets those optimiser groups (e.g. a higher rate for a freshly initialised head).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..artifacts import read_json, write_json
from ..encoders import default_device
from ..encoders.resolve import usable_device
from ..errors import ToolScoutError
from ..eval.metrics import ndcg_at_k
from ..results import Results


@dataclass
class TrainConfig:
    """Settings shared by every trainer. Defaults are sized for a 2-core CPU."""

    epochs: int = 1
    batch_size: int = 32
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_steps: int | None = None  # stop after this many optimiser steps (all epochs together)
    eval_every: int | None = None  # validate every N steps; default: at the end of each epoch
    patience: int = 3  # stop after this many validations without improvement
    checkpoint_every: int = 200  # steps between resumable checkpoints
    grad_clip: float = 1.0
    seed: int = 0
    device: str | None = None  # None: cuda when available, else cpu
    progress: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    def shaping(self) -> dict:
        """The settings that shape what training computes (not where or how visibly it runs)."""
        return {key: getattr(self, key) for key in SHAPING_SETTINGS}


# TrainConfig fields a resumed run must share with its checkpoint; the rest (device, progress, how often it
# validates or checkpoints, patience) may change between an interrupted run and the one resuming it
SHAPING_SETTINGS = ("epochs", "batch_size", "lr", "weight_decay", "warmup_ratio", "max_steps", "grad_clip", "seed")


# a stage of a run that a method runs into a folder of its own beside OUT, OUT.STAGE: mlc's linear probe,
# tool2vec's fine-tuned encoder
STAGES = ("probe", "finetune")


def stage_dir(out: str | Path, stage: str) -> Path:
    """The folder beside `out` that `stage` (one of `STAGES`) of a run into `out` writes."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    out = Path(out)
    return out.with_name(f"{out.name}.{stage}")


def checkpoint_dir(out: str | Path) -> Path:
    """Where a Trainer writing `out` keeps the resumable state of its run while it trains."""
    out = Path(out)
    return out.with_name(out.name + ".checkpoint")


def left_to_resume(out: str | Path) -> list[str]:
    """What a rerun of an interrupted run into `out` picks up, each in words: the checkpoints it left (its own or
    a stage's, with the step each holds) and the stages it finished (a stage folder holding a model)."""
    from ..models import model_config

    found = []
    for folder in [Path(out), *(stage_dir(out, stage) for stage in STAGES)]:
        state = checkpoint_dir(folder) / "state.json"
        try:  # asked after a Ctrl-C: a damaged file is said, not raised over the interruption
            if state.exists():
                found.append(f"{state.parent} (at step {read_json(state).get('step')})")
            elif folder != Path(out) and model_config(folder) is not None:
                found.append(f"{folder} (finished)")
        except ToolScoutError as exc:
            found.append(f"{folder} (unreadable: {exc})")
    return found


class CheckpointMismatch(ToolScoutError, ValueError):
    """The checkpoint of an interrupted run was made with other settings than the run that would resume it."""


def run_settings(data, model: str | None, **options: Any) -> dict:
    """What a trainer's run is made with besides its TrainConfig, as its checkpoint records it: the data,
    the base model and the method's options (`Trainer(made_with=...)`)."""
    return {"data": data.identity(), "model": model, "options": options}


def _plain(value: Any) -> Any:
    """`value` as JSON reads it back (tuples as lists, views and other objects as their text)."""
    return json.loads(json.dumps(value, sort_keys=True, default=lambda o: asdict(o) if is_dataclass(o) else str(o)))


def _flag(key: str) -> str:
    """The command-line spelling of a recorded setting: config.batch_size → --batch-size, options.loss → -o loss."""
    group, _, name = key.partition(".")
    if group == "options":
        return f"-o {name}"
    return "--" + (name or group).replace("_", "-")


def _flatten(settings: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group, value in settings.items():
        if group in ("config", "options") and isinstance(value, dict):
            out.update({f"{group}.{name}": item for name, item in value.items()})
        else:
            out[group] = value
    return out


def _shown(key: str, value: Any) -> str:
    if key == "data" and isinstance(value, dict):
        return ",".join(value.get("sets", [])) or "none"
    return "unset" if value is None else str(value)


def settings_differences(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """'--lr 2e-05 then, 0.001 now' for each setting that differs between a checkpoint and this run."""
    before, after = _flatten(recorded), _flatten(now)
    out = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) == after.get(key):
            continue
        then, current = _shown(key, before.get(key)), _shown(key, after.get(key))
        if then == current:  # the same sets, with other contents (edited, another validation fraction)
            then, current = f"{then} (other contents)", f"{current} (as now)"
        out.append(f"{_flag(key)} {then} then, {current} now")
    return out


@dataclass
class RunSummary:
    method: str
    steps: int = 0
    epochs_done: float = 0.0
    examples: int = 0
    time_s: float = 0.0
    best_validation: float | None = None
    best_step: int | None = None
    stopped_early: bool = False
    resumed_from_step: int | None = None
    # set when the model keeps other weights than the training's best, saying which and why (the CLI's
    # last line says it): an mlc probe, embed's (or tool2vec's fine-tune's) starting model, when training did
    # not beat them on validation
    discarded_for: str | None = None
    history: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    @property
    def examples_per_s(self) -> float:
        return self.examples / self.time_s if self.time_s else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["examples_per_s"] = round(self.examples_per_s, 2)
        out["validation_metric"] = "ndcg@10"
        return out


def set_seed(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(device: str | None) -> str:
    """`device` when it is usable here (else a ValueError saying so), or the default one (a GPU when torch
    sees one)."""
    return usable_device(device, "TrainConfig.device") if device else default_device()


def validation_ndcg(search: Callable[[list[str], int], Results], queries: Sequence, k: int = 10,
                    batch_size: int = 256) -> float:
    """Mean nDCG@k (points) of `search` over labelled queries (objects with .text and .labels)."""
    if not queries:
        return float("nan")
    total = 0.0
    for start in range(0, len(queries), batch_size):
        batch = queries[start:start + batch_size]
        results = search([q.text for q in batch], k)
        total += sum(ndcg_at_k(list(ids), set(q.labels), k) for q, (ids, _s) in zip(batch, results))
    return 100.0 * total / len(queries)


class Trainer:
    """Runs the optimisation. `out_dir/checkpoint/` holds the resumable state while training runs."""

    def __init__(self, method: str, model, loss_fn: Callable[[Any], Any],
                 epoch_batches: Callable[[int], Sequence[Any]], config: TrainConfig, out_dir: str | Path,
                 validate: Callable[[], float] | None = None, batch_size_of: Callable[[Any], int] = len,
                 made_with: Mapping[str, Any] | None = None):
        """`made_with`: what the run is made with besides `config` (`run_settings`): its checkpoint records it,
        and a run with other settings does not resume from it."""
        self.method = method
        self.model = model
        self.loss_fn = loss_fn
        self.epoch_batches = epoch_batches
        self.config = config
        self.out_dir = Path(out_dir)
        self.validate = validate
        self.batch_size_of = batch_size_of
        self.checkpoint_dir = checkpoint_dir(self.out_dir)
        self.made_with = _plain({"config": config.shaping(), **(made_with or {})})

    # -------------------------------------------------------------------------------------
    def fit(self, resume: bool = True) -> RunSummary:
        import torch

        cfg = self.config
        set_seed(cfg.seed)
        params = [p for p in self.model.parameters() if p.requires_grad]
        # a model may give parts their own learning rate (a fresh head next to a pretrained encoder)
        groups = self.model.param_groups(cfg.lr) if hasattr(self.model, "param_groups") else [{"params": params}]
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        steps_per_epoch = max(1, len(self.epoch_batches(0)))
        total_steps = steps_per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            total_steps = min(total_steps, cfg.max_steps)
        schedule = warmup_then_decay(total_steps, int(total_steps * cfg.warmup_ratio))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        run = self._start_run(resume, optimizer, scheduler)
        if run.summary.resumed_from_step is not None:  # said even without progress: the run is not a fresh one
            print(f"resuming the interrupted {self.method} run at step {run.summary.resumed_from_step} of "
                  f"{total_steps} from {self.checkpoint_dir} (--no-resume starts afresh)", file=sys.stderr)
        progress = _progress(total_steps, run.state["step"], self.method, cfg.progress)
        try:
            with _ctrl_c_ends_the_step(run):
                self._train(run, _Steps(params, optimizer, scheduler, steps_per_epoch, total_steps), progress)
        finally:
            progress.close()
        if run.best_state is not None:  # keep the weights that validated best, not the last ones
            self.model.load_state_dict(run.best_state)
        return run.summarise(steps_per_epoch)

    def _start_run(self, resume: bool, optimizer, scheduler) -> "_Run":
        """A fresh run, or the one the checkpoint folder holds (model, optimiser and RNG states restored)."""
        summary = RunSummary(self.method, config=self.config.to_dict())
        state = {"step": 0, "best": -math.inf, "bad_evals": 0, "examples": 0, "elapsed": 0.0}
        best_state = None
        if self.will_resume(resume):
            state, best_state = self._load_checkpoint(optimizer, scheduler)
            summary.resumed_from_step = state["step"]
            summary.history = state.get("history", [])
        return _Run(summary, state, best_state, time.perf_counter() - state["elapsed"])

    def _train(self, run: "_Run", steps: "_Steps", progress) -> None:
        """Optimiser steps until the last one or early stopping, validating and checkpointing on the way."""
        cfg, state = self.config, run.state
        eval_every = cfg.eval_every or steps.per_epoch
        while state["step"] < steps.total and not run.stop:
            epoch = state["step"] // steps.per_epoch
            batches = self.epoch_batches(epoch)
            for batch in batches[state["step"] - epoch * steps.per_epoch:]:  # a resumed epoch skips what it did
                loss = self._step(batch, steps)
                state["step"] += 1
                state["examples"] += self.batch_size_of(batch)
                self._report(run, loss, progress)
                if self.validate and (state["step"] % eval_every == 0 or state["step"] == steps.total):
                    self._validate(run, progress)
                if (state["step"] % cfg.checkpoint_every == 0 and not run.stop) or run.interrupted:
                    state["elapsed"] = time.perf_counter() - run.start_time
                    state["history"] = run.summary.history
                    self._save_checkpoint(state, steps.optimizer, steps.scheduler, run.best_state)
                if run.interrupted:
                    progress.write(f"interrupted after step {state['step']}: its checkpoint is in "
                                   f"{self.checkpoint_dir}; a run that resumes (the default, not --no-resume) "
                                   "picks it up")
                    raise KeyboardInterrupt
                if run.stop or state["step"] >= steps.total:
                    break

    def _step(self, batch, steps: "_Steps"):
        import torch

        self.model.train()
        loss = self.loss_fn(batch)
        steps.optimizer.zero_grad()
        loss.backward()
        if self.config.grad_clip:
            torch.nn.utils.clip_grad_norm_(steps.params, self.config.grad_clip)
        steps.optimizer.step()
        steps.scheduler.step()
        return loss

    def _report(self, run: "_Run", loss, progress) -> None:
        step, examples = run.state["step"], run.state["examples"]
        elapsed = time.perf_counter() - run.start_time
        progress.update(1)
        progress.set_postfix(loss=f"{loss.item():.4f}", ex_s=f"{examples / max(elapsed, 1e-9):.1f}")
        if step % 10 == 0 or step == 1:
            run.summary.history.append({"step": step, "loss": round(loss.item(), 5)})

    def _validate(self, run: "_Run", progress) -> None:
        """Score the model; keep its weights when they are the best so far, else count towards patience."""
        state = run.state
        score = self.validate()
        run.summary.history.append({"step": state["step"], "validation_ndcg@10": round(score, 3)})
        progress.write(f"step {state['step']}: validation nDCG@10 = {score:.2f}")
        if score > state["best"]:
            state["best"], state["bad_evals"], state["best_step"] = score, 0, state["step"]
            run.best_state = _copy_state(self.model)
        else:
            state["bad_evals"] += 1
            if state["bad_evals"] >= self.config.patience:
                run.stop = run.summary.stopped_early = True

    def finish(self) -> None:
        """Remove the resumable state once the model itself has been saved."""
        import shutil

        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)

    # checkpoints -------------------------------------------------------------------------
    def _save_checkpoint(self, state, optimizer, scheduler, best_state) -> None:
        import torch

        tmp = self.checkpoint_dir.with_name(self.checkpoint_dir.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "best": best_state,
                    "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                            "torch": torch.get_rng_state()}}, tmp / "checkpoint.pt")
        write_json(tmp / "state.json", {**state, "made_with": self.made_with})
        old = self.checkpoint_dir.with_name(self.checkpoint_dir.name + ".old")
        if self.checkpoint_dir.exists():
            os.replace(self.checkpoint_dir, old)
        os.replace(tmp, self.checkpoint_dir)
        if old.exists():
            import shutil

            shutil.rmtree(old, ignore_errors=True)

    def will_resume(self, resume: bool) -> bool:
        """Whether `fit(resume)` continues the checkpoint of an interrupted run. It does only for a run made
        with the settings the checkpoint records (one from before they were recorded resumes as it always
        did); another --lr, --data... is refused, saying how to start afresh."""
        if not (resume and (self.checkpoint_dir / "state.json").exists()):
            return False
        recorded = read_json(self.checkpoint_dir / "state.json").get("made_with")
        if recorded is None or recorded == self.made_with:
            return True
        differences = settings_differences(recorded, self.made_with)
        raise CheckpointMismatch(
            f"{self.checkpoint_dir}: the checkpoint of an interrupted {self.method} run was made with other "
            f"settings ({'; '.join(differences)}); resume it with the same ones, or start afresh with --no-resume "
            f"(resume=False in Python) or by removing {self.checkpoint_dir}")

    def _load_checkpoint(self, optimizer, scheduler):
        import torch

        blob = torch.load(self.checkpoint_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
        self.model.load_state_dict(blob["model"])
        optimizer.load_state_dict(blob["optimizer"])
        scheduler.load_state_dict(blob["scheduler"])
        random.setstate(blob["rng"]["python"])
        np.random.set_state(blob["rng"]["numpy"])
        torch.set_rng_state(blob["rng"]["torch"])
        state = read_json(self.checkpoint_dir / "state.json")
        return state, blob["best"]


def warmup_then_decay(total_steps: int, warmup: int) -> Callable[[int], float]:
    """The learning-rate factor per step: linear warm-up over `warmup` steps, then linear decay to zero."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor


@dataclass
class _Steps:
    """What every optimiser step of a run uses."""

    params: list
    optimizer: Any
    scheduler: Any
    per_epoch: int
    total: int


@contextlib.contextmanager
def _ctrl_c_ends_the_step(run: "_Run"):
    """While training runs, a first Ctrl-C (SIGINT) ends it after the step in progress, which is checkpointed
    (an interrupted optimiser step would leave half-updated weights); a second one stops at once. Signals
    reach the main thread only: training elsewhere (a service's retraining) keeps the default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler installed outside Python: put Python's own back
        previous = signal.default_int_handler

    def asked(_signum, _frame):
        run.interrupted = True
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, asked)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class _Run:
    """A run in progress: the summary it fills, the resumable `state` (step, examples, best score...),
    the best weights so far, and when it (virtually, counting resumed time) started."""

    summary: RunSummary
    state: dict
    best_state: dict | None
    start_time: float
    stop: bool = False
    interrupted: bool = False  # Ctrl-C came: end after the step in progress, checkpointed

    def summarise(self, steps_per_epoch: int) -> RunSummary:
        summary, state = self.summary, self.state
        summary.steps = state["step"]
        summary.examples = state["examples"]
        summary.epochs_done = round(state["step"] / steps_per_epoch, 3)
        summary.time_s = round(time.perf_counter() - self.start_time, 2)
        if state["best"] > -math.inf:
            summary.best_validation, summary.best_step = round(state["best"], 3), state.get("best_step")
        return summary


def _copy_state(model) -> dict:
    return {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}


class _NoProgress:
    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def write(self, text):
        pass

    def close(self):
        pass


def _progress(total: int, done: int, label: str, enabled: bool):
    if not enabled:
        return _NoProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=f"train {label}", unit="step", dynamic_ncols=True)


def batched(items: Sequence, size: int, seed: int, epoch: int, shuffle: bool = True) -> list[list]:
    """Deterministic batches for an epoch: the same (seed, epoch) always gives the same batches."""
    order = list(range(len(items)))
    if shuffle:
        random.Random(seed * 100003 + epoch).shuffle(order)
    return [[items[i] for i in order[s:s + size]] for s in range(0, len(order), size)]
