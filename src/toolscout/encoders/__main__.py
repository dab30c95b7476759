"""`python -m toolscout.encoders JOB`: one ONNX export job in a child process (see `export_child`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import MissingDependency
from . import Encoder
from .onnx_export import OnnxUnavailable


def main(argv: list[str]) -> int:
    """Run one export job (the JSON `export_in_child` passes); on failure print {"error": why} as the last line."""
    job = json.loads(argv[0])
    encoder = Encoder(name=job["name"], path=job["path"], device="cpu", max_seq_length=job["max_seq_length"],
                      backend=job["variant"])
    try:
        encoder.export_here(Path(job["target"]), job["variant"])
    except (OnnxUnavailable, MissingDependency, OSError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    return 0



if __name__ == "__main__":  # pragma: no cover (run by `export_child.export_in_child`, in a child process)
    sys.exit(main(sys.argv[1:]))
