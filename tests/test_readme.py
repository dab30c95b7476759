"""The README's Python example runs as written (against the bundled petstore API as its `openapi.yaml`)."""

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readmes_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Use it from Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shutil.copy(ROOT / "src" / "toolscout" / "data" / "catalogs" / "petstore_openapi.yaml", tmp_path / "openapi.yaml")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (Use it from Python)", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5 and printed[0].split()[:2] == ["1", "findPetsByStatus"], printed
    assert (tmp_path / "my-index" / "CURRENT").exists()


def test_the_readmes_namespace_examples_are_what_slugify_gives():
    # the OpenAPI row of "Catalog formats" said "letters of any script", while 'Café API' slugs to 'caf-api'
    from toolscout.ingest.common import slugify

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [row] = [line for line in readme.splitlines() if line.startswith("| OpenAPI 3, Swagger 2.0 |")]
    examples = re.findall(r"`([^`]+)` → `([^`]+)`", row.rsplit(" | ", 1)[1])
    assert len(examples) == 3 and "Café API" in dict(examples)
    assert [slugify(title) for title, _ in examples] == [slug for _, slug in examples]


def test_the_readme_gives_the_index_format_version_the_code_writes():
    # the README said format 2 (and reading 1) while `save` wrote and `load` read format 3
    from toolscout.spec import PIPELINE_FORMAT

    readme = (ROOT / "README.md").read_text(encoding="utf-8").replace("\n", " ")
    [(written, oldest, newest)] = re.findall(r"The format version is (\d+) since [\d-]+ \(older toolscouts refuse "
                                             r"it and say to upgrade; this one reads formats (\d+) to (\d+)\)", readme)
    assert int(written) == int(newest) == PIPELINE_FORMAT and int(oldest) == 1
