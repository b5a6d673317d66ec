"""fitbox: a single-box, evict-to-fit, OpenAI-compatible front door for local models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fitbox")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
