"""Dataset registry and offline-safe loaders.

Real datasets live under a *data root* in the PyTorch Geometric raw layout
(``<root>/Cora/raw/ind.cora.x`` ...).  That root may be read-only and shared, so it is
**never written to**: the raw files are symlinked (copied where symlinks are impossible)
into a writable cache ``<cache>/processed/<Folder>/raw`` and PyG writes its
``processed/`` folder next to them.  ``<cache>`` is ``$SECURE_FGL_CACHE`` or
``~/.cache/secure_fgl``.

Missing raw files raise :class:`DataError` at once, naming the exact folder the files must
be put in; PyG's download is used only with ``allow_download=True`` (and then downloads
into the cache, not into the data root).

Datasets: Planetoid Cora/CiteSeer/PubMed (Yang et al., 2016; public split masks kept),
Amazon Computers/Photo and Coauthor CS/Physics (Shchur et al., 2018; no masks -- the
splitters make them), WikiCS (Mernyei & Cangea, 2020), the 13 TU graph-classification sets
of GCFL (Xie et al., 2021), and the synthetic ``sbm``, ``csbm`` and ``csbm-fed``.
IMDB-BINARY, IMDB-MULTI and COLLAB have no node features; as in GCFL's ``setupGC.py`` they
get one-hot node degrees (``OneHotDegree(max_degree, cat=False)``; GCFL hard-codes
135 / 88 / 491, here the maximum degree is measured on the data).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DataError
from .safe_files import restricted_pickle, verify_checksums

if TYPE_CHECKING:  # the registry and its status answer without torch (secure-fgl datasets)
    import torch
    from torch_geometric.data import Data

__all__ = [
    "DatasetInfo",
    "DATASETS",
    "get_dataset_info",
    "resolve_data_root",
    "resolve_cache_dir",
    "load_node_dataset",
    "load_graph_dataset",
    "dataset_status",
]

ENV_DATA = "SECURE_FGL_DATA"
ENV_CACHE = "SECURE_FGL_CACHE"


# ---------------------------------------------------------------------------
# roots
# ---------------------------------------------------------------------------
def resolve_data_root(data_root: str | os.PathLike | None = None) -> Path:
    """The data root: the argument, else ``$SECURE_FGL_DATA``, else ``~/.cache/secure_fgl/datasets``.

    Nothing is created.
    """
    if data_root is not None and str(data_root) != "":
        return Path(data_root).expanduser().resolve()
    env = os.environ.get(ENV_DATA)
    if env:
        return Path(env).expanduser().resolve()
    return (Path.home() / ".cache" / "secure_fgl" / "datasets").resolve()


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The writable cache: the argument, else ``$SECURE_FGL_CACHE``, else ``~/.cache/secure_fgl``."""
    if cache_dir is not None and str(cache_dir) != "":
        return Path(cache_dir).expanduser().resolve()
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser().resolve()
    return (Path.home() / ".cache" / "secure_fgl").resolve()


# ---------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetInfo:
    """One registry entry.

    ``folder``/``files``: what must exist under the data root (``<root>/<folder>/<file>``);
    ``archive``: an alternative compressed copy (relative to the root) unpacked into the cache;
    ``loader``: ``loader(info, cache_root, allow_download, **kwargs)`` -> Data / Dataset.
    """

    name: str
    task: str  # 'node' | 'graph'
    loader: Callable[..., Any] = field(repr=False, compare=False)
    folder: str | None = None
    files: tuple[str, ...] = ()
    archive: str | None = None
    featureless: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def synthetic(self) -> bool:
        """Whether the dataset is generated (it has no folder)."""
        return self.folder is None

    def expected_dir(self, data_root: Path) -> Path | None:
        """The folder its raw files must be in under ``data_root`` (None for a synthetic dataset)."""
        return None if self.folder is None else data_root / self.folder / "raw"


