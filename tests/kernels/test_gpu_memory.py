"""A candidate whose process runs out of GPU memory because other processes filled the GPU is
not judged (HarnessFault, run again), and one that fills the GPU itself is `crashed`
(kernels.harness.verdict.crowded_out). Each fills most of the GPU: run them alone, never beside
other GPU tests (benchmarks/h200_tests.sh runs them with the timing-isolation tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.harness import evaluate
from kernels.protocol import HarnessFault

ROOT = Path(__file__).resolve().parents[2]
SEED = (ROOT / "kernels" / "seeds" / "softmax.py").read_text()
SCRATCH = 4 << 30  # what the candidate below asks for besides its output
# An honest softmax that also takes a scratch buffer of SCRATCH bytes on each call: fine on a
# GPU with room, out of memory on one that other processes have filled.
WITH_SCRATCH = SEED.replace(
    "    y = torch.empty_like(x)\n",
    f"    y = torch.empty_like(x)\n    scratch = torch.empty({SCRATCH}, dtype=torch.uint8, "
    "device=x.device)\n    scratch.zero_()\n",
    1,
)
# A softmax that first takes the GPU's memory 1 GiB at a time, up to 1 TiB: more than any GPU
# has. Bounded, so that its compile-only pass on meta tensors, which take no memory, ends.
HOG = SEED.replace(
    "    y = torch.empty_like(x)\n",
    "    y = torch.empty_like(x)\n    hoard = [torch.ones(1 << 28, dtype=torch.float32, "
    "device=x.device) for _ in range(1024)]\n",
    1,
)


@pytest.mark.gpu
def test_a_candidate_squeezed_out_by_other_processes_is_not_judged_and_passes_with_room():
    import torch

    assert "scratch.zero_()" in WITH_SCRATCH
    free, _ = torch.cuda.mem_get_info()
    # This process stands for the other evaluations: it leaves 3 GiB, room for the sandboxed
    # process's context and the smoke shapes, not for the scratch buffer.
    others = torch.empty(free - (3 << 30), dtype=torch.uint8, device="cuda")
    try:
        with pytest.raises(HarnessFault) as caught:
            evaluate("softmax", WITH_SCRATCH, device="cuda", tier="smoke")
    finally:
        del others
        torch.cuda.empty_cache()
    why = str(caught.value)
    assert "the sandboxed process ran out of GPU memory while other processes held" in why
    assert "asked for 4.0 GiB more" in why and why.endswith("the candidate was not judged")

    report = evaluate("softmax", WITH_SCRATCH, device="cuda", tier="smoke")
    assert report["verdict"] == "accepted", report["reasons"]


@pytest.mark.gpu
def test_a_candidate_that_fills_the_gpu_itself_is_crashed_with_what_it_held():
    assert "hoard = " in HOG
    report = evaluate("softmax", HOG, device="cuda", tier="smoke")

    assert report["verdict"] == "rejected"
    assert report["failure"] == "crashed", report["reasons"]
    why = " ".join(report["reasons"])
    assert "out of memory" in why and "the sandboxed process held" in why, why
