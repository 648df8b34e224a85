"""The hardware-neutral program: ops, layer kernels, saved bytes, FLOPs, CPU offload."""
