"""Reading public dataset files without trusting them.

* **Planetoid pickles** (``ind.cora.x`` ...) are Python pickles by definition, and a pickle
  can call any importable function while it loads.  :class:`PlanetoidUnpickler` resolves
  only the globals the format needs — numpy array reconstruction and dtypes, scipy sparse
  matrices, the builtin containers/numbers, ``collections.defaultdict`` — so a crafted file
  raises a one-line :class:`DataError` instead of running code.  :func:`restricted_pickle`
  makes PyG's Planetoid reader use it.
* **Checksums**: ``SHA256SUMS`` in this package lists the canonical SHA-256 of the public
  raw files (a checksum list *beside* the data proves nothing: whoever swaps a file swaps
  the list).  :func:`verify_checksums` warns on a mismatch (a re-packaged but honest copy
  stays usable; the restricted unpickler is the actual protection).
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import types
import warnings
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from .errors import DataError

_BUILTINS = {
    "list",
    "dict",
    "set",
    "frozenset",
    "tuple",
    "int",
    "float",
    "bool",
    "str",
    "bytes",
    "bytearray",
    "complex",
    "slice",
    "range",
}
_SPARSE = {"csr_matrix", "csc_matrix", "coo_matrix"}
#: module -> names a Planetoid pickle may resolve
ALLOWED_GLOBALS: dict[str, set[str]] = {
    "builtins": _BUILTINS,
    "__builtin__": _BUILTINS,
    "collections": {"defaultdict", "OrderedDict"},
    "_codecs": {"encode"},  # how protocol-2 pickles written by Python 3 carry bytes
    "numpy": {"ndarray", "dtype"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "scipy.sparse.csr": _SPARSE,
    "scipy.sparse._csr": _SPARSE,
    "scipy.sparse.csc": _SPARSE,
    "scipy.sparse._csc": _SPARSE,
    "scipy.sparse.coo": _SPARSE,
    "scipy.sparse._coo": _SPARSE,
}


class PlanetoidUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS`."""

    def find_class(self, module: str, name: str):
        """Resolve only the globals a Planetoid file needs (``ALLOWED_GLOBALS``).

        Raises:
            DataError: the pickle references any other global.
        """
        if name not in ALLOWED_GLOBALS.get(module, ()):
            raise DataError(
                f"refusing to load {getattr(self, 'path', 'a pickle')}: it references {module}.{name}, "
                "which a Planetoid file never needs (a crafted or corrupt file?); replace it with the "
                "public original"
            )
        return super().find_class(module, name)


def load_pickle(file, *, path: str = "a pickle", encoding: str = "latin1"):
    """Unpickle ``file`` (an open binary file) with :class:`PlanetoidUnpickler`.

    Any failure is a one-line :class:`DataError`.
    """
    unpickler = PlanetoidUnpickler(file, encoding=encoding)
    unpickler.path = path
    try:
        return unpickler.load()
    except DataError:
        raise
    except Exception as exc:  # truncated/corrupt bytes raise many types inside pickle
        raise DataError(
            f"cannot read {path}: not a valid Planetoid pickle ({type(exc).__name__}: "
            f"{str(exc)[:120]}); replace it with the public original"
        ) from None


@contextlib.contextmanager
def restricted_pickle() -> Iterator[None]:
    """Make PyG's Planetoid reader unpickle with :func:`load_pickle` while active.

    The reader is ``torch_geometric.io.planetoid``.
    """
    import torch_geometric.io.planetoid as planetoid_io

    shim = types.SimpleNamespace(
        load=lambda f, encoding="latin1": load_pickle(
            f, path=getattr(f, "path", getattr(f, "name", "a Planetoid file")), encoding=encoding
        )
    )
    original = planetoid_io.pickle
    planetoid_io.pickle = shim
    try:
        yield
    finally:
        planetoid_io.pickle = original


def canonical_checksums() -> dict[str, str]:
    """``{"Cora/raw/ind.cora.x": sha256 hex, ...}`` shipped with the package."""
    text = resources.files(__package__).joinpath("SHA256SUMS").read_text()
    return {rel: digest for digest, rel in (line.split(None, 1) for line in text.splitlines() if line.strip())}


def verify_checksums(folder: str, raw_dir: Path) -> list[str]:
    """Warn (``UserWarning``) for each file of ``raw_dir`` whose SHA-256 differs from the canonical one.

    The canonical checksum is that of ``<folder>/raw/<name>``.

    Returns:
        The names that differ.
    """
    known = canonical_checksums()
    bad = []
    for path in sorted(Path(raw_dir).iterdir()):
        want = known.get(f"{folder}/raw/{path.name}")
        if want is None or not path.is_file():
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != want:
            bad.append(path.name)
    if bad:
        warnings.warn(
            f"{folder}: {', '.join(bad)} differ from the public files' SHA-256 (secure_fgl/data/SHA256SUMS);"
            " results may not be comparable — replace them with the public originals",
            stacklevel=3,
        )
    return bad
