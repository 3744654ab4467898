"""docs/problems.md's worked example runs as written: its files are written where it says, and
its commands and Python run in order, in a fresh directory, against this checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "problems.md"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.S | re.M)


def worked_example() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(path -> text of each `file=` block, [(language, code) of each `run` block])."""
    files, runs = {}, []
    for lang, info, code in FENCE.findall(GUIDE.read_text()):
        words = info.split()
        for word in words:
            if word.startswith("file="):
                files[word[len("file=") :]] = code
        if "run" in words:
            runs.append((lang, code))
    return files, runs


def write_example(where: Path) -> Path:
    """Write the worked example's files under `where`; the problem directory they make."""
    files, _ = worked_example()
    for rel, text in files.items():
        path = where / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return where / "myproblems"


def test_the_worked_example_runs_as_written(tmp_path):
    files, runs = worked_example()
    assert set(files) == {"myproblems/add_rmsnorm.py", "myproblems/seeds/add_rmsnorm.py"}
    assert [lang for lang, _ in runs] == ["sh", "python"]
    write_example(tmp_path)
    script = ["set -euo pipefail"]
    for i, (lang, code) in enumerate(runs):
        if lang == "python":
            (tmp_path / f"_block{i}.py").write_text(code)
            script.append(f"python _block{i}.py")
        else:
            script.append(code)
    env = {k: v for k, v in os.environ.items() if k != "AUTOWEB_PROBLEM_DIRS"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `python` is this venv's
    out = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "add_rmsnorm        kernel(x, residual, weight)" in out.stdout
    assert "verdict: accepted" in out.stdout
    assert "best: BLOCK_N=" in out.stdout  # the tuner ran on the seed's knobs
    assert "{'M': 4, 'N': 64}" in out.stdout
