"""lmsp: a local model service speaking LMSP 1.0."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lmsp")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = ["__version__"]
