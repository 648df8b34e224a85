"""SI units and converters.

Everything inside simtrain is SI: seconds, bytes, FLOPs, bytes/s, FLOP/s. Input files name their
unit in the key (``hbm_GiB``, ``nvlink_GBps``, ``latency_us``, ``bf16_tflops``) and are converted
once, at load, with the constants below. GB (1e9) and GiB (2**30) are different numbers.
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024.0
MiB = 1024.0**2
GiB = 1024.0**3
TiB = 1024.0**4

US = 1e-6
MS = 1e-3
NS = 1e-9

TFLOPS = 1e12
PFLOPS = 1e15

BF16_BYTES = 2
FP32_BYTES = 4
FP8_BYTES = 1


def gbps_to_Bps(gbit_per_s: float) -> float:
    """Convert a link rate in Gbit/s (as NICs are sold) to bytes/s."""
    return gbit_per_s * 1e9 / 8.0


def GBps_to_Bps(gbyte_per_s: float) -> float:
    """Convert GB/s (decimal) to bytes/s."""
    return gbyte_per_s * GB


def us_to_s(microseconds: float) -> float:
    """Convert microseconds to seconds."""
    return microseconds * US
