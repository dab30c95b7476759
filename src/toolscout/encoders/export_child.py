"""The one-time ONNX export of a model, run in a child process (`python -m toolscout.encoders JOB`: `__main__`).

Exporting loads torch and the model (over a gigabyte at its peak), and a process keeps most of that memory
once it has had it. A server or gateway that only needs the export's result (a CPU whose int8 encoding is
not the checked one runs the float32 export: `Encoder._float32_instead`) would otherwise hold torch for its
whole life; so the export runs in a child, and the parent loads only the ONNX folder it leaves in the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .onnx_export import OnnxUnavailable

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding `toolscout`: the child runs this same code
CHILD = "toolscout.encoders"  # its __main__ runs the job
STDERR_TAIL = 2000  # characters of the child's stderr an error quotes


def export_in_child(name: str, path: str, variant: str, max_seq_length: int | None, target: Path) -> None:
    """Export model `name` (at `path`) into the cache folder `target` in a child process; raises OnnxUnavailable
    when the export failed or was refused (the child has recorded a failed marker where the export itself failed)."""
    job = {"name": name, "path": path, "variant": variant, "max_seq_length": max_seq_length, "target": str(target)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    # stdin and stdout are not the child's: over stdio they are the MCP host's channel
    done = subprocess.run([sys.executable, "-m", CHILD, json.dumps(job)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env)
    if done.returncode == 0 and (target / "meta.json").exists():
        return
    lines = done.stdout.strip().splitlines()
    reason = json.loads(lines[-1]).get("error") if lines and lines[-1].startswith("{") else None
    raise OnnxUnavailable(reason or f"the export process exited with status {done.returncode}: "
                          f"{done.stderr.strip()[-STDERR_TAIL:] or 'no output'}")
