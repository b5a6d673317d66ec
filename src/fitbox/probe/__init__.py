"""What the box has: host memory and cores, GPUs (NVML or a declared simulated inventory)."""
