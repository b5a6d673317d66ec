"""The generic task child: stdlib HTTP around one runner module (whisper.py, piper.py, …),
run in the runner's own environment, never imported by fitbox's venv (engines/tasks.py)."""
