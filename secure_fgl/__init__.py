"""secure_fgl: federated graph learning in secure modes, with the leakage of every exchange measured."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("secure-fgl")
except _metadata.PackageNotFoundError:  # a source checkout that was not pip-installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
