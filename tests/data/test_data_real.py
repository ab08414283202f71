"""Real datasets from the offline root: loading, never writing the root, clear errors.

The root is ``$SECURE_FGL_DATA`` or ``<repo>/../shared/datasets``; tests skip when it is
absent.  The processing cache is a temporary directory (``$SECURE_FGL_CACHE``).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from secure_fgl.data import (
    DATASETS,
    DataError,
    chunk_partition,
    dataset_status,
    load_graph_dataset,
    load_node_dataset,
    make_federated,
    multi_dataset_partition,
)

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("SECURE_FGL_DATA") or REPO.parent / "shared" / "datasets").resolve()


def _has(*folders: str) -> bool:
    return all((ROOT / f / "raw").is_dir() for f in folders)


needs = lambda *f: pytest.mark.skipif(
    not _has(*f),
    reason=(  # noqa: E731
        f"real dataset(s) {', '.join(f)} not found under {ROOT}: set SECURE_FGL_DATA to the offline dataset root"
    ),
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fgl_cache")


@pytest.fixture(autouse=True)
def _cache_env(cache, monkeypatch):
    monkeypatch.setenv("SECURE_FGL_CACHE", str(cache))


def snapshot(root: Path, folders) -> dict:
    """(size, mtime_ns, mode) of every entry under the given folders, plus the folders."""
    out = {}
    for f in folders:
        for p in [root / f, *sorted((root / f).rglob("*"))]:
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


@needs("Cora")
def test_cora_public_split_and_attributes():
    before = snapshot(ROOT, ["Cora"])
    d = load_node_dataset("cora", ROOT)
    assert d.num_nodes == 2708 and d.num_classes == 7 and d.name == "Cora"
    assert d.binary_features is True
    assert [int(m.sum()) for m in (d.train_mask, d.val_mask, d.test_mask)] == [140, 500, 1000]
    assert snapshot(ROOT, ["Cora"]) == before  # root untouched
    assert not (ROOT / "Cora" / "processed").exists()


@needs("Computers")
def test_amazon_has_no_masks_and_gets_the_shchur_split():
    d = load_node_dataset("Computers", ROOT)
    assert d.num_classes == 10 and getattr(d, "train_mask", None) is None
    fp = make_federated("Computers", 3, "iid", split="public", data_root=ROOT)
    assert int(fp.graph.train_mask.sum()) == 20 * 10 and int(fp.graph.val_mask.sum()) == 30 * 10
    fg = make_federated("Computers", 3, "iid", split="fgssl", data_root=ROOT)
    assert sum(c.num_nodes for c in fg.clients) == d.num_nodes


@needs("Cora", "MUTAG")
def test_read_only_copy_is_never_written(tmp_path, cache):
    root = tmp_path / "ro_root"
    for f in ("Cora", "MUTAG"):
        shutil.copytree(ROOT / f / "raw", root / f / "raw")
    for p in [root, *root.rglob("*")]:  # chmod a-w everything
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = snapshot(root, ["Cora", "MUTAG"])
    own_cache = tmp_path / "cache"
    load_node_dataset("Cora", root, cache_dir=own_cache)
    load_graph_dataset("MUTAG", root, cache_dir=own_cache)
    load_node_dataset("Cora", root, cache_dir=own_cache)  # second load: cached
    assert snapshot(root, ["Cora", "MUTAG"]) == before
    assert sorted(p.name for p in root.iterdir()) == ["Cora", "MUTAG"]
    # the raw files were linked into the cache and PyG processed there
    link = own_cache / "processed" / "Cora" / "raw" / "ind.cora.x"
    assert link.is_symlink() and link.resolve() == (root / "Cora" / "raw" / "ind.cora.x").resolve()
    assert any((own_cache / "processed" / "Cora" / "processed").iterdir())
    for p in [root, *root.rglob("*")]:  # let pytest clean up
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


@needs("Cora")
def test_cache_follows_a_new_root(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for r in (a, b):
        shutil.copytree(ROOT / "Cora" / "raw", r / "Cora" / "raw")
    c = tmp_path / "cache"
    load_node_dataset("Cora", a, cache_dir=c)
    load_node_dataset("Cora", b, cache_dir=c)
    link = c / "processed" / "Cora" / "raw" / "ind.cora.x"
    assert link.resolve() == (b / "Cora" / "raw" / "ind.cora.x").resolve()


def test_missing_files_name_the_path(tmp_path):
    with pytest.raises(DataError) as err:
        load_node_dataset("CiteSeer", tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "CiteSeer" / "raw") in msg and "ind.citeseer.x" in msg
    assert "\n" not in msg
    with pytest.raises(DataError, match=str(tmp_path / "PROTEINS" / "raw")):
        load_graph_dataset("proteins", tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_unknown_and_wrong_task_names():
    with pytest.raises(DataError, match="unknown dataset"):
        load_node_dataset("cora2")
    with pytest.raises(DataError, match="graph-classification"):
        load_node_dataset("MUTAG")
    with pytest.raises(DataError, match="node-classification"):
        load_graph_dataset("Cora")
    with pytest.raises(DataError, match="no generator options"):
        load_node_dataset("Cora", num_nodes=5)


def test_dataset_status_lists_every_entry(tmp_path):
    rows = dataset_status(tmp_path)
    assert [r["name"] for r in rows] == list(DATASETS)
    by = {r["name"]: r for r in rows}
    assert by["sbm"]["present"] and by["csbm"]["present"]
    assert not by["Cora"]["present"] and by["Cora"]["path"] == str(tmp_path / "Cora" / "raw")
    assert {r["task"] for r in rows} == {"node", "graph"}
    if ROOT.is_dir():
        real = {r["name"]: r for r in dataset_status(ROOT)}
        assert real["Cora"]["present"] == _has("Cora")


def test_data_root_resolution(monkeypatch, tmp_path):
    from secure_fgl.data import resolve_data_root

    monkeypatch.setenv("SECURE_FGL_DATA", str(tmp_path))
    assert resolve_data_root(None) == tmp_path.resolve()
    assert resolve_data_root(tmp_path / "x") == (tmp_path / "x").resolve()
    monkeypatch.delenv("SECURE_FGL_DATA")
    assert resolve_data_root(None) == (Path.home() / ".cache/secure_fgl/datasets").resolve()


# ---------------------------------------------------------------------------
# graph classification (GCFL)
# ---------------------------------------------------------------------------
@needs("MUTAG")
def test_chunk_partition_mutag():
    fed = chunk_partition("MUTAG", 4, seed=0, data_root=ROOT)
    assert fed.num_clients == 4 and fed.setting == "chunk"
    sizes = [c.num_graphs for c in fed.clients]
    assert sum(sizes) == 188 and min(sizes) >= 188 // 4
    for c in fed.clients:
        assert c.num_features == 7 and c.num_classes == 2 and c.dataset == "MUTAG"
        assert len(c.val) >= 1 and len(c.test) >= 1
        assert abs(len(c.train) - 0.8 * c.num_graphs) <= 2
    again = chunk_partition("MUTAG", 4, seed=0, data_root=ROOT)
    assert [len(c.train) for c in again.clients] == [len(c.train) for c in fed.clients]
    with pytest.raises(DataError, match="too few"):
        chunk_partition("MUTAG", 100, data_root=ROOT)


@needs("MUTAG")
def test_chunk_partition_file_order_is_the_reference_chunking():
    """order='file' (GCFL's _randChunk): client k holds graphs [50k, 50k + 50) of the file."""
    sig = lambda g: (int(g.num_nodes), tuple(g.edge_index.flatten().tolist()))  # noqa: E731
    graphs = [sig(g) for g in load_graph_dataset("MUTAG", ROOT)]
    fed = chunk_partition("MUTAG", 3, seed=0, data_root=ROOT, order="file")
    for k, c in enumerate(fed.clients):
        held = [sig(g) for g in c.train + c.val + c.test]
        assert all(g in held for g in graphs[50 * k : 50 * k + 50])
    assert sum(c.num_graphs for c in fed.clients) == 188
    with pytest.raises(DataError, match="'shuffled' or 'file'"):
        chunk_partition("MUTAG", 3, data_root=ROOT, order="sorted")
    from secure_fgl.data.graph_build import make_graph_federated

    with pytest.raises(DataError, match="file-order chunks one TU dataset"):
        make_graph_federated("molecules", 7, data_root=ROOT, chunk_order="file")


@needs("MUTAG", "PTC_MR", "IMDB-BINARY")
def test_multi_dataset_features_as_gcfl():
    fed = multi_dataset_partition(["MUTAG", "PTC_MR", "IMDB-BINARY"], ROOT, seed=0)
    nf = {c.dataset: c.num_features for c in fed.clients}
    assert nf == {"MUTAG": 7, "PTC_MR": 18, "IMDB-BINARY": 136}  # one-hot degree, max 135
    imdb = fed.clients[2].train[0]
    assert torch.equal(imdb.x.sum(1), torch.ones(imdb.num_nodes))  # one-hot rows
    deg = multi_dataset_partition(["MUTAG"], ROOT, features="degree")
    assert deg.clients[0].num_features == 5  # MUTAG max degree 4
    with pytest.raises(DataError, match="group"):
        multi_dataset_partition("nonsense", ROOT)
