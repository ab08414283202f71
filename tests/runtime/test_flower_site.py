"""A site's client process for the Flower deployment, in process.

A site's client process for the Flower deployment (``secure_fgl/runtime/flower_site.py``),
in process: the adversary is the aggregator, which writes every request a site receives (the
set-up frame's settings included).  It gets no data in the set-up frame, no answer to a request
off the public schedule, and no file written outside the site's state folder.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

import numpy as np
import pytest
from support.flower import identity_keys, write_manifest
from support.runs import small

from protocols import ProtocolError
from protocols.auth import SigningKey
from protocols.errors import ConfigurationError, KeySubstitutionError, MalformedMessageError
from secure_fgl.config import ConfigError
from secure_fgl.experiment import load_federation
from secure_fgl.runtime import local_socket, wire
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import Executor, LocalExecutor
from secure_fgl.runtime.flower_executor import (
    SiteError,
    _refusal,
    check_attack_simulation,
    check_site_keys,
    check_sites_serve,
    needs_of,
    site_federation,
    strip_data,
)
from secure_fgl.runtime.flower_site import Site, SiteRefusal, answer


class FrameKeeper(LocalExecutor):
    """Keeps the set-up frames the strategy hands out."""

    def start(self, frames):
        self.frames = dict(frames)
        super().start(frames)


@pytest.fixture(scope="module")
def planned():
    cfg = small("fedavg", "mask", executor="local", rounds=1, attacks=["all"]).validate()
    executor = FrameKeeper()
    protocol = make_runtime_protocol(cfg, 3, executor)
    make_strategy(cfg, load_federation(cfg), protocol, {}, executor)
    return executor


def test_the_setup_frame_carries_a_digest_not_the_data_and_the_site_loads_the_same_partition(planned, tmp_path):
    frame = strip_data(planned.frames[1])
    fields = wire.unpack(frame)
    assert "data_digest" in fields and not {"x", "y", "edge_index", "global_ids"} & set(fields)
    assert len(frame) < len(planned.frames[1]) / 10
    site = Site([1], None, tmp_path)
    assert site.handle("start", 1, frame) == b""
    here, there = site.runtimes[1].data, planned.runtimes[1].data
    assert np.array_equal(here.x.numpy(), there.x.numpy()) and np.array_equal(here.y.numpy(), there.y.numpy())
    other = wire.pack({**fields, "data_digest": "0" * 64})  # not the partition the run planned
    with pytest.raises(ValueError, match="digest mismatch"):
        Site([1], None, tmp_path).handle("start", 1, other)


def test_a_graph_clients_setup_frame_carries_no_graphs_and_the_site_loads_its_own(tmp_path):
    from support.runs import graph_config

    from secure_fgl.algorithms import get_spec

    cfg = dataclasses.replace(graph_config("gc-fedavg", "mask", rounds=1), clients=3).validate()
    executor, options = FrameKeeper(), get_spec(cfg.algorithm).options()
    make_strategy(cfg, load_federation(cfg), make_runtime_protocol(cfg, 3, executor), options, executor)
    frame = strip_data(executor.frames[1])
    fields = wire.unpack(frame)
    assert "data_digest" in fields and not [name for name in fields if "/" in name]
    site = Site([1], None, tmp_path)
    site.handle("start", 1, frame)
    here, there = site.runtimes[1].data, executor.runtimes[1].data
    for split in ("train", "val", "test"):
        mine, planned = getattr(here, split), getattr(there, split)
        assert len(mine) == len(planned) > 0
        assert all(a.x.equal(b.x) and a.edge_index.equal(b.edge_index) for a, b in zip(mine, planned))
    other = wire.pack({**fields, "data_digest": "0" * 64})
    with pytest.raises(ValueError, match="digest mismatch"):
        Site([1], None, tmp_path).handle("start", 1, other)


def facts_of(sites: dict, cfg) -> dict[int, bytes]:
    """Each site's reply to the driver's ``facts`` request for run ``cfg``."""
    request = wire.pack({"config": cfg.to_dict()})
    return {k: site.handle("facts", k, request) for k, site in sites.items()}


@pytest.mark.parametrize("algorithm", ["fedavg", "gc-fedavg"])
def test_the_sites_describe_the_federation_so_the_driver_loads_no_data(algorithm, tmp_path):
    """The sites describe the federation, so the driver loads no data.

    The public facts the sites report (each from the partition it loads) are those of the
    driver-loaded federation, and the set-up frames built from them are byte for byte what a
    driver holding the data would send (its frames without their data); the sites' runtimes start from them.
    """
    from support.runs import graph_config

    from secure_fgl.algorithms import get_spec
    from secure_fgl.runtime.facts import GraphFacts, PublicFacts

    graph = get_spec(algorithm).task == "graph"
    cfg = (
        dataclasses.replace(graph_config(algorithm, "mask", rounds=1), clients=3).validate()
        if graph
        else small(algorithm, "mask", executor="local", rounds=1).validate()
    )
    options, fed = get_spec(algorithm).options(), load_federation(cfg)
    described = site_federation(facts_of({k: Site([k], None, tmp_path / f"site{k}") for k in range(3)}, cfg), {})
    assert described.facts == (GraphFacts if graph else PublicFacts).of(fed) and described.num_clients == 3
    planned, from_sites = FrameKeeper(), FrameKeeper()
    protocol = make_runtime_protocol(cfg, 3, planned)
    make_strategy(cfg, fed, protocol, options, planned)
    make_strategy(cfg, described, protocol, options, from_sites)
    assert {k: strip_data(f) for k, f in planned.frames.items()} == from_sites.frames
    here, there = from_sites.runtimes[2].data, planned.runtimes[2].data  # loaded at the site / handed out
    if graph:
        assert all(a.x.equal(b.x) for s in ("train", "test") for a, b in zip(getattr(here, s), getattr(there, s)))
    else:
        assert here.x.equal(there.x) and here.edge_index.equal(there.edge_index)


def test_facts_not_signed_by_the_sites_key_or_that_disagree_are_refused(tmp_path):
    """Facts not signed by the site's key, or that disagree, are refused.

    A site holding its own key signs its facts: a statement the aggregator's side altered, or
    signed by another key than the one its site announced, is refused; so are sites describing
    different federations.
    """
    cfg = small("fedavg", "mask", executor="local", rounds=1).validate()
    keys = {k: SigningKey() for k in range(2)}
    sites = {k: Site([k], None, tmp_path, identities={k: keys[k]}, manifest=tmp_path / "m.json") for k in range(2)}
    replies = facts_of(sites, cfg)
    fingerprints = {k: key.fingerprint for k, key in keys.items()}
    assert site_federation(replies, fingerprints).digests.keys() == {0, 1}
    with pytest.raises(ConfigError, match="client 1's facts are not signed by the identity key its site announced"):
        site_federation(replies, {0: fingerprints[0], 1: SigningKey().fingerprint})
    altered = json.loads(replies[1])
    statement = json.loads(altered["statement"])
    statement["facts"]["num_train"] += 1
    altered["statement"] = json.dumps(statement, sort_keys=True)
    with pytest.raises(ConfigError, match="client 1's facts are not signed"):
        site_federation({**replies, 1: json.dumps(altered).encode()}, fingerprints)
    with pytest.raises(ConfigError, match="describe different federations"):
        site_federation({**replies, 1: json.dumps({"statement": altered["statement"]}).encode()}, {})


def test_a_site_serves_only_the_public_schedule_of_its_own_clients(planned, tmp_path):
    site = Site([0], None, tmp_path / "state")
    site.handle("start", 0, strip_data(planned.frames[0]))  # the aggregator asked for attacks=all
    assert site.runtimes[0].cfg.attacks == []
    assert wire.unpack(site.handle("evaluate", 0, wire.pack({})))
    for method, request in (
        ("attack", wire.pack({"what": "keys"})),
        ("weights", wire.pack({})),
        ("train_on_my_data", b""),
    ):
        with pytest.raises(SiteRefusal, match="does not serve"):
            site.handle(method, 0, request)
    with pytest.raises(SiteRefusal, match="serves clients \\[0\\], not client 2"):
        site.handle("evaluate", 2, wire.pack({}))
    # a checkpoint goes to the site's state folder, whatever path the aggregator names
    outside = tmp_path / "elsewhere" / "client0.pt"
    saved = wire.unpack(site.handle("save", 0, wire.pack({"path": str(outside)})))
    assert not outside.exists() and (tmp_path / "state" / "client0.pt").is_file()
    assert wire.unpack(site.handle("load", 0, wire.pack({"path": str(outside), "sha256": saved["sha256"]}))) == {}


def test_attack_simulation_only_at_a_site_that_opts_in(planned, tmp_path):
    site = Site([0], None, tmp_path, allow_attack_simulation=True)
    site.handle("start", 0, strip_data(planned.frames[0]))
    assert site.runtimes[0].cfg.attacks == ["all"]
    request = wire.pack({"what": "keys"})  # what the client would hand a coalition it joins
    assert site.handle("attack", 0, request) == planned.runtimes[0].handle("attack", request)


def test_a_protocol_refusal_crosses_the_socket_as_its_class(planned, tmp_path):
    site = Site([0], None, tmp_path)
    site.handle("start", 0, strip_data(planned.frames[0]))
    a, b = socket.socketpair()
    with a, b:
        local_socket.send(a, {"method": "half:register", "client": 0}, b"not a bundle")
        header, frame = local_socket.receive(b)
        reply, payload = answer(site, header, frame)
        local_socket.send(b, reply, payload)
        got, _ = local_socket.receive(a)
    assert got["status"] == "refused"
    exc = _refusal(got["error"], got["message"], 0)
    assert isinstance(exc, ProtocolError) and type(exc).__name__ == got["error"] and exc.refusing_client == 0
    assert isinstance(_refusal("MalformedMessageError", "x", 1), MalformedMessageError)
    assert type(_refusal("SystemExit", "x", 1)) is ProtocolError  # only ProtocolError classes are built
    reply, _ = answer(site, {"method": "attack", "client": 0}, wire.pack({"what": "keys"}))
    assert reply["status"] == "error" and reply["error"] == "SiteRefusal"


def test_the_driver_stops_before_set_up_when_a_site_does_not_serve_what_the_run_needs(tmp_path):
    site = Site([0], None, tmp_path, allow_model_export=True)
    hello = json.loads(site.handle("hello", -1, b""))
    assert hello == {"clients": [0], "serves": {"attack": False, "weights": True}, "identities": {}}
    needs = needs_of(small(attacks=["all"], out=str(tmp_path)).validate())
    assert needs == ("weights", "attack")
    check_sites_serve(("weights",), {0: hello["serves"]})
    with pytest.raises(ConfigError, match=r"client\(s\) \[0\] do not serve 'attack'.*--allow-attack-simulation"):
        check_sites_serve(needs, {0: hello["serves"]})
    assert needs_of(small(save_best_model=False, out=str(tmp_path)).validate()) == ()


def test_an_attack_needing_the_state_of_a_site_that_did_not_opt_in_is_not_sent():
    """An attack needing the state of a site that did not opt in is not sent.

    --attacks over sites that took no part in attack simulation: the driver asks only the
    sites that opted in; an attack needing another client's state fails before anything is sent
    (the attack runner reports it not applicable, naming the site's flag).
    """
    check_attack_simulation({1: b""}, {1, 2})
    with pytest.raises(SiteError, match=r"client\(s\) \[0\].*--allow-attack-simulation"):
        check_attack_simulation({0: b""}, {1, 2})


# ------------------------------------------------------------------ identity keys held by the sites
class SiteExecutor(Executor):
    """An executor that sends each client's frames to its site, in process.

    In process, as over Flower: client ``k``'s set-up frame (without its data) and requests go
    to its :class:`Site`; what the driver handed out is kept.
    """

    name = "sites"

    def __init__(self, sites: dict):
        super().__init__()
        self.sites, self.frames = sites, {}

    def start(self, frames):
        self.frames = {k: strip_data(f) for k, f in frames.items()}
        for k, frame in self.frames.items():
            self.sites[k].handle("start", k, frame)

    def _call(self, method, requests):
        return {k: self.sites[k].handle(method, k, r) for k, r in requests.items()}, {}


@pytest.fixture(scope="module")
def site_keys(tmp_path_factory):
    """The identity keys and the manifest made before a run.

    What happens before a run: each site and the aggregator make their identity key; the
    operator builds the manifest from the public fingerprints, which every site verifies.
    """
    folder = tmp_path_factory.mktemp("site-keys")
    folders = identity_keys(folder, 3)
    cfg = write_manifest(folders, small("fedavg", "mask", executor="flower", rounds=1), folder / "manifest.json")
    keys = {p: SigningKey.load(d / "identity.key") for p, d in folders.items()}
    return cfg.validate(), keys, Path(cfg.manifest), folders


def setup_frame(manifest: Path) -> bytes:
    """The key fields of a set-up frame from a driver that holds no client key: the manifest only."""
    return wire.pack({"party_setup": np.zeros(1, np.uint8), "manifest": np.frombuffer(manifest.read_bytes(), np.uint8)})


def own_key_sites(site_keys, root):
    _, keys, manifest, _ = site_keys
    return {
        k: Site([k], None, root / f"site{k}", identities={k: keys[f"client{k}"]}, manifest=manifest) for k in range(3)
    }


def test_each_site_signs_with_its_own_key_which_never_leaves_it(site_keys, tmp_path):
    cfg, keys, _, _ = site_keys
    executor = SiteExecutor(own_key_sites(site_keys, tmp_path))
    protocol = make_runtime_protocol(cfg, 3, executor)
    strategy = make_strategy(cfg, load_federation(cfg), protocol, {}, executor)
    assert all("identity" not in wire.unpack(f) for f in executor.frames.values())  # no key leaves the driver
    strategy.train_round(0)  # the register stage and a masked sum, every message signed
    for k, site in executor.sites.items():
        assert site.runtimes[k].half.signing.fingerprint == keys[f"client{k}"].fingerprint
        accepted = site.runtimes[k].half.registry.fingerprints()
        assert {p: accepted[p]["signing"] for p in keys} == {p: key.fingerprint for p, key in keys.items()}
    assert json.loads(executor.sites[0].handle("hello", -1, b""))["identities"] == {"0": keys["client0"].fingerprint}


def test_a_manifest_listing_another_key_for_a_site_is_refused_by_the_site(site_keys, tmp_path):
    """A manifest listing another key for a site is refused by the site.

    Adversary: the aggregator, which builds its own manifest listing a key it holds for
    client 0 (to sign as client 0 towards the others).  Each site pins the manifest it verified:
    the run id differs, and the site refuses the set-up before any exchange.
    """
    cfg, keys, _, folders = site_keys
    mine = SigningKey()  # the aggregator's key for client 0
    evil = write_manifest(folders, cfg, tmp_path / "forged.json", {"client0": mine.fingerprint})
    forged = Path(evil.manifest)
    executor = SiteExecutor(own_key_sites(site_keys, tmp_path))
    protocol = make_runtime_protocol(evil, 3, executor)
    with pytest.raises(ConfigurationError, match="run id differs from the run manifest"):
        make_strategy(evil, load_federation(evil), protocol, {}, executor)
    # an honest driver names the fix before any set-up frame is sent
    frames = {0: setup_frame(forged)}
    with pytest.raises(ConfigError, match="lists .* for client 0, its site holds"):
        check_site_keys(frames, {0: keys["client0"].fingerprint})


def test_a_relayed_key_substituted_by_the_aggregator_is_refused_by_the_site(site_keys, tmp_path):
    """A relayed key substituted by the aggregator is refused by the site.

    Adversary: the aggregator, with the sites' manifest, puts a channel key of its own for
    client 1 (signed by its server key) into client 0's key directory.  Client 0's site accepts
    client 1's key only signed by the identity key the manifest lists for client 1, which only
    client 1's site holds.
    """
    from support.forgers import directory_forger

    from protocols.registry import backend_class
    from secure_fgl.manifest import schedule_option
    from secure_fgl.manifest import site_keys as manifest_of
    from secure_fgl.privacy import dp_config
    from secure_fgl.runtime.exchange import RuntimeLink

    cfg = site_keys[0]
    executor = SiteExecutor(own_key_sites(site_keys, tmp_path))
    evil = type("EvilMask", (backend_class("mask"),), {"server_half": directory_forger("mask", resign=True)})
    protocol = evil(
        3,
        link=RuntimeLink(executor),
        seed=cfg.seed,
        dp=dp_config(cfg),
        max_colluders=cfg.max_colluders,
        min_contributors=cfg.min_contributors,
        **schedule_option(cfg),
        **manifest_of(cfg),
    )
    strategy = make_strategy(cfg, load_federation(cfg), protocol, {}, executor)
    with pytest.raises(KeySubstitutionError):
        strategy.train_round(0)


def test_a_site_without_its_own_key_is_named_before_set_up(site_keys, tmp_path):
    frames = {0: setup_frame(site_keys[2])}
    with pytest.raises(ConfigError, match="site of client 0 has no identity key of its own"):
        check_site_keys(frames, {0: None})
    with pytest.raises(ConfigError, match="holds its own identity key"):
        check_site_keys({0: wire.pack({**wire.unpack(frames[0]), "identity": np.zeros(32, np.uint8)})}, {0: "ab" * 32})
    site = Site([0], None, tmp_path)  # no key of its own: a set-up frame without a key is refused
    with pytest.raises(SiteRefusal, match="start this site with --identity-key"):
        site.own_setup(frames[0])


# ------------------------------------------------------------------ attack ground truth reported by the sites
class OptInSiteExecutor(SiteExecutor):
    """:class:`SiteExecutor` that, as the Flower executor, sends ``attack`` requests only to the sites that opted in."""

    def _call(self, method, requests):
        if method == "attack":
            check_attack_simulation(requests, {k for k, s in self.sites.items() if s.allow_attack_simulation})
        return super()._call(method, requests)


def attacked(cfg, fed, executor=None) -> list[dict]:
    """The attack entries of run ``cfg`` on ``fed`` (the loaded data, or the sites' facts) and ``executor``."""
    from attacks.runner import run_attacks
    from secure_fgl.engine.device import seed_everything
    from secure_fgl.runtime.build import start_run

    seed_everything(cfg.seed)
    run = start_run(cfg, fed=fed, executor=executor)
    try:
        run.train()
        return run_attacks(cfg.attacks, algo=run.strategy, protocol=run.protocol, fed=fed, cfg=cfg)
    finally:
        run.executor.shutdown()


def sites_of(cfg, root: Path, opted_in=(0, 1, 2)) -> dict:
    return {k: Site([k], None, root / f"site{k}", allow_attack_simulation=k in opted_in) for k in range(cfg.clients)}


@pytest.mark.parametrize(
    "algorithm,attacks",
    [
        ("fedavg", ["update_label_dist", "ownership", "membership", "link_posterior"]),
        pytest.param("fedgcn", ["fedgcn_ls", "fedgcn_readout", "fedgcn_client_subtraction"], marks=pytest.mark.slow),
    ],
)
def test_attacks_scored_on_the_opted_in_sites_reports_are_the_local_runs(algorithm, attacks, tmp_path):
    """Attacks scored on the opted-in sites' reports are the local run's.

    The driver holds only the public facts the sites described; every site opted in to attack
    simulation reports its client's part (``own_data``), from which the runner assembles the
    ground truth and the background knowledge (the global topology, the labelled 30 % sample,
    the membership candidates): with every node owned by some client, every attack's value is
    the one scored on the driver's loaded data.
    """
    cfg = small(algorithm, "plain", executor="local", rounds=1, attacks=attacks).validate()
    local = attacked(cfg, load_federation(cfg))
    sites = sites_of(cfg, tmp_path)
    described = site_federation(facts_of(sites, cfg), {})
    reported = attacked(cfg, described, OptInSiteExecutor(sites))
    assert [e["name"] for e in reported] == ["transcript_audit", *attacks]
    assert all(e["applicable"] for e in local)
    assert [(e["name"], e["value"]) for e in reported] == [(e["name"], e["value"]) for e in local]


def test_an_attack_needing_the_data_of_a_site_that_did_not_report_it_is_refused(tmp_path):
    """An attack needing the data of a site that did not report it is refused, in one line naming the site's flag.

    Site 1 did not opt in: its ``own_data`` request is not sent, its part of the ground truth is
    missing, and every attack (all are scored against the ground truth) is reported not
    applicable; the transcript audit, which needs no ground truth, runs.
    """
    cfg = small("fedavg", "plain", executor="local", rounds=1, attacks=["ownership", "membership"]).validate()
    sites = sites_of(cfg, tmp_path, opted_in=(0, 2))
    with pytest.warns(UserWarning, match=r"no ground truth for client\(s\) \[1\]: client 1: .*takes no part"):
        entries = attacked(cfg, site_federation(facts_of(sites, cfg), {}), OptInSiteExecutor(sites))
    assert entries[0]["name"] == "transcript_audit" and entries[0]["applicable"]
    for e in entries[1:]:
        assert not e["applicable"] and "error" not in e
        assert e["reason"] == (
            "its ground truth needs the data of client(s) [1], whose site(s) reported none "
            "(start them with --allow-attack-simulation)"
        )


def test_the_assembled_ground_truth_is_the_partition_over_the_nodes_some_client_owns():
    """The assembled ground truth is the partition over the nodes some client owns.

    A partition that drops nodes (Louvain, the largest communities kept): the owned nodes'
    features, labels, splits and every edge between them are those of the loaded graph; a node
    no client owns is in no part (zero features, label -1, no split, no edge).
    """
    from attacks.base import GroundTruth
    from attacks.reported import assemble
    from secure_fgl.runtime.facts import PublicFacts

    fed = load_federation(small(partition="louvain", keep_largest=True).validate())
    owned = (fed.owner >= 0).numpy()
    assert 0 < owned.sum() < owned.size
    reported = assemble(PublicFacts.of(fed), dict(enumerate(fed.clients)), {})
    truth, got = GroundTruth.from_fed(fed), GroundTruth.from_fed(reported)
    assert np.array_equal(got.owner, truth.owner)
    assert np.array_equal(reported.reported_nodes.numpy(), owned.nonzero()[0])
    for name in ("x", "y", "train_mask", "test_mask"):
        assert np.array_equal(getattr(got, name)[owned], getattr(truth, name)[owned]), name
    assert not got.x[~owned].any() and (got.y[~owned] == -1).all() and not got.train_mask[~owned].any()
    between_owned = owned[truth.edge_index].all(0)
    assert np.array_equal(got.edge_index, truth.edge_index[:, between_owned])


def test_a_graph_clients_reported_graphs_are_its_partition(tmp_path):
    """A graph client's reported graphs are its partition: the graph-classification ground truth from the sites."""
    from support.runs import graph_config

    from attacks.parties import party_access
    from attacks.reported import reported_federation
    from secure_fgl.algorithms import get_spec
    from secure_fgl.runtime.build import start_run

    cfg = dataclasses.replace(graph_config("gc-fedavg", "plain", rounds=1), clients=3, attacks=["all"]).validate()
    sites = sites_of(cfg, tmp_path)
    described = site_federation(facts_of(sites, cfg), {})
    run = start_run(cfg, fed=described, executor=OptInSiteExecutor(sites))
    try:
        reported = reported_federation(described, party_access(run.strategy), cfg.dataset)
    finally:
        run.executor.shutdown()
    assert reported.unreported == {} and get_spec(cfg.algorithm).task == "graph"
    for mine, loaded in zip(reported.clients, load_federation(cfg).clients, strict=True):
        assert (mine.client_id, mine.num_features, mine.num_classes) == (
            loaded.client_id,
            loaded.num_features,
            loaded.num_classes,
        )
        for split in ("train", "val", "test"):
            assert len(getattr(mine, split)) == len(getattr(loaded, split))
            for a, b in zip(getattr(mine, split), getattr(loaded, split)):
                assert a.x.equal(b.x) and a.edge_index.equal(b.edge_index) and int(a.y) == int(b.y)


# ------------------------------------------------------------------ sites holding only their own exported parts
@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[int, Path]:
    """Each client's part of the small run's partition, exported with ``secure-fgl partition export``."""
    from secure_fgl.cli.main import main
    from secure_fgl.cli.partition import PARTITION_FLAGS
    from secure_fgl.runtime.client_file import FILE_SPEC

    assert {*PARTITION_FLAGS} == {*FILE_SPEC, "data_root"} - {"synthetic"}  # every partition setting has its flag
    folder = tmp_path_factory.mktemp("parts")
    cfg = small()
    (folder / "run.json").write_text(json.dumps({"dataset": cfg.dataset, "synthetic": cfg.synthetic}))
    assert (
        main(["partition", "export", "--config", str(folder / "run.json"), "--clients", "3", "--out", str(folder)]) == 0
    )
    return {k: folder / f"client{k}.npz" for k in range(3)}


def trained(cfg, fed=None, executor=None) -> tuple[list, dict, dict]:
    """Run ``cfg`` (on ``fed`` and ``executor``, default: the loaded data, local): losses, accuracies, per-tag bytes."""
    from secure_fgl.engine.device import seed_everything
    from secure_fgl.runtime.build import start_run

    seed_everything(cfg.seed)
    run = start_run(cfg, fed=fed, executor=executor)
    try:
        losses = [row["train_loss"] for row in run.train()]
        return losses, run.strategy.evaluate(), run.protocol.transcript.comm()["per_tag"]
    finally:
        run.executor.shutdown()


def file_sites(exported: dict, root: Path) -> dict:
    return {k: Site([k], None, root / f"site{k}", client_data={k: path}) for k, path in exported.items()}


@pytest.mark.parametrize("algorithm,mode", [("fedavg", "mask"), ("fedgcn", "mask")])
def test_sites_holding_only_their_exported_parts_give_the_local_run(algorithm, mode, exported, tmp_path, monkeypatch):
    """Sites holding only their exported parts give the local run.

    Each site holds one client's exported file and never loads the dataset (its loader fails if
    called); the sites report their own counts, whose sums (and the shared facts) are the
    partition's public facts, and the run gives the local run's losses, accuracies and per-tag
    protocol bytes on the same seed.
    """
    from secure_fgl.runtime import partition
    from secure_fgl.runtime.facts import PublicFacts

    cfg = small(algorithm, mode, executor="local", rounds=1).validate()
    local = trained(cfg)
    partition.forget()

    def no_dataset(*_):
        raise AssertionError("a site holding its own data file loaded the dataset")

    monkeypatch.setattr(partition, "load_federation", no_dataset)
    sites = file_sites(exported, tmp_path)
    replies = facts_of(sites, cfg)
    owned = [json.loads(json.loads(r)["statement"])["facts"]["num_owned"] for r in replies.values()]
    assert all(n < 300 for n in owned) and sum(owned) == 300  # each its own count; the driver sums them
    described = site_federation(replies, {})
    assert described.facts == PublicFacts.of(load_federation(cfg))
    assert trained(cfg, described, SiteExecutor(sites)) == local


def test_the_summed_own_counts_are_the_facts_of_a_partition_that_drops_nodes(tmp_path):
    """The summed own counts are the public facts of a partition that drops nodes (Louvain, the largest kept)."""
    from secure_fgl.runtime.client_file import export_clients
    from secure_fgl.runtime.facts import PublicFacts

    cfg = small(partition="louvain", keep_largest=True, rounds=1).validate()
    fed = load_federation(cfg)
    assert 0 < int((fed.owner >= 0).sum()) < fed.graph.num_nodes
    sites = file_sites(dict(enumerate(export_clients(cfg, tmp_path / "parts"))), tmp_path)
    assert site_federation(facts_of(sites, cfg), {}).facts == PublicFacts.of(fed)


def test_a_file_that_is_not_the_runs_partition_is_refused(exported, tmp_path):
    """A file that is not the run's partition, altered, or another client's is refused, in one line naming the fix.

    So are ``centralized`` (the whole graph in one runtime), a set-up frame naming other data, and
    sites whose files come from different exports or that mix files with the whole dataset.
    """
    from secure_fgl.runtime.client_file import ClientFile, ClientFileError, export_clients

    cfg = small("fedavg", "mask", executor="local", rounds=1).validate()
    site = file_sites({1: exported[1]}, tmp_path)[1]
    with pytest.raises(ClientFileError, match=r"another partition than the run's: seed 0 \(run: 1\)"):
        facts_of({1: site}, dataclasses.replace(cfg, seed=1))
    with pytest.raises(ClientFileError, match="centralized needs the whole graph"):
        facts_of({1: site}, dataclasses.replace(cfg, algorithm="centralized"))
    frame = FrameKeeper()
    make_strategy(cfg, load_federation(cfg), make_runtime_protocol(cfg, 3, frame), {}, frame)
    other = wire.pack({**wire.unpack(strip_data(frame.frames[1])), "data_digest": "0" * 64})
    with pytest.raises(ClientFileError, match="digest mismatch"):
        site.handle("start", 1, other)
    with pytest.raises(ClientFileError, match="carries data, not its digest"):
        site.handle("start", 1, frame.frames[1])
    with pytest.raises(ConfigError, match="ENZYMES is a graph-classification dataset"):
        export_clients(dataclasses.replace(cfg, dataset="ENZYMES"), tmp_path / "graphs")
    with pytest.raises(ClientFileError, match="holds client 1's data, not client 2's"):
        Site([2], None, tmp_path, client_data={2: exported[1]})
    # altered: one label changed, the file's record of its digest kept
    with np.load(exported[1], allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    arrays["y"][0] += 1
    np.savez(tmp_path / "altered.npz", **arrays)
    with pytest.raises(ClientFileError, match="altered or corrupt"):
        ClientFile.load(tmp_path / "altered.npz")
    np.savez(tmp_path / "pickled.npz", **{**arrays, "y": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ClientFileError, match="not a client data file"):
        ClientFile.load(tmp_path / "pickled.npz")
    # the driver: parts of another export (another seed), or some sites reading the whole dataset
    reseeded = dataclasses.replace(cfg, seed=1)
    others = export_clients(reseeded, tmp_path / "other")
    statements = {k: json.loads(r) for k, r in facts_of(file_sites(exported, tmp_path), cfg).items()}
    foreign = {**statements, 2: {"statement": json.dumps({"client": 2, **ClientFile.load(others[2]).statement()})}}
    with pytest.raises(ConfigError, match="parts of different partitions"):
        site_federation({k: json.dumps(s).encode() for k, s in foreign.items()}, {})
    mixed = {
        **facts_of(file_sites(exported, tmp_path), cfg),
        2: Site([2], None, tmp_path).handle("facts", 2, wire.pack({"config": cfg.to_dict()})),
    }
    with pytest.raises(ConfigError, match="start every site the same way"):
        site_federation(mixed, {})
