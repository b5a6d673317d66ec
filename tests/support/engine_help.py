"""What a real llama-server prints: the part of ``--help`` fitbox reads its flags from, and
the ``system_info`` line it reads the CPU's features from."""

from __future__ import annotations

HELP = """----- common params -----

-h,    --help, --usage                  print usage and exit
-c,    --ctx-size N                     size of the prompt context (default: 0)
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM, either an exact
                                        number, 'auto', or 'all' (default: auto)
-fit,  --fit [on|off]                   whether to adjust unset arguments to fit in device
--port PORT                             port to listen (default: 8080)
"""

SYSTEM_INFO = (
    "0.00.023.619 I cmn  common_param: system_info: n_threads = 2 (n_threads_batch = 2) / 2 | "
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