def _norm(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def _pyg_load(cls: Any, info: DatasetInfo, root: Path, **kw: Any) -> Any:
    return cls(root=str(root), name=info.folder, **kw)


def _load_planetoid(info: DatasetInfo, root: Path, allow_download: bool) -> Data:
    from torch_geometric.datasets import Planetoid

    with restricted_pickle():  # the raw files are pickles: no code may run
        return _pyg_load(Planetoid, info, root)[0]


def _load_amazon(info: DatasetInfo, root: Path, allow_download: bool) -> Data:
    from torch_geometric.datasets import Amazon

    return _pyg_load(Amazon, info, root)[0]


def _load_coauthor(info: DatasetInfo, root: Path, allow_download: bool) -> Data:
    from torch_geometric.datasets import Coauthor

    return _pyg_load(Coauthor, info, root)[0]


def _load_wikics(info: DatasetInfo, root: Path, allow_download: bool) -> Data:
    from torch_geometric.datasets import WikiCS

    data = WikiCS(root=str(root / info.folder), is_undirected=True)[0]
    # WikiCS ships 20 train/val splits and one test mask: the first split is the public one.
    if data.train_mask.dim() == 2:
        data.train_mask = data.train_mask[:, 0].contiguous()
        data.val_mask = data.val_mask[:, 0].contiguous()
    return data


def _max_degree(dataset: Any) -> int:
    from torch_geometric.utils import degree

    best = 0
    for g in dataset:
        if g.edge_index.numel():
            best = max(best, int(degree(g.edge_index[0], g.num_nodes).max()))
    return best


def _load_tu(info: DatasetInfo, root: Path, allow_download: bool) -> Any:
    from torch_geometric.datasets import TUDataset
    from torch_geometric.transforms import OneHotDegree

    ds = _pyg_load(TUDataset, info, root)
    if info.featureless or ds.num_node_features == 0:
        # GCFL (setupGC.py): one-hot degree features, replacing the (absent) x.
        max_deg = _max_degree(ds)
        ds.transform = OneHotDegree(max_deg, cat=False)
        ds.feature_note = f"one-hot degree (OneHotDegree({max_deg}), as GCFL)"
    else:
        ds.feature_note = "TU node labels (one-hot), use_node_attr=False as GCFL"
    return ds


def _synthetic_loader(generator: str) -> Callable[..., Data]:
    """A loader calling ``secure_fgl.data.synthetic.<generator>`` (imported when a graph is made)."""

    def load(info: DatasetInfo, root: Path | None, allow_download: bool, **kw: Any) -> Data:
        from . import synthetic

        try:
            return getattr(synthetic, generator)(**kw)
        except TypeError as exc:  # unknown keyword
            raise DataError(f"{info.name}: {exc}; see help(secure_fgl.data.{generator}) for its options") from None

    return load


_PLANETOID = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def _planetoid(name: str) -> DatasetInfo:
    return DatasetInfo(name, "node", _load_planetoid, name, tuple(f"ind.{name.lower()}.{s}" for s in _PLANETOID))


def _tu(name: str, featureless: bool = False, archive: str | None = None) -> DatasetInfo:
    files = tuple(f"{name}_{s}.txt" for s in ("A", "graph_indicator", "graph_labels"))
    return DatasetInfo(name, "graph", _load_tu, name, files, archive=archive, featureless=featureless)


_ENTRIES: list[DatasetInfo] = [
    _planetoid("Cora"),
    _planetoid("CiteSeer"),
    _planetoid("PubMed"),
    DatasetInfo(
        "Computers",
        "node",
        _load_amazon,
        "Computers",
        ("amazon_electronics_computers.npz",),
        aliases=("amazon-computers",),
    ),
    DatasetInfo("Photo", "node", _load_amazon, "Photo", ("amazon_electronics_photo.npz",), aliases=("amazon-photo",)),
    DatasetInfo("CS", "node", _load_coauthor, "CS", ("ms_academic_cs.npz",), aliases=("coauthor-cs",)),
    DatasetInfo("Physics", "node", _load_coauthor, "Physics", ("ms_academic_phy.npz",), aliases=("coauthor-physics",)),
    DatasetInfo("WikiCS", "node", _load_wikics, "WikiCS", ("data.json",), aliases=("wiki-cs",)),
    *[_tu(n) for n in ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1", "ENZYMES", "DD", "PROTEINS")],
    _tu("COLLAB", featureless=True, archive="_archives/COLLAB.tar.xz"),
    _tu("IMDB-BINARY", featureless=True),
    _tu("IMDB-MULTI", featureless=True),
    DatasetInfo("sbm", "node", _synthetic_loader("sbm_binary")),
    DatasetInfo("csbm", "node", _synthetic_loader("contextual_sbm")),
    DatasetInfo("csbm-fed", "node", _synthetic_loader("contextual_sbm_federated"), aliases=("csbm-fedspray",)),
]

#: name -> DatasetInfo, keyed by the canonical name (look-ups are case-insensitive).
DATASETS: dict[str, DatasetInfo] = {e.name: e for e in _ENTRIES}

#: the data groups of GCFL (``setupGC.prepareData_multiDS``): ``--dataset GROUP``, one client per dataset
GCFL_GROUPS: dict[str, tuple[str, ...]] = {
    "molecules": ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1"),
    "small": ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "ENZYMES", "DD", "PROTEINS"),
    "biochem": ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1", "ENZYMES", "DD", "PROTEINS"),
    "mix": (
        "MUTAG",
        "BZR",
        "COX2",
        "DHFR",
        "PTC_MR",
        "AIDS",
        "NCI1",
        "ENZYMES",
        "DD",
        "PROTEINS",
        "COLLAB",
        "IMDB-BINARY",
        "IMDB-MULTI",
    ),
}
#: the built-in graph-classification generator (:mod:`.synthetic_graphs`)
SYNTHETIC_GRAPHS = "synthetic-graphs"
_LOOKUP: dict[str, DatasetInfo] = {}
for _e in _ENTRIES:
    for _k in (_e.name, *_e.aliases):
        _LOOKUP[_norm(_k)] = _e


def get_dataset_info(name: str) -> DatasetInfo:
    """The registry entry for ``name`` (case-insensitive, ``_`` == ``-``)."""
    info = _LOOKUP.get(_norm(name))
    if info is None:
        raise DataError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")
    return info


# ---------------------------------------------------------------------------
# staging raw files into the cache
# ---------------------------------------------------------------------------
def _raw_present(info: DatasetInfo, data_root: Path) -> bool:
    raw = info.expected_dir(data_root)
    return raw is not None and all((raw / f).is_file() for f in info.files)


def _archive_path(info: DatasetInfo, data_root: Path) -> Path | None:
    if info.archive is None:
        return None
    path = data_root / info.archive
    return path if path.is_file() else None


def _is_present(info: DatasetInfo, data_root: Path) -> bool:
    return info.synthetic or _raw_present(info, data_root) or _archive_path(info, data_root) is not None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An advisory inter-process lock (no-op where ``fcntl`` is missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.symlink(src, dst)
    except OSError:  # pragma: no cover - no symlink support
        shutil.copy2(src, dst)


def _extract_archive(archive: Path, dst_root: Path, folder: str) -> None:
    """Unpack ``archive`` (holding ``<folder>/raw/*``) into ``dst_root`` atomically."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder}-", dir=dst_root))
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).parts[:2] == (folder, "raw")]
            kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, members=members, **kw)
        target = dst_root / folder / "raw"
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp / folder / "raw", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stage(info: DatasetInfo, data_root: Path, cache_root: Path, allow_download: bool) -> None:
    """Make ``cache_root/<folder>/raw`` mirror the data root's raw files (symlinks), or unpack the archive there.

    The data root is only read.
    """
    assert info.folder is not None
    dst_dir = cache_root / info.folder
    dst_raw = dst_dir / "raw"
    marker = dst_dir / "SOURCE"
    if _raw_present(info, data_root):
        src_raw = info.expected_dir(data_root).resolve()
        source = str(src_raw)
    elif _archive_path(info, data_root) is not None:
        source = str(_archive_path(info, data_root).resolve())
    elif allow_download:
        source = "download"
    else:
        raise DataError(
            f"{info.name}: raw files not found; put {', '.join(info.files)} in "
            f"{info.expected_dir(data_root)} (or pass --data-root / set ${ENV_DATA}; from Python, "
            "allow_download=True lets PyG download it)"
        )
    # a cache made from another source is stale: rebuild it (it is ours to delete)
    if marker.exists() and marker.read_text().strip() != source:
        shutil.rmtree(dst_dir)
    dst_raw.mkdir(parents=True, exist_ok=True)
    if source == "download":
        pass  # PyG downloads into dst_raw
    elif source.endswith((".tar.xz", ".tar.gz", ".tgz", ".tar")):
        if not all((dst_raw / f).is_file() for f in info.files):
            _extract_archive(Path(source), cache_root, info.folder)
    else:
        for src in sorted(Path(source).iterdir()):
            dst = dst_raw / src.name
            if src.is_file() and not (dst.exists() or dst.is_symlink()):
                _link_or_copy(src, dst)
    marker.write_text(source + "\n")


def _load_real(
    info: DatasetInfo, data_root: str | os.PathLike | None, allow_download: bool, cache_dir: str | os.PathLike | None
) -> Any:
    root = resolve_data_root(data_root)
    cache_root = resolve_cache_dir(cache_dir) / "processed"
    if not _is_present(info, root) and not allow_download:
        _stage(info, root, cache_root, allow_download)  # raises the DataError
    if _raw_present(info, root):
        verify_checksums(info.folder, info.expected_dir(root))
    with _locked(cache_root / f".{info.folder}.lock"):
        _stage(info, root, cache_root, allow_download)
        return info.loader(info, cache_root, allow_download)


def _is_binary(x: torch.Tensor) -> bool:
    return bool(((x == 0) | (x == 1)).all())


# ---------------------------------------------------------------------------
# public loaders
# ---------------------------------------------------------------------------
def load_node_dataset(
    name: str,
    data_root: str | os.PathLike | None = None,
    allow_download: bool = False,
    cache_dir: str | os.PathLike | None = None,
    **synthetic_kwargs: Any,
) -> Data:
    """One node-classification graph as a ``Data``.

    Its ``num_classes``, ``name`` and ``binary_features`` are set.

    Planetoid graphs keep their public ``train/val/test`` masks; Amazon/Coauthor have none
    (use a ``split`` other than ``'public'``).  ``synthetic_kwargs`` go to the generator of a
    synthetic dataset (``sbm``: :func:`~secure_fgl.data.synthetic.sbm_binary`, ``csbm``:
    :func:`~secure_fgl.data.synthetic.contextual_sbm`, ``csbm-fed``:
    :func:`~secure_fgl.data.synthetic.contextual_sbm_federated`).
    """
    info = get_dataset_info(name)
    if info.task != "node":
        raise DataError(
            f"{info.name} is a graph-classification dataset: use "
            "load_graph_dataset / a graph-level algorithm (e.g. gcfl)"
        )
    if info.synthetic:
        return info.loader(info, None, allow_download, **synthetic_kwargs)
    if synthetic_kwargs:
        raise DataError(
            f"{info.name} is a real dataset and takes no generator options "
            f"({', '.join(synthetic_kwargs)}): drop them or use 'sbm'/'csbm'"
        )
    data = _load_real(info, data_root, allow_download, cache_dir)
    data.y = data.y.view(-1).long()
    data.num_classes = int(data.y.max()) + 1
    data.name = info.name
    data.binary_features = _is_binary(data.x)
    return data


def load_graph_dataset(
    name: str,
    data_root: str | os.PathLike | None = None,
    allow_download: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> Any:
    """A TU graph-classification dataset (``torch_geometric.datasets.TUDataset``).

    Featureless sets (IMDB-BINARY, IMDB-MULTI, COLLAB) get one-hot degree features, as
    GCFL does; ``dataset.feature_note`` says which features were used.
    """
    info = get_dataset_info(name)
    if info.task != "graph":
        raise DataError(f"{info.name} is a node-classification dataset: use load_node_dataset")
    return _load_real(info, data_root, allow_download, cache_dir)


def dataset_status(data_root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """For ``secure-fgl datasets``: ``[{name, task, present, path}]`` for every registry entry.

    ``path`` is the folder the raw files must be in (or the archive found instead);
    synthetic datasets are always present, with ``path=None``.
    """
    root = resolve_data_root(data_root)
    rows = []
    for info in DATASETS.values():
        if info.synthetic:
            rows.append(dict(name=info.name, task=info.task, present=True, path=None))
            continue
        present = _raw_present(info, root)
        path = info.expected_dir(root)
        if not present and _archive_path(info, root) is not None:
            present, path = True, _archive_path(info, root)
        rows.append(dict(name=info.name, task=info.task, present=present, path=str(path)))
    return rows
