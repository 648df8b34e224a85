"""Memory-bound kernels against a public size sweep: never faster than measured at any size.

tile-ai/TileOPs#2033: an elementwise SiLU (read 2 bytes, write 2 per element) on an idle H200, CUPTI kernel
time (which leaves out the launch gap between kernels the model's ``kernel_launch_s`` holds).
"""

from __future__ import annotations

import pytest

from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu

#: elements -> measured kernel seconds (16 bytes a lane column of the issue's table)
H200_SILU = {268e6: 261.9e-6, 29.4e6: 30.37e-6, 8.4e6: 10.40e-6, 4.2e6: 6.10e-6}


@pytest.mark.parametrize("elements", sorted(H200_SILU))
def test_memory_op_is_never_faster_than_the_measured_sweep(elements: float) -> None:
    gpu = load_gpu("h200")
    t = ComputeCostModel(gpu, "bf16").memory_op("act", 4.0 * elements).time_s
    assert t == pytest.approx(4.0 * elements / (gpu.hbm_Bps * gpu.memory_op_efficiency) + gpu.kernel_launch_s)
    assert t >= H200_SILU[elements]


def test_memory_op_time_grows_with_bytes_at_the_asymptotic_rate() -> None:
    cost = ComputeCostModel(load_gpu("h100-sxm"), "bf16")
    sizes = [2.0**k for k in range(10, 34)]
    times = [cost.memory_op("act", b).time_s for b in sizes]
    assert times == sorted(times)
    # the measured sweep's slope, 0.88 of peak, bounds the model's from above
    slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
    assert 1.0 / slope < 0.88 * cost.gpu.hbm_Bps
