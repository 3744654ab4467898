"""Place a timing on the roofline of the device it ran on."""

from __future__ import annotations

# A kernel this far past the roofline floor is not fast, it is skipping work or lying.
HACK_FACTOR_DRAM = 1.25  # data larger than L2: DRAM bound is hard
HACK_FACTOR_CACHED = 4.0  # data that may stay in L2 (rotated input sets should prevent it)
LATENCY_MS = 0.010


def floor(flops: float, nbytes: float, ceilings: dict) -> dict:
    """The least time the work can take on a device with these measured ceilings, and which
    ceiling sets it: `bytes / copy bandwidth` or `flops / bf16 matrix rate`, whichever is longer."""
    mem_floor = nbytes / (ceilings["copy_gbps"] * 1e9)
    cmp_floor = flops / (ceilings["matmul_tflops_bf16"] * 1e12)
    return {
        "floor_ms": max(mem_floor, cmp_floor) * 1e3,
        "memory_floor_ms": mem_floor * 1e3,
        "compute_floor_ms": cmp_floor * 1e3,
        "bound": "compute" if cmp_floor > mem_floor else "memory",
    }


def place(ms: float, flops: float, nbytes: float, ceilings: dict) -> dict:
    bw = ceilings["copy_gbps"] * 1e9
    rate = ceilings["matmul_tflops_bf16"] * 1e12
    t = ms * 1e-3
    floors = floor(flops, nbytes, ceilings)
    mem_floor = floors["memory_floor_ms"] * 1e-3
    cmp_floor = floors["compute_floor_ms"] * 1e-3
    floor_s = floors["floor_ms"] * 1e-3
    if floor_s < 0.5 * LATENCY_MS * 1e-3 and ms < LATENCY_MS * 3:
        bound = "latency"
    elif cmp_floor > mem_floor:
        bound = "compute"
    else:
        bound = "memory"
    fraction = floor_s / t if t > 0 else float("inf")
    limit = (
        HACK_FACTOR_DRAM if nbytes > 2 * ceilings.get("l2_bytes", 50 << 20) else HACK_FACTOR_CACHED
    )
    return {
        "gbps": nbytes / t / 1e9 if t > 0 else None,
        "tflops": flops / t / 1e12 if t > 0 else None,
        "floor_ms": floors["floor_ms"],
        "roofline_fraction": fraction,
        "bandwidth_fraction": (nbytes / t) / bw if t > 0 else None,
        "compute_fraction": (flops / t) / rate if t > 0 else None,
        "bound": bound,
        "beyond_roofline": fraction > limit,
        "arithmetic_intensity": flops / nbytes if nbytes else None,
    }
