"""`toolscout expand | generate` and the view flags of `toolscout eval`, through the real CLI entry point."""

import json
from pathlib import Path

from fakellm import FakeLLM

from toolscout.cli import main
from toolscout.expand.ablation import compare_views, load_sets
from toolscout.tool import TextView

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"


def test_usage_expansion_then_eval_with_view_flags(tmp_path):
    out = tmp_path / "sample_u3"
    assert main(["expand", str(SAMPLE), "--out", str(out), "--usage", "3"]) == 0
    report = tmp_path / "eval.json"
    assert main(["eval", str(out), "--retriever", "bm25", "--usage", "3", "--profile-fields", "none", "--quiet",
                 "--json", str(report)]) == 0
    via_cli = json.loads(report.read_text())["sets"]["sample_u3"]["ndcg@10"]
    view = TextView(usage=3, profile_fields=())
    via_api = compare_views(load_sets([out]), "bm25", {"u3": view}, progress=False)["u3"]
    assert via_cli == via_api.sets["sample_u3"].metrics["ndcg@10"]


def test_expand_and_generate_commands(tmp_path, capsys):
    with FakeLLM() as fake:
        llm = ["--base-url", fake.url, "--model", "m", "--no-cache", "--quiet"]
        assert main(["expand", str(SAMPLE), "--out", str(tmp_path / "x"), *llm]) == 0
        assert main(["generate", str(tmp_path / "x"), "--n", "5", "--out", str(tmp_path / "g"), *llm]) == 0
        assert main(["generate", str(SAMPLE), "--n", "5", "--out", str(tmp_path / "g.jsonl"), *llm]) == 1
    assert "give a folder" in capsys.readouterr().err
    assert len((tmp_path / "g" / "queries.jsonl").read_text().splitlines()) == 5
