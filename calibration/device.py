"""What the calibration ran on: device name, memory, clocks, driver and library versions.

The fingerprint (device, dtype, threads, torch version) ties a measurement journal to its machine:
resuming on another device or software stack is refused (``calibration.journal``).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from typing import Any

import torch

# (substring of the CUDA device name, memory class) -> simtrain's built-in GPU profile
_BASE_GPUS = (("GB200", None, "gb200"), ("B200", None, "b200"), ("H200", None, "h200"), ("H800", None, "h800"),
              ("H100", None, "h100-sxm"), ("A100", "40", "a100-40gb"), ("A100", None, "a100-80gb"),
              ("MI300X", None, "mi300x"))
_SMI_FIELDS = ("driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "power.limit",
               "temperature.gpu", "clocks_throttle_reasons.active")


def base_gpu_for(name: str, memory_bytes: float) -> str | None:
    """simtrain's built-in GPU profile for a CUDA device name (None if unknown)."""
    upper = name.upper()
    for key, mem, profile in _BASE_GPUS:
        if key in upper and (mem is None or memory_bytes < 45e9):
            return profile
    return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> dict[str, str]:
    """Clocks, power, temperature and throttle reasons of GPU 0 (reference Notes 3: record them)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    out: dict[str, str] = {}
    for field in _SMI_FIELDS:  # one by one: a field an old or new driver does not know costs only itself
        try:
            value = subprocess.run([exe, f"--query-gpu={field}", "--format=csv,noheader", "-i", "0"],
                                   capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        except (subprocess.SubprocessError, OSError):
            continue
        out[field] = value
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: torch.device, dtype: str, threads: int) -> dict[str, Any]:
    """The profile's ``device`` section for ``device`` measured in ``dtype`` with ``threads`` CPU threads."""
    versions = {"torch": torch.__version__, "python": platform.python_version(), "simtrain": _version("simtrain"),
                "transformers": _version("transformers"), "cuda": torch.version.cuda, "nccl": None}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        smi = _nvidia_smi()
        versions["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version()) if torch.cuda.is_available() else None
        return {"kind": "cuda", "name": props.name, "count": torch.cuda.device_count(), "dtype": dtype,
                "threads_per_process": threads, "base_gpu": base_gpu_for(props.name, props.total_memory),
                "memory_bytes": float(props.total_memory), "sm_count": props.multi_processor_count,
                "driver": smi.pop("driver_version", None), "clocks": smi, "versions": versions}
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"kind": "cpu", "name": _cpu_name(), "count": os.cpu_count() or 1, "dtype": dtype,
            "threads_per_process": threads, "base_gpu": None, "memory_bytes": float(pages), "driver": None,
            "clocks": {}, "versions": versions}


def fingerprint(desc: dict[str, Any]) -> str:
    """Device, dtype, threads and torch version: what a journal's measurements depend on."""
    return (f"{desc['kind']}:{desc['name']}:{desc['dtype']}:threads={desc['threads_per_process']}:"
            f"torch={desc['versions']['torch']}")
