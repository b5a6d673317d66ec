"""The placement core: pure decisions over a complete snapshot. Stdlib only; no I/O, clocks,
logging, threads or environment. Same input, same output."""
