"""simtrain's calibration suite: torch microbenchmarks run on the target hardware.

It measures GEMMs at the exact shapes a model and layout produce (enumerated by simtrain's own
lowering), attention, memory-bound operations, memory bandwidth, collectives through
torch.distributed, the GEMM slowdown while a collective runs, and the memory of a layer step; fits
cost functions (scipy); and writes a versioned profile under ``calibrated/<name>/`` of the user
profile directory (``simtrain/hardware/profile_paths.py``) that ``simtrain simulate --set hardware.profile=<name>`` loads (``simtrain/hardware/profile.py``).

Entry points: ``simtrain calibrate ...`` (= ``python -m calibration ...``) for one device, and
``torchrun ... -m calibration.collectives --out NAME`` for the multi-GPU / multi-node collectives.
This package imports torch; simtrain itself never does.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
