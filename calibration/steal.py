"""CPU time the hypervisor stole from this machine while something ran (Linux ``/proc/stat``).

On a virtual machine whose cores are shared with other guests, a wall-clock measurement taken while
the host ran someone else on "our" cores is slower for a reason outside the workload: the kernel
counts that time in the 8th column (``steal``) of the ``cpu`` line of ``/proc/stat`` (proc(5)). The
fraction of all CPU time stolen during a measurement says whether to trust it.
"""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
STEAL_COLUMN = 7  # user nice system idle iowait irq softirq steal ... (proc(5)), 0-based after "cpu"
#: A measurement during which the hypervisor stole more of the CPU time than this is taken again
MAX_STEAL_FRACTION = 0.02


def cpu_ticks(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs since boot; None where ``/proc/stat`` is unreadable."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu" or len(first) <= STEAL_COLUMN + 1:
        return None
    ticks = [int(x) for x in first[1:]]
    # guest time (columns 9-10) is already counted in user / nice (proc(5)): leave it out of the total
    return ticks[STEAL_COLUMN], sum(ticks[:8])


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """Stolen share of all CPU time between two ``cpu_ticks`` readings (0.0 when unknown)."""
    if before is None or after is None or after[1] <= before[1]:
        return 0.0
    return max(after[0] - before[0], 0) / (after[1] - before[1])
