import json
import math

import pytest
import torch

from toolscout.benchmark_sets import BenchmarkSet, Query
from toolscout.results import Results
from toolscout.tool import Tool
from toolscout.train.data import load_training_data
from toolscout.train.loop import TrainConfig, Trainer, batched
from toolscout.train.losses import hard_negative_loss, info_nce, multilabel_bce
from toolscout.train.negatives import hard_negatives


def test_info_nce_multi_positive_by_hand():
    q = torch.tensor([[1.0, 0.0]])
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    pos = torch.tensor([[True, False, True]])
    tau = 0.5
    s = [1.0 / tau, 0.0, 0.6 / tau]
    expected = -math.log((math.exp(s[0]) + math.exp(s[2])) / sum(math.exp(x) for x in s))
    assert info_nce(q, t, pos, tau).item() == pytest.approx(expected, rel=1e-5)
    # single-positive: target = first positive, the other positive is masked out of the denominator
    single = -math.log(math.exp(s[0]) / (math.exp(s[0]) + math.exp(s[1])))
    assert info_nce(q, t, pos, tau, multi_positive=False).item() == pytest.approx(single, rel=1e-5)


def test_hard_negative_loss_uses_only_the_hardest_negatives():
    q = torch.tensor([[1.0, 0.0]])
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6], [-1.0, 0.0]])
    pos = torch.tensor([[True, False, False, False]])
    tau = 1.0
    expected = -math.log(math.exp(1.0) / (math.exp(1.0) + math.exp(0.8)))  # top-1 negative: 0.8
    assert hard_negative_loss(q, t, pos, top_k=1, tau=tau).item() == pytest.approx(expected, rel=1e-5)


def test_multilabel_bce_matches_formula():
    logits, targets = torch.tensor([[0.0, 2.0]]), torch.tensor([[1, 0]])
    expected = (math.log(2) + math.log(1 + math.exp(2))) / 2
    assert multilabel_bce(logits, targets).item() == pytest.approx(expected, rel=1e-5)


def test_hard_negatives_never_contain_gold():
    queries = [Query("q1", "x", ("a", "c")), Query("q2", "y", ("b",))]
    results = Results.from_lists([["a", "b", "c", "d", "e"], ["b", "a", "d"]], [[5, 4, 3, 2, 1], [3, 2, 1]])
    assert hard_negatives(queries, results, per_query=2) == [["b", "d"], ["a", "d"]]


def _bench(name, n_train=50):
    tools = [Tool(f"{name}:{i}", f"tool{i}", f"does thing {i}") for i in range(5)]
    queries = [Query(f"{name}-q{i}", f"request {i}", (f"{name}:{i % 5}",), "train") for i in range(n_train)]
    queries += [Query(f"{name}-t{i}", f"test {i}", (f"{name}:0",), "test") for i in range(3)]
    return BenchmarkSet(name, tools, queries)


def test_validation_is_carved_from_train_deterministically_and_never_from_test():
    a = load_training_data([_bench("s1", 200), _bench("s2", 100)], validation_fraction=0.2)
    b = load_training_data([_bench("s1", 200), _bench("s2", 100)], validation_fraction=0.2)
    assert [q.id for q in a.validation] == [q.id for q in b.validation]
    assert 30 <= len(a.validation) <= 90 and len(a.train) + len(a.validation) == 300
    assert not {q.id for q in a.train} & {q.id for q in a.validation}
    assert all(q.split == "train" for q in a.train + a.validation)
    assert len(a.tools) == 10 and a.usage()["s1:0"]


def _toy_problem():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x @ torch.randn(8, 1) > 0).float()
    return list(zip(x, y))


def _trainer(tmp_path, max_steps, model=None, validate=None, made_with=None, **cfg):
    torch.manual_seed(0)
    model = model or torch.nn.Linear(8, 1)
    data = _toy_problem()

    def loss_fn(batch):
        xb = torch.stack([b[0] for b in batch])
        yb = torch.stack([b[1] for b in batch])
        return torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)

    config = TrainConfig(**{"epochs": 4, "batch_size": 32, "lr": 0.05, "max_steps": max_steps, "progress": False,
                            "checkpoint_every": 5, "warmup_ratio": 0.0, **cfg})
    return model, Trainer("toy", model, loss_fn, lambda epoch: batched(data, 32, 0, epoch), config,
                          tmp_path / "out", validate=validate, made_with=made_with), loss_fn, data


