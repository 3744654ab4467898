"""benchmarks/rebuild_library.py: a benchmark run's library is rebuilt byte for byte from its
manifest and the sketches, and loads; a manifest it cannot reproduce writes nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kernels import library
from kernels.protocol import source_sha256
from tests.benchmarks import ROOT, run_script

RUN_C = ROOT / "docs/benchmarks/model/library-manifest-2026-12-04-c.json"
SKETCHES = ROOT / "tests/fixtures/honest"


def rebuild(manifest: Path, out: Path) -> subprocess.CompletedProcess:
    return run_script(
        "rebuild_library.py", str(manifest), "--sketches", str(SKETCHES), "--out", str(out)
    )


def test_run_cs_releases_are_rebuilt_as_released_and_load(tmp_path: Path) -> None:
    out = tmp_path / "library"
    done = rebuild(RUN_C, out)
    assert done.returncode == 0, done.stderr
    manifest = json.loads(RUN_C.read_text())
    assert json.loads((out / "manifest.json").read_text()) == manifest
    for rel in manifest["releases"]:
        assert source_sha256((out / rel["file"]).read_text()) == rel["source_sha256"]
    assert "swiglu" in done.stdout and "'BLOCK_SIZE': 1024" in done.stdout
    kernel = library.load("rmsnorm", out)
    assert [r["id"] for r in kernel.releases] == [1]


def test_a_release_no_knob_setting_reproduces_writes_nothing(tmp_path: Path) -> None:
    manifest = json.loads(RUN_C.read_text())
    manifest["releases"][1]["source_sha256"] = "0" * 64
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(manifest))
    out = tmp_path / "library"
    done = rebuild(bad, out)
    assert done.returncode != 0
    assert "release 2 (rope): no knob setting" in done.stderr
    assert not out.exists()
