"""A site's client process for the Flower deployment (``secure_fgl/runtime/flower_site.py``),
in process: the adversary is the aggregator, which writes every request a site receives (the
set-up frame's settings included).  It gets no data in the set-up frame, no answer to a request
off the public schedule, and no file written outside the site's state folder."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from support.runs import small

from protocols import ProtocolError
from protocols.errors import MalformedMessageError
from secure_fgl.config import ConfigError
from secure_fgl.experiment import load_federation
from secure_fgl.runtime import local_socket, wire
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor
from secure_fgl.runtime.flower_executor import (
    _refusal,
    check_sites_serve,
    needs_of,
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


def test_a_site_serves_only_the_public_schedule_of_its_own_clients(planned, tmp_path):
    site = Site([0], None, tmp_path / "state")
    site.handle("start", 0, strip_data(planned.frames[0]))  # the aggregator asked for attacks=all
    assert site.runtimes[0].cfg.attacks == []
    assert wire.unpack(site.handle("evaluate", 0, wire.pack({"round": 0})))
    for method, request in (
        ("attack", wire.pack({"what": "keys"})),
        ("weights", wire.pack({})),
        ("train_on_my_data", b""),
    ):
        with pytest.raises(SiteRefusal, match="does not serve"):
            site.handle(method, 0, request)
    with pytest.raises(SiteRefusal, match="serves clients \\[0\\], not client 2"):
        site.handle("evaluate", 2, wire.pack({"round": 0}))
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
    assert hello == {"clients": [0], "serves": {"attack": False, "weights": True}}
    needs = needs_of(small(attacks=["all"], out=str(tmp_path)).validate())
    assert needs == ("weights", "attack")
    check_sites_serve(("weights",), {0: hello["serves"]})
    with pytest.raises(ConfigError, match=r"client\(s\) \[0\] do not serve 'attack'.*--allow-attack-simulation"):
        check_sites_serve(needs, {0: hello["serves"]})
    assert needs_of(small(save_best_model=False, out=str(tmp_path)).validate()) == ()
