"""Rebuild apibank_sample/ from the converted API-Bank set (Apache-2.0): `python make_apibank_sample.py DATA_DIR`.

DATA_DIR is the benchmark folder of API-Bank in the toolscout format (tools.jsonl + queries.jsonl).
The selection is deterministic:
- tools: every level-1/2 API except ToolSearcher (49), the five level-3 APIs of three multi-tool
  test tasks (email reminder; geocoding + weather; salary + tax), and the six training-split APIs
  that cover the most training queries on their own;
- queries: for each level-1/2 API the first two test dialogues (in file order, at most 1,500
  characters) labelled with it, the level-3 test tasks of those three groups, and every training
  query whose labels are all sample tools.
"""

import json
import sys
from collections import Counter
from pathlib import Path

LEVEL3 = ("EmailReminder", "Geocoding", "GetWeatherForCoordinates", "GetOccupationSalary", "TaxCalculator")
N_TRAIN_TOOLS, PER_TOOL, MAX_CHARS = 6, 2, 1500


def main(data_dir: Path, out_dir: Path) -> None:
    tools = [json.loads(line) for line in open(data_dir / "tools.jsonl", encoding="utf-8")]
    queries = [json.loads(line) for line in open(data_dir / "queries.jsonl", encoding="utf-8")]
    chosen = {t["id"] for t in tools if t["category"] == "level-1/2" and t["name"] != "ToolSearcher"}
    chosen |= {f"apibank::{name}" for name in LEVEL3}
    train = [q for q in queries if q["split"] == "train"]
    by_train_tool = Counter(q["labels"][0] for q in train if len(q["labels"]) == 1 and q["labels"][0] not in chosen)
    chosen |= {tool for tool, _ in by_train_tool.most_common(N_TRAIN_TOOLS)}

    picked, per_tool = [], Counter()
    for q in queries:
        if q["split"] != "test" or not set(q["labels"]) <= chosen or len(q["query"]) > MAX_CHARS:
            continue
        if q["id"].startswith("apibank_l3_"):
            picked.append(q)
        elif any(per_tool[label] < PER_TOOL for label in q["labels"]):
            per_tool.update(q["labels"])
            picked.append(q)
    picked += [q for q in train if set(q["labels"]) <= chosen]

    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "tools.jsonl", "w", encoding="utf-8") as fh:
        for t in tools:
            if t["id"] in chosen:
                fh.write(json.dumps(t, ensure_ascii=False) + "\n")
    with open(out_dir / "queries.jsonl", "w", encoding="utf-8") as fh:
        for q in picked:
            fh.write(json.dumps(q, ensure_ascii=False) + "\n")
    splits = Counter(q["split"] for q in picked)
    print(f"{len(chosen)} tools, {len(picked)} queries {dict(splits)} → {out_dir}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).parent / "apibank_sample")
