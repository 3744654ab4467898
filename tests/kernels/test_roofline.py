"""roofline.place(): bound classification and the beyond-the-roofline alarm."""

from __future__ import annotations

import pytest
import torch

from kernels import problems
from kernels.harness.roofline import place

# The project's H200, as measured (docs/harness.md, Measurement).
H200 = {"copy_gbps": 4270.0, "matmul_tflops_bf16": 688.0, "l2_bytes": 50 << 20}
BF16 = torch.bfloat16


def _work(name: str, shape: dict[str, int]) -> tuple[float, float]:
    p = problems.load(name)
    return p.flops(shape), p.bytes(shape, BF16)


def test_a_memory_bound_row_op_is_classified_memory_below_the_roofline() -> None:
    flops, nbytes = _work("softmax", {"M": 65536, "N": 4096})
    floor_ms = nbytes / (H200["copy_gbps"] * 1e9) * 1e3

    pl = place(floor_ms / 0.8, flops, nbytes, H200)

    assert pl["bound"] == "memory"
    assert pl["roofline_fraction"] == pytest.approx(0.8)
    assert pl["roofline_fraction"] < 1
    assert pl["bandwidth_fraction"] == pytest.approx(0.8)
    assert pl["gbps"] == pytest.approx(0.8 * H200["copy_gbps"])
    assert pl["beyond_roofline"] is False


def test_a_large_matmul_is_classified_compute() -> None:
    flops, nbytes = _work("matmul", {"M": 8192, "N": 8192, "K": 8192})
    # 2 * 8192^3 flops at 688 TFLOP/s is 1.6 ms; 1.8 ms is 89% of the compute roof.
    pl = place(1.8, flops, nbytes, H200)

    assert pl["bound"] == "compute"
    assert pl["floor_ms"] == pytest.approx(flops / (H200["matmul_tflops_bf16"] * 1e12) * 1e3)
    assert 0.85 < pl["roofline_fraction"] < 0.95
    assert pl["tflops"] == pytest.approx(flops / 1.8e-3 / 1e12)
    assert pl["arithmetic_intensity"] > 1000
    assert pl["beyond_roofline"] is False


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("softmax", {"M": 65536, "N": 4096}),
        ("rmsnorm", {"M": 16384, "N": 4096}),
        ("matmul", {"M": 8192, "N": 8192, "K": 8192}),
    ],
)
def test_a_time_faster_than_the_floor_on_a_large_shape_is_beyond_the_roofline(
    name: str, shape: dict[str, int]
) -> None:
    flops, nbytes = _work(name, shape)
    assert nbytes > 2 * H200["l2_bytes"]  # cannot be served from L2
    floor_ms = place(1.0, flops, nbytes, H200)["floor_ms"]

    at_floor = place(floor_ms, flops, nbytes, H200)
    too_fast = place(floor_ms / 2, flops, nbytes, H200)

    assert at_floor["beyond_roofline"] is False
    assert too_fast["beyond_roofline"] is True
    assert too_fast["roofline_fraction"] == pytest.approx(2.0)


def test_data_that_fits_in_l2_may_beat_the_dram_floor_but_not_by_far() -> None:
    flops, nbytes = _work("softmax", {"M": 1024, "N": 4096})  # 16 MiB: L2-resident
    floor_ms = place(1.0, flops, nbytes, H200)["floor_ms"]

    assert place(floor_ms / 2, flops, nbytes, H200)["beyond_roofline"] is False
    assert place(floor_ms / 10, flops, nbytes, H200)["beyond_roofline"] is True


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("softmax", {"M": 1, "N": 1}),
        ("softmax", {"M": 1, "N": 4096}),
        ("matmul", {"M": 1, "N": 1, "K": 1}),
    ],
)
def test_a_tiny_shape_is_classified_latency(name: str, shape: dict[str, int]) -> None:
    flops, nbytes = _work(name, shape)

    pl = place(0.005, flops, nbytes, H200)

    assert pl["bound"] == "latency"
    assert pl["roofline_fraction"] < 0.01
    assert pl["beyond_roofline"] is False
