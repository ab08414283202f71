"""The Flower executor on 127.0.0.1.

``--executor flower``: a SuperLink, SuperNodes and their site processes on 127.0.0.1
(subprocesses, killed in the fixture's teardown; insecure transport in the default test, TLS and
SuperNode authentication in the slow one).  The run through Flower is the local run: the same
accuracy and the same protocol bytes per tag; Flower's own framing is counted apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.flower import BIN, Federation, free_port, identity_keys, make_tls, serving, write_manifest
from support.runs import small

from protocols import DropoutError
from protocols.auth import SigningKey
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.flower_executor import FlowerExecutor

os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
pytest.importorskip("flwr", reason="the flower extra is not installed: pip install -e '.[flower]'")


def test_a_frame_crosses_flower_serialisation_unchanged():
    """A frame crosses flower serialisation unchanged.

    In process: the frames of a site's clients packed into one Flower message's content, deflated
    into Flower's objects and inflated again, are the same bytes; Flower's objects are counted
    apart from them.
    """
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    from secure_fgl.runtime import flower_app, wire

    frames = {k: wire.pack({"x": np.arange(k * 1000, dtype=np.float32), "tag": "fedavg/model"}) for k in (2, 5)}
    frames[7] = wire.pack({"x": np.arange(2_000_000, dtype=np.float32)})  # 8 MB: above Flower's 5 MB array chunks
    content = flower_app.pack({"method": "receive", "timeout": 5.0}, frames)
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(content).items()}
    assert flower_app.message_bytes(content) == sum(map(len, contents.values())) > sum(map(len, frames.values()))
    header, carried = flower_app.unpack(inflate_object_from_contents(content.object_id, contents))
    assert carried == frames and header == {"method": "receive", "timeout": 5.0}


@pytest.fixture
def federation(tmp_path, request):
    """A Flower federation for the settings in ``request.param``.

    ``request.param``: ``tls`` (TLS and SuperNode authentication), ``own-keys`` (each site started
    with its own identity key and the manifest ``fed.manifest`` it reads at set-up), ``two-sites``,
    ``attack-simulation`` (every site opted in) and/or ``flwr-clientapp`` (Flower's default isolation:
    a ``flwr-clientapp`` process per message, instead of the site process running its tasks).
    """
    features = getattr(request, "param", ())
    tls = make_tls(tmp_path / "tls", clients=4) if "tls" in features else None  # key 3: unregistered
    keys = identity_keys(tmp_path / "keys", 3) if "own-keys" in features else None
    manifest = tmp_path / "keys" / "manifest.json"
    fed = Federation(
        tmp_path,
        clients=3,
        tls=tls,
        site_args=(lambda k: ["--identity-key", str(keys[f"client{k}"]), "--manifest", str(manifest)]) if keys else (),
        site_flags=["--allow-attack-simulation"] if "attack-simulation" in features else (),
        sites=2 if "two-sites" in features else None,
        resident="flwr-clientapp" not in features,
    )
    fed.keys, fed.manifest = keys, manifest
    with serving(fed):
        yield fed


def same_run(local: dict, flower: dict) -> None:
    assert [r["train_loss"] for r in flower["rounds"]] == [r["train_loss"] for r in local["rounds"]]
    assert flower["final"]["test_acc"] == local["final"]["test_acc"]
    assert flower["comm"]["per_tag"] == local["comm"]["per_tag"]


@pytest.fixture(scope="module")
def keyed_federation(tmp_path_factory):
    """The default tests' federation, started once for the module.

    A SuperLink and three SuperNodes, one site each holding one client, each client with its own identity key
    and the manifest ``fed.manifest`` its site reads at every set-up; each run's ``flwr run`` reuses it.
    """
    folder = tmp_path_factory.mktemp("flower")
    keys = identity_keys(folder / "keys", 3)
    manifest = folder / "keys" / "manifest.json"
    fed = Federation(
        folder,
        clients=3,
        sites=3,
        site_args=lambda k: ["--identity-key", str(keys[f"client{k}"]), "--manifest", str(manifest)],
    )
    fed.keys, fed.manifest = keys, manifest
    with serving(fed):
        yield fed


def forbid_loading_data(monkeypatch) -> None:
    """Make loading the data fail in this process (the driver's)."""

    def forbidden(*_, **__):
        raise AssertionError("the driver of a Flower run loaded the data")

    for module in ("secure_fgl.experiment", "secure_fgl.runtime.build", "secure_fgl.runtime.partition"):
        monkeypatch.setattr(f"{module}.load_federation", forbidden)


def test_fedavg_mask_over_flower_is_the_local_run(keyed_federation, monkeypatch, tmp_path):
    """Fedavg mask over flower is the local run.

    Three clients on three sites (three SuperNodes); each client signs with its own identity
    key, pinned by the manifest built from the sites' public keys (no client key crosses Flower).
    The driver loads no data: its data folder does not exist and loading is forbidden in its
    process; the sites describe the federation.
    """
    federation = keyed_federation
    local = run_experiment(small("fedavg", "mask", executor="local", rounds=1), progress=False)
    cfg = write_manifest(
        federation.keys,
        small("fedavg", "mask", executor="flower", rounds=1, round_timeout=60, data_root=str(tmp_path / "no-data")),
        federation.manifest,
    )

    forbid_loading_data(monkeypatch)
    flower = run_experiment(cfg, progress=False)
    same_run(local, flower)
    fingerprints = {p: SigningKey.load(d / "identity.key").fingerprint for p, d in federation.keys.items()}
    for k in range(3):  # what each site's half accepted: the sites' own keys
        accepted = flower["key_fingerprints"][f"client{k}"]
        assert {p: accepted[p]["signing"] for p in fingerprints} == fingerprints
    runtime = flower["runtime"]
    assert runtime["executor"] == "flower" and runtime["sites"] == 3
    # the frames Flower carried are the runtime's, byte for byte; Flower's objects add their own framing
    stats, carried = runtime["stats"], runtime["flower"]
    assert carried["frame_bytes_up"] >= stats["bytes_from_clients"] > 0
    assert (
        carried["framing_overhead_bytes"]
        == (
            carried["message_bytes_down"]
            + carried["message_bytes_up"]
            - carried["frame_bytes_down"]
            - carried["frame_bytes_up"]
        )
        > 0
    )


@pytest.mark.slow
@pytest.mark.parametrize("federation", [("own-keys", "attack-simulation")], indirect=True, ids=["opted-in"])
def test_attacks_scored_on_the_opted_in_sites_reports_over_flower_are_the_local_runs(federation, monkeypatch):
    """Attacks scored on the opted-in sites' reports over Flower are the local run's.

    Three sites holding their clients' identity keys, every one opted in to attack simulation;
    the driver loads no data.  With ``--attacks``: the sites report their clients' parts, and the
    attacks scored on them (the membership candidates, the edges, the owners) give the local run's values.
    """
    kw = {"rounds": 1, "attacks": ["membership", "link_posterior"]}
    local = run_experiment(small("fedavg", "mask", executor="local", **kw), progress=False)
    no_data = str(federation.folder / "no-data")
    cfg = write_manifest(
        federation.keys,
        small("fedavg", "mask", executor="flower", round_timeout=60, data_root=no_data, **kw),
        federation.manifest,
    )
    forbid_loading_data(monkeypatch)
    flower = run_experiment(cfg, progress=False)
    same_run(local, flower)
    assert [e["name"] for e in flower["attacks"]] == ["transcript_audit", *kw["attacks"]]
    assert all(e["applicable"] for e in local["attacks"])
    assert [(e["name"], e["value"]) for e in flower["attacks"]] == [(e["name"], e["value"]) for e in local["attacks"]]


@pytest.mark.slow
@pytest.mark.parametrize("federation", [("tls", "flwr-clientapp")], indirect=True, ids=["tls+node-auth"])
def test_fedavg_mask_over_tls_with_registered_supernodes(federation):
    """Fedavg mask over tls with registered supernodes.

    TLS on every Flower connection (a CA made here), SuperNode authentication with registered
    keys: an impostor SuperNode with an unregistered key, whose site claims client 0, is not let in.
    The SuperNodes run Flower's default isolation (a ``flwr-clientapp`` process per message).
    """
    assert "--enable-supernode-auth" in (federation.folder / "superlink.argv").read_text()
    tls, sock = federation.tls, federation.folder / "impostor" / "site.sock"
    federation.spawn(
        "impostor-site",
        [sys.executable, "-m", "secure_fgl.runtime.flower_site", "--socket", str(sock), "--client", "0"],
    )
    impostor = federation.spawn(
        "impostor",
        [
            str(BIN / "flower-supernode"),
            "--superlink",
            f"127.0.0.1:{federation.port}",
            "--port",
            str(free_port()),
            "--root-certificates",
            tls["ca"],
            "--auth-supernode-private-key",
            tls["node_key"][3],
            "--node-config",
            f'site-socket="{sock}"',
            "--max-wait-time",
            "60",
        ],
    )
    assert impostor.wait(timeout=120) != 0
    assert "Failed to activate SuperNode" in (federation.folder / "impostor.log").read_text()
    local = run_experiment(small("fedavg", "mask", executor="local", rounds=1), progress=False)
    flower = run_experiment(small("fedavg", "mask", executor="flower", rounds=1, round_timeout=60), progress=False)
    same_run(local, flower)


def test_fedgcn_ckks_over_flower_is_the_local_run(keyed_federation):
    """Fedgcn ckks over flower is the local run.

    FedGCN's pre-training exchanges (the row ids relayed as channel ciphertext) and CKKS, on the
    same federation as the FedAvg run (a second ``flwr run``): the same protocol bytes per tag;
    losses equal within CKKS's fresh encryption noise, accuracy equal.
    """
    kw = {"options": {"row_order": "signature"}, "rounds": 1}
    local = run_experiment(small("fedgcn", "ckks", executor="local", **kw), progress=False)
    cfg = write_manifest(
        keyed_federation.keys,
        small("fedgcn", "ckks", executor="flower", round_timeout=120, **kw),
        keyed_federation.manifest,
    )
    flower = run_experiment(cfg, progress=False)
    assert [r["train_loss"] for r in flower["rounds"]] == pytest.approx(
        [r["train_loss"] for r in local["rounds"]], abs=1e-4
    )
    assert flower["final"]["test_acc"] == local["final"]["test_acc"]
    assert flower["comm"]["per_tag"] == local["comm"]["per_tag"]
    assert flower["runtime"]["executor"] == "flower" and flower["runtime"]["sites"] == 3


@pytest.mark.slow
def test_attacks_over_sites_that_did_not_opt_in_are_refused_for_want_of_ground_truth(federation):
    """Attacks over sites that did not opt in are refused for want of ground truth.

    No site serves attack simulation: the run goes on (the local run's), the transcript audit
    runs on the aggregator's view, and every attack, scored against ground truth no site
    reported, is reported not applicable, naming the site's flag.
    """
    kw = {"rounds": 1, "attacks": ["all"]}
    local = run_experiment(small("fedavg", "plain", executor="local", **kw), progress=False)
    with pytest.warns(RuntimeWarning, match="take no part in attack simulation"):
        flower = run_experiment(small("fedavg", "plain", executor="flower", round_timeout=60, **kw), progress=False)
    same_run(local, flower)
    audit, *attacks = flower["attacks"]
    assert audit["name"] == "transcript_audit" and audit["value"] == local["attacks"][0]["value"]
    assert [e["name"] for e in attacks] == [e["name"] for e in local["attacks"][1:]]
    assert all(not e["applicable"] and "--allow-attack-simulation" in e["reason"] for e in attacks)


class KillingFlowerExecutor(FlowerExecutor):
    """Kills the SuperNode of client ``victim`` (and its ClientApp processes) before ``method``."""

    def __init__(self, federation, victim: int, method: str, **kw):
        super().__init__(**kw)
        self.federation, self.victim, self.method = federation, victim, method

    def _call(self, method, requests):
        if method == self.method and self.victim in requests:
            self.federation.kill(f"supernode{self.victim}")
        return super()._call(method, requests)


@contextlib.contextmanager
def supernode_killed_at(federation, mode: str, method: str):
    """FedAvg in ``mode`` whose SuperNode 2 is killed when ``method`` is called: yields (protocol, strategy)."""
    cfg = small("fedavg", mode, executor="flower", rounds=1, round_timeout=40).validate()
    fed = load_federation(cfg)
    executor = KillingFlowerExecutor(federation, victim=2, method=method, round_timeout=40)
    try:
        protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
        yield protocol, make_strategy(cfg, fed, protocol, {}, executor)
    finally:
        executor.shutdown()


@pytest.mark.slow
def test_a_supernode_killed_inside_the_mask_exchange_is_a_dropout_with_recovery(federation):
    with supernode_killed_at(federation, "mask", "half:masked_upload") as (protocol, strategy):
        # Flower reports the message undeliverable (or the site silent until --round-timeout)
        with pytest.warns(RuntimeWarning, match=r"client\(s\) \[2\] lost in half:masked_upload of round \d+"):
            rows = [strategy.train_round(0)]
    assert [r["clients_lost"] for r in rows] == [1]
    assert protocol.last_included == (0, 1)  # the survivors' sum, by mask recovery


@pytest.mark.slow
def test_a_supernode_killed_before_its_ckks_mp_upload_stops_the_n_of_n_run_naming_the_client(federation):
    """A SuperNode killed before its ckks-mp upload stops the n-of-n run naming the client: nothing delivered."""
    with supernode_killed_at(federation, "ckks-mp", "half:upload") as (_, strategy):
        with pytest.raises(DropoutError, match=r"client\(s\) 2 did not send its upload; ckks-mp needs every client"):
            strategy.train_round(0)


@pytest.mark.slow
def test_resume_over_flower_continues_each_site_from_its_own_checkpoint(federation, tmp_path):
    """Resume over flower continues each site from its own checkpoint.

    Each site writes its checkpoint in its own state folder (not the driver's run folder) and
    resumes from it: the resumed run is the uninterrupted local one.
    """
    kw = {"save_best_model": False, "round_timeout": 60}
    full = run_experiment(small(executor="local", rounds=2, out=str(tmp_path / "a"), **kw), progress=False)
    run_experiment(small(executor="flower", rounds=1, out=str(tmp_path / "b"), **kw), progress=False)
    assert not list((tmp_path / "b").glob("clients/*.pt"))
    assert all(list((federation.folder / f"site{k}" / "state").glob(f"client{k}.*.pt")) for k in range(3))
    resumed = run_experiment(
        small(executor="flower", rounds=2, out=str(tmp_path / "b"), resume=True, **kw), progress=False
    )
    assert [r["train_loss"] for r in resumed["rounds"]] == [r["train_loss"] for r in full["rounds"]]


def crash_after_first_checkpoint(cfg, federation, out: Path, supernode: str | None = None) -> None:
    """Run the driver of ``cfg`` as ``secure-fgl run`` and SIGKILL it once its first checkpoint is on disk.

    ``supernode``: kill that SuperNode instead, and wait (at most 600 s) for the driver to stop with an error
    (its output in ``out.log``).
    """
    config = out.with_suffix(".json")
    config.write_text(json.dumps(cfg.to_dict()))
    with open(out.with_suffix(".log"), "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "secure_fgl.cli.main", "run", "--config", str(config), "--quiet"],
            env=federation.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while not (out / "checkpoint.pt").exists():
            assert proc.poll() is None, "the driver exited before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 600 s"
            time.sleep(0.05)
        if supernode is not None:
            federation.kill(supernode)
            assert proc.wait(timeout=600) != 0, "the run went on without the killed SuperNode's client"
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert not (out / "result.json").exists(), "the run finished before the crash"


@pytest.mark.slow
@pytest.mark.parametrize("federation", [("own-keys", "two-sites")], indirect=True, ids=["site-keys"])
def test_resume_with_site_held_keys_after_a_driver_crash_is_the_uninterrupted_run(federation, tmp_path):
    """Resume with site-held keys after a driver crash is the uninterrupted run.

    The sites hold their identity keys (two sites; one holds two clients, whose frames share a
    Flower message); the driver is killed after round 1's checkpoint and resumed with the same
    manifest and keys: each site starts its clients again from the manifest it verified and its
    own checkpoints, and the run ends as the uninterrupted local run.
    """
    kw = {"save_best_model": False, "rounds": 2}
    local = run_experiment(small("fedavg", "mask", executor="local", **kw), progress=False)
    out = tmp_path / "run"
    cfg = write_manifest(
        federation.keys,
        small("fedavg", "mask", executor="flower", round_timeout=120, out=str(out), **kw),
        federation.manifest,
    )
    crash_after_first_checkpoint(cfg, federation, out)
    resumed = run_experiment(dataclasses.replace(cfg, resume=True), progress=False)
    runtime = resumed["runtime"]
    assert [r["round"] for r in resumed["rounds"]] == [0, 1] and runtime["sites"] == 2
    assert runtime["flower"]["messages"] < runtime["stats"]["messages"]  # site 0's two clients share messages
    for key in ("train_loss", "test_acc", "val_acc"):
        assert [r[key] for r in resumed["rounds"]] == [r[key] for r in local["rounds"]], key
    assert resumed["final"]["test_acc"] == local["final"]["test_acc"]
    assert not list(out.glob("clients/*.pt"))  # the checkpoints stayed at the sites
    held = {k: list((federation.folder / f"site{k % 2}" / "state").glob(f"client{k}.*.pt")) for k in range(3)}
    assert all(held.values()), held
    fingerprints = {p: SigningKey.load(d / "identity.key").fingerprint for p, d in federation.keys.items()}
    for k in range(3):
        accepted = resumed["key_fingerprints"][f"client{k}"]
        assert {p: accepted[p]["signing"] for p in fingerprints} == fingerprints


@pytest.mark.slow
def test_resume_after_a_supernode_killed_mid_run_is_the_uninterrupted_run(federation, tmp_path):
    """Resume after a SuperNode killed mid-run is the uninterrupted run.

    ckks-mp (n-of-n): client 2's SuperNode is killed once round 1's checkpoint is written; round 2
    cannot complete without it and the driver stops with an error.  The SuperNode started again,
    ``--resume`` continues from round 1's checkpoints (the driver's and each site's) and ends as
    the uninterrupted local run.
    """
    kw = {"save_best_model": False, "rounds": 2}
    local = run_experiment(small("fedavg", "ckks-mp", executor="local", **kw), progress=False)
    out = tmp_path / "run"
    cfg = small("fedavg", "ckks-mp", executor="flower", round_timeout=60, out=str(out), **kw)
    crash_after_first_checkpoint(cfg, federation, out, supernode="supernode2")
    stopped = out.with_suffix(".log").read_text()
    assert re.search(r"secure-fgl: error: .*client\(s\) 2 did not send .* needs every client", stopped), stopped[-2000:]
    federation.restart("supernode2")
    resumed = run_experiment(dataclasses.replace(cfg, resume=True), progress=False)
    assert [r["round"] for r in resumed["rounds"]] == [0, 1]
    assert [r["train_loss"] for r in resumed["rounds"]] == pytest.approx(
        [r["train_loss"] for r in local["rounds"]], abs=1e-4
    )
    assert resumed["final"]["test_acc"] == local["final"]["test_acc"]


def _matrix() -> list[tuple[str, str]]:
    from secure_fgl.algorithms import SPECS

    return [(name, mode) for name, spec in SPECS.items() for mode in spec.modes]


@pytest.fixture(scope="module")
def shared_federation(tmp_path_factory):
    """One federation of three sites for the whole matrix.

    Each run starts and stops its runtimes on the same long-lived sites.
    """
    fed = Federation(tmp_path_factory.mktemp("flower-matrix"), clients=3)
    with serving(fed):
        yield fed


def matrix_cfg(algorithm: str, mode: str, **kw):
    from secure_fgl.algorithms import get_spec

    if get_spec(algorithm).task == "graph":
        from support.runs import graph_config

        return dataclasses.replace(graph_config(algorithm, mode, rounds=1, **kw), clients=3).validate()
    cfg = small(algorithm, mode, rounds=1, **kw)
    if algorithm == "gap":  # the central reference: one party holding the whole graph
        return dataclasses.replace(cfg, clients=1).validate()
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("algorithm,mode", _matrix())
def test_every_algorithm_and_mode_over_flower_is_the_local_run(shared_federation, algorithm, mode):
    """Every algorithm and mode over flower is the local run.

    Every algorithm x mode that runs on ``local`` runs over Flower with the same results: equal
    protocol bytes per tag; losses and accuracy equal (plain, mask) or within the fresh
    encryption noise of ckks and ckks-mp.
    """
    local = run_experiment(matrix_cfg(algorithm, mode, executor="local"), progress=False)
    flower = run_experiment(matrix_cfg(algorithm, mode, executor="flower", round_timeout=120), progress=False)
    assert flower["comm"]["per_tag"] == local["comm"]["per_tag"]
    exact = mode in ("plain", "mask")
    losses = [[r["train_loss"] for r in run["rounds"]] for run in (flower, local)]
    assert losses[0] == (losses[1] if exact else pytest.approx(losses[1], abs=1e-4))
    if exact:
        assert flower["final"]["test_acc"] == local["final"]["test_acc"]


@pytest.mark.slow
def test_fedgcn_mask_over_sites_holding_only_their_exported_parts_is_the_local_run(tmp_path):
    """FedGCN mask over sites holding only their exported parts is the local run.

    Each site process is started with its own client's file (``--client-data``, written by
    ``secure-fgl partition export``) and no dataset: the pre-training exchanges and a round of
    training give the local run's losses, accuracy and per-tag protocol bytes.
    """
    from secure_fgl.runtime.client_file import export_clients

    cfg = small("fedgcn", "mask", executor="local", rounds=1, save_best_model=False)
    files = export_clients(cfg.validate(), tmp_path / "parts")
    local = run_experiment(cfg, progress=False)
    fed = Federation(tmp_path / "flower", clients=3, site_args=lambda k: ["--client-data", str(files[k])])
    with serving(fed):
        flower = run_experiment(dataclasses.replace(cfg, executor="flower", round_timeout=120), progress=False)
    same_run(local, flower)
    assert flower["runtime"]["executor"] == "flower" and flower["runtime"]["sites"] == 3