def test_trainer_reduces_loss_and_resumes_to_identical_weights(tmp_path, capsys):
    model, trainer, loss_fn, data = _trainer(tmp_path / "a", None)
    everything = batched(data, 256, 0, 0)[0]
    before = loss_fn(everything).item()
    summary = trainer.fit()
    assert loss_fn(everything).item() < before * 0.7
    assert summary.steps == 32 and summary.examples == 4 * 256 and summary.epochs_done == 4
    assert "resuming" not in capsys.readouterr().err

    # a run killed during step 13 (its last checkpoint is at step 10) is resumed to the end, and says so
    checkpoint = _interrupted_at_step_10(tmp_path / "b", None)
    assert (checkpoint / "state.json").exists()
    model_c, trainer_c, _, _ = _trainer(tmp_path / "b", None)
    summary_c = trainer_c.fit(resume=True)
    assert summary_c.resumed_from_step == 10 and summary_c.steps == 32
    assert f"resuming the interrupted toy run at step 10 of 32 from {checkpoint}" in capsys.readouterr().err
    for p, q in zip(model.parameters(), model_c.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def _interrupted_at_step_10(tmp_path, made_with):
    _model, trainer, loss, _ = _trainer(tmp_path, None, made_with=made_with)
    calls = []

    def dying_loss(batch):
        calls.append(1)
        if len(calls) == 13:
            raise KeyboardInterrupt
        return loss(batch)

    trainer.loss_fn = dying_loss
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    return trainer.checkpoint_dir


def test_a_checkpoint_resumes_only_a_run_with_the_settings_it_was_made_with(tmp_path):
    """An interrupted run on set A with lr 0.05 is not resumed by a run on set B with lr 0.01: refused, naming
    both differences and how to start afresh; the checkpoint is kept. resume=False starts afresh; the same
    settings resume (checkpoint at step 10)."""
    from toolscout.train.loop import CheckpointMismatch, run_settings

    def settings(name, loss="infonce"):
        bench = BenchmarkSet(name, [Tool("t1", "t1", "d")], [Query(f"q{i}", f"task {i}", ("t1",), "train")
                                                              for i in range(5)])
        return run_settings(load_training_data([bench], validation_fraction=0.0), None, loss=loss)

    checkpoint = _interrupted_at_step_10(tmp_path, settings("setA"))
    _model, other, _, _ = _trainer(tmp_path, None, made_with=settings("setB", loss="triplet"), lr=0.01)
    with pytest.raises(CheckpointMismatch) as refused:
        other.fit()
    message = str(refused.value)
    assert "--data setA then, setB now" in message and "--lr 0.05 then, 0.01 now" in message
    assert "-o loss infonce then, triplet now" in message and "--batch-size" not in message
    assert "--no-resume" in message and str(checkpoint) in message
    assert json.loads((checkpoint / "state.json").read_text())["step"] == 10  # kept
    _model, same, _, _ = _trainer(tmp_path, None, made_with=settings("setA"))
    assert same.fit().resumed_from_step == 10

    checkpoint = _interrupted_at_step_10(tmp_path / "fresh", settings("setA"))
    _model, fresh, _, _ = _trainer(tmp_path / "fresh", None, made_with=settings("setB"), lr=0.01)
    assert fresh.fit(resume=False).resumed_from_step is None


def test_ctrl_c_ends_training_after_the_step_in_progress_and_checkpoints_it(tmp_path):
    """A Ctrl-C came during step 13: the step finishes, step 13 is checkpointed (the last periodic checkpoint
    was step 10, so three steps were lost), and the resumed run ends with the uninterrupted run's weights."""
    import signal

    model, trainer, _, _ = _trainer(tmp_path / "a", None)
    trainer.fit()
    model_b, trainer_b, loss_b, _ = _trainer(tmp_path / "b", None)
    trainer_b.loss_fn = _ctrl_c_at_call(13, loss_b)
    before = signal.getsignal(signal.SIGINT)  # Python's own; ignored in a pytest-xdist worker
    with pytest.raises(KeyboardInterrupt):
        trainer_b.fit()
    assert json.loads((trainer_b.checkpoint_dir / "state.json").read_text())["step"] == 13
    assert signal.getsignal(signal.SIGINT) is before  # put back
    model_c, trainer_c, _, _ = _trainer(tmp_path / "b", None)
    summary_c = trainer_c.fit(resume=True)
    assert summary_c.resumed_from_step == 13 and summary_c.steps == 32
    for p, q in zip(model.parameters(), model_c.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def _ctrl_c_while_loading(data, out, *, model=None, config=None, resume=True):
    """A trainer that Ctrl-C stops before its first step (while it loads, encodes or mines)."""
    raise KeyboardInterrupt


def _ctrl_c_in_step_3(data, out, *, model=None, config=None, resume=True):
    """A real toy run into `out` that Ctrl-C ends during step 3: the step finishes and is checkpointed."""
    from pathlib import Path

    _model, trainer, loss, _ = _trainer(Path(out).parent, None)
    trainer.loss_fn = _ctrl_c_at_call(3, loss)
    return trainer.fit(resume=resume)


def _ctrl_c_at_call(n: int, loss):
    """`loss`, which sends this process SIGINT (as a terminal's Ctrl-C) at its `n`-th call."""
    import os
    import signal

    calls = []

    def interrupted_loss(batch):
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGINT)
        return loss(batch)

    return interrupted_loss


def test_ctrl_c_in_train_says_whether_anything_was_saved_and_what_the_next_run_does(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from toolscout.cli import main
    from toolscout.train import TRAINERS

    sample = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"
    command = ["train", "toy", "--data", str(sample), "--out", str(tmp_path / "out"), "--quiet"]
    monkeypatch.setitem(TRAINERS, "toy", f"{__name__}:_ctrl_c_while_loading")
    assert main(command) == 130
    assert ("toolscout train: interrupted before any training step was checkpointed: nothing of this run was saved, "
            "and the next run starts afresh") in capsys.readouterr().err
    assert not list(tmp_path.iterdir())

    monkeypatch.setitem(TRAINERS, "toy", f"{__name__}:_ctrl_c_in_step_3")
    assert main(command) == 130
    checkpoint = tmp_path / "out.checkpoint"
    assert json.loads((checkpoint / "state.json").read_text())["step"] == 3
    assert (f"toolscout train: interrupted; the same command resumes from {checkpoint} (at step 3) (--no-resume "
            "starts afresh)") in capsys.readouterr().err
    assert main([*command, "--no-resume"]) == 130
    assert (f"without --no-resume the same command resumes from {checkpoint} (at step 3); with it, afresh"
            in capsys.readouterr().err)

    from toolscout.artifacts import write_artifact
    from toolscout.models import model_base

    with write_artifact(tmp_path / "out.finetune", model_base("embed")):  # a stage an earlier run finished
        pass
    monkeypatch.setitem(TRAINERS, "toy", f"{__name__}:_ctrl_c_while_loading")
    assert main(command) == 130
    assert (f"resumes from {checkpoint} (at step 3), {tmp_path / 'out.finetune'} (finished)"
            in capsys.readouterr().err)


def _toy_run(data, out, *, model=None, config=None, resume=True):
    from pathlib import Path

    return _trainer(Path(out).parent, 4)[1].fit(resume=resume)


def test_train_says_up_front_when_there_are_no_validation_queries(tmp_path, capsys, monkeypatch):
    """With no validation queries nothing can be chosen on them: said before training, not only as 'n/a' after."""
    from pathlib import Path

    from toolscout.cli import main
    from toolscout.train import TRAINERS

    sample = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"
    monkeypatch.setitem(TRAINERS, "toy", f"{__name__}:_toy_run")
    command = ["train", "toy", "--data", str(sample), "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*command, "--validation-fraction", "0"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("training toy on apibank_sample: 23 train and 0 validation queries")
    assert lines[1].startswith("no validation queries (none of the 23 train queries fell in --validation-fraction 0, "
                               "and no set has a validation split): nothing is chosen on validation, so there is no "
                               "early stopping, the last weights are saved"), lines[1]
    assert "best validation nDCG@10 n/a" in lines[-1]
    assert main(command) == 0  # the default fraction: 2 validation queries, nothing more said
    assert "no validation queries" not in capsys.readouterr().err


def test_early_stopping_keeps_the_best_weights(tmp_path):
    scores = iter([10.0, 30.0, 20.0, 15.0, 12.0, 11.0])
    snapshots = []
    model = torch.nn.Linear(8, 1)

    def validate():
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return next(scores)

    model, trainer, _, _ = _trainer(tmp_path, None, model=model, validate=validate, eval_every=4, patience=2)
    summary = trainer.fit()
    assert summary.stopped_early and summary.best_validation == 30.0 and summary.best_step == 8
    assert summary.steps == 16  # validations at 4, 8, 12, 16: two without improvement → stop
    assert torch.equal(model.weight, snapshots[1]["weight"])


def test_a_model_directory_a_newer_toolscout_saved_or_a_damaged_one_is_named_not_loaded_as_an_encoder(tmp_path):
    from toolscout.artifacts import ArtifactError, write_artifact
    from toolscout.models import FORMAT_VERSION, MODEL_KIND
    from toolscout.retrievers.dense import DenseRetriever

    model = tmp_path / "model"
    with write_artifact(model, {"kind": MODEL_KIND, "format_version": FORMAT_VERSION + 1, "method": "embed"}):
        pass
    with pytest.raises(ArtifactError, match=f"format_version {FORMAT_VERSION + 1} is not supported.*upgrade toolscout"):
        DenseRetriever(model=str(model))
    (model / "CURRENT").write_text("v000099\n")  # a copy that left its live version behind
    with pytest.raises(ArtifactError, match="CURRENT names the version 'v000099', which is not there"):
        DenseRetriever(model=str(model))


def test_what_a_ctrl_c_left_is_said_even_when_a_checkpoint_is_damaged(tmp_path):
    """Asked in the Ctrl-C handler: a state.json cut short raised over the interruption (exit 1, not 130)."""
    from toolscout.train.loop import checkpoint_dir, left_to_resume

    out = tmp_path / "model"
    state = checkpoint_dir(out) / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"step": 4')
    [said] = left_to_resume(out)
    assert said.startswith(f"{out} (unreadable: {state}: invalid JSON")
    state.write_text('{"step": 4}')
    assert left_to_resume(out) == [f"{state.parent} (at step 4)"]
