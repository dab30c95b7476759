"""`toolscout train METHOD --data SET_DIR... --out DIR`: the CPU trainers (`toolscout.train`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..artifacts import unfinished_first_save
from .options import number_in, parse_options


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a retriever or reranker on benchmark folders' train splits")
    p.add_argument("method", metavar="METHOD",  # toolscout.train.TRAINERS, spelled out: the parser stays light
                   help="what to train: tool2vec, mlc, toolclip, embed (retrievers), cross, refiner (rerankers)")
    p.add_argument("--data", nargs="+", required=True, metavar="SET_DIR", help="benchmark folders to train on")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--model", default=None,
                   help="base encoder name or path (default: the default encoder, toolscout-tools; toolclip's "
                        "towers start from all-MiniLM-L6-v2), or a model directory that an earlier `train` of the "
                        "same method (toolclip, embed, cross) wrote, to continue training it")
    p.add_argument("--epochs", type=number_in(int, 1), default=None)
    p.add_argument("--batch-size", type=number_in(int, 1), default=None)
    p.add_argument("--lr", type=number_in(float, 0), default=None)
    p.add_argument("--max-steps", type=number_in(int, 1), default=None, help="stop after N optimiser steps")
    p.add_argument("--eval-every", type=number_in(int, 1), default=None,
                   help="validate every N steps (default: each epoch)")
    p.add_argument("--patience", type=number_in(int, 1), default=None,
                   help="validations without improvement before stopping")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N or mps, checked before training starts (default: cuda when available; "
                        "tool2vec runs no torch model unless -o finetune=true, and refuses it otherwise)")
    p.add_argument("--validation-fraction", type=float, default=0.1,
                   help="share of train queries held out for validation (default %(default)s)")
    p.add_argument("--no-resume", action="store_true", help="ignore a checkpoint left by an interrupted run")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="method-specific option, VALUE parsed as JSON when it can be (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_train)


def _check_out(out: str, method: str) -> None:
    """An --out holding anything but a model of this method is refused before training: training there would
    replace it (the same method's model is continued or replaced, as --model and resume say)."""
    from ..models import model_config

    folder = Path(out)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ValueError(f"--out {out}: is a file; give a folder for the model")
    held = model_config(folder)
    if held is None and not unfinished_first_save(folder):  # a killed first save's leftovers are its to replace
        raise ValueError(f"--out {out}: holds something that is not a toolscout model (an index, a benchmark "
                         "folder?); give a new folder")
    if held is not None and held[1].get("method") != method:
        raise ValueError(f"--out {out}: holds a {held[1].get('method')!r} model; train {method} into another "
                         "folder, or remove that one first")


def _check_device(method: str, device: str | None, options: dict) -> None:
    """--device is refused before data and models load when torch cannot use it here, or when the method
    runs no torch model (tool2vec without its fine-tuning), rather than ignored."""
    from ..encoders.resolve import usable_device
    from ..train import TORCH_FREE

    if device is None:
        return
    if method in TORCH_FREE and not options.get("finetune"):
        raise ValueError(f"--device {device}: {method} runs no torch model (only its -o finetune=true does); "
                         "leave --device out")
    usable_device(device, "--device")


def _interrupted(out: str, no_resume: bool) -> str:
    """What a Ctrl-C left: the checkpoints (or finished stages) the same command resumes from, or nothing."""
    from ..train.loop import left_to_resume

    left = left_to_resume(out)
    if not left:
        return ("interrupted before any training step was checkpointed: nothing of this run was saved, and the "
                "next run starts afresh")
    if no_resume:
        return f"interrupted; without --no-resume the same command resumes from {', '.join(left)}; with it, afresh"
    return f"interrupted; the same command resumes from {', '.join(left)} (--no-resume starts afresh)"


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import check_options, trainer_for

    fit = trainer_for(args.method)
    _check_out(args.out, args.method)
    options = parse_options(args.option)
    check_options(args.method, fit, options)
    _check_device(args.method, args.device, options)
    try:
        summary = _load_and_fit(args, fit, options)
    except KeyboardInterrupt:
        print(f"toolscout train: {_interrupted(args.out, args.no_resume)}", file=sys.stderr)
        return 130
    best = "n/a" if summary.best_validation is None else f"{summary.best_validation:.2f}"
    kept = f" ({summary.discarded_for})" if summary.discarded_for else ""
    print(f"trained {args.method} in {summary.time_s:.1f}s ({summary.examples} examples, "
          f"{summary.examples_per_s:.1f}/s); best validation nDCG@10 {best}{kept} → {args.out}", file=sys.stderr)
    return 0


def _load_and_fit(args: argparse.Namespace, fit, options: dict):
    """The training data, then the run (its summary)."""
    from ..train import TrainConfig, load_training_data

    data = load_training_data(args.data, validation_fraction=args.validation_fraction)
    print(f"training {args.method} on {', '.join(data.sets)}: {len(data.train)} train and "
          f"{len(data.validation)} validation queries, {len(data.tools)} tools", file=sys.stderr)
    if not data.validation:
        print(f"no validation queries (none of the {len(data.train)} train queries fell in --validation-fraction "
              f"{args.validation_fraction:g}, and no set has a validation split): nothing is chosen on validation, so "
              "there is no early stopping, the last weights are saved (never an earlier step's or the starting "
              "model's), and what validation would pick falls back (tool2vec: its first prior; cross: no "
              "first-stage fusion)", file=sys.stderr)
    overrides = {key: getattr(args, key) for key in ("epochs", "batch_size", "lr", "max_steps", "eval_every",
                                                     "patience", "seed", "device")
                 if getattr(args, key) is not None}
    config = TrainConfig(progress=not args.quiet, **overrides)
    if args.no_resume:
        options["resume"] = False
    return fit(data, args.out, model=args.model, config=config, **options)
