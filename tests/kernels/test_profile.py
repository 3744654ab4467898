"""Parsing Nsight Compute's CSV for `python -m kernels profile` (the GPU run needs ncu)."""

from __future__ import annotations

from kernels.harness.profile import parse_ncu_csv

HEADER = [
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
    "Section Name",
    "Metric Name",
    "Metric Unit",
    "Metric Value",
]


def _row(launch: str, kernel: str, metric: str, unit: str, value: str) -> str:
    cells = [
        launch,
        "1234",
        "python3",
        "127.0.0.1",
        kernel,
        "1",
        "7",
        "(128, 1, 1)",
        "(4096, 1, 1)",
        "0",
        "9.0",
        "Command line profiler metrics",
        metric,
        unit,
        value,
    ]
    return ",".join(f'"{c}"' for c in cells)


NCU_CSV = "\n".join(
    [
        "==PROF== Connected to process 1234",
        '==PROF== Profiling "_softmax_kernel" - 0: 0%....50%....100% - 9 passes',
        ",".join(f'"{h}"' for h in HEADER),
        _row(
            "0",
            "_softmax_kernel",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "%",
            "83.41",
        ),
        _row("0", "_softmax_kernel", "gpu__time_duration.sum", "usecond", "30.02"),
        _row(
            "0", "_softmax_kernel", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "41.20"
        ),
        _row(
            "0",
            "_softmax_kernel",
            "sm__warps_active.avg.pct_of_peak_sustained_active",
            "%",
            "1,234.5",
        ),
        _row("1", "_other", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "n/a"),
    ]
)


def test_it_reads_one_row_per_kernel_launch_with_named_metrics():
    rows = parse_ncu_csv(NCU_CSV)
    assert [r["kernel"] for r in rows] == ["_softmax_kernel", "_other"]
    first = rows[0]
    assert first["dram_pct"] == 83.41
    assert first["sm_pct"] == 41.2
    assert first["occupancy_pct"] == 1234.5  # thousands separators are dropped
    assert first["duration"] == 30.02 and first["duration_unit"] == "usecond"
    assert rows[1]["dram_pct"] == "n/a"  # kept as text, not invented


def test_it_ignores_profiler_chatter_and_empty_output():
    assert parse_ncu_csv("==PROF== nothing profiled\n") == []
    assert parse_ncu_csv("") == []
