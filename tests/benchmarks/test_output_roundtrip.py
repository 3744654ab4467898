"""benchmarks/output_roundtrip.py on the CPU: it runs the harness's own write and read of an
output, checks the bytes come back unchanged, and refuses bad flags with a clear message."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.benchmarks import run_script


def bench(*args: str) -> subprocess.CompletedProcess:
    return run_script("output_roundtrip.py", "--device", "cpu", *args)


def test_it_times_each_step_for_each_size(tmp_path: Path) -> None:
    out = tmp_path / "roundtrip.json"
    done = bench("--mib", "1,2", "--repeats", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert [row["mib"] for row in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert all(row[f"{step}_s"] >= 0 for step in ("write", "read", "sha256", "to_device"))
    assert "2 MiB" in done.stdout and result["repeats"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mib", "big"), "--mib takes whole numbers of MiB"),
        (("--mib", "0"), "at least one size of 1 MiB or more"),
        (("--repeats", "0"), "--repeats must be at least 1"),
    ],
)
def test_bad_flags_get_a_clear_error(args: tuple[str, ...], message: str) -> None:
    done = bench(*args)
    assert done.returncode == 2 and message in done.stderr
