"""Backends in client and server halves: only bytes cross the link, and what each half holds."""

from __future__ import annotations

import numpy as np
import pytest
from support.runs import reachable_objects

from protocols import SERVER, BlockTable, ExchangeContext, ValueSpec, make_protocol
from protocols.errors import ConfigurationError, DropoutError, IntegrityError
from protocols.framing import message_from_bytes, unpack_bundle
from protocols.link import ClientLink
from protocols.registry import backend, modes, secure_modes

SPLIT_MODES = ["plain", "mask", "ckks", "ckks-mp"]
SPEC = ValueSpec(max_abs=1.0, tolerance=1e-4)


class RecordingLink(ClientLink):
    """Wraps a link and keeps every byte string handed to and returned by the client halves."""

    def __init__(self, inner):
        self.inner, self.crossed = inner, []

    def call(self, stage, requests):
        responses = self.inner.call(stage, requests)
        self.crossed += list(requests.values()) + list(responses.values())
        return responses


def _values(K, n=300, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, n) for k in range(K)}


@pytest.mark.parametrize("mode", SPLIT_MODES)
def test_transcript_bytes_are_the_bytes_on_the_link(mode):
    proto = make_protocol(mode, 3)
    link = RecordingLink(proto.link)
    proto.link = link
    x = _values(3)
    got = proto.weighted_sum("x/t", 0, x, spec=SPEC)
    assert np.allclose(got, sum(x.values()), atol=1e-4)
    crossings = [b for bundle in link.crossed for b in unpack_bundle(bundle)]
    assert crossings, "nothing crossed the link"
    # a client -> client message crosses twice (to the server, then on to its recipient) and is one message
    on_link = list(dict.fromkeys(crossings))
    relayed = [m for m in proto.transcript.messages if m.relay == SERVER]
    assert len(crossings) - len(on_link) == len(relayed)
    # every message that crossed is in the transcript with nbytes == len(its bytes), and vice versa
    recorded = sorted(m.nbytes for m in proto.transcript.messages)
    assert sorted(len(b) for b in on_link) == recorded
    assert sum(m.nbytes for m in proto.transcript.messages) == sum(len(b) for b in on_link)
    for b in on_link:
        assert message_from_bytes(b).nbytes == len(b)


@pytest.mark.parametrize("mode", SPLIT_MODES)
def test_client_half_holds_nothing_of_another_client(mode):
    K, n = 3, 40
    proto = make_protocol(mode, K)
    rng = np.random.default_rng(0)
    tables = {k: BlockTable(np.arange(1), rng.uniform(-1, 1, (1, n))) for k in range(K)}
    ctx = ExchangeContext("x/t", 0, SPEC, tables, {k: np.arange(1) for k in range(K)}, 1, n)
    out = proto._aggregate(ctx)
    assert np.allclose(out[0][0], sum(t.values[0] for t in tables.values()), atol=1e-4)
    for k, half in proto.clients.items():
        mine = reachable_objects(half)
        for j, other in proto.clients.items():
            if j != k:
                assert not {id(other), id(other.signing), id(other.channel)} & mine
                assert not {id(tables[j]), id(tables[j].values)} & mine  # another client's contribution
        assert not {id(proto.server), id(proto.server.signing), id(proto.server.transcript), id(ctx)} & mine
        assert not {id(out[j][0]) for j in out if j != k} & mine  # nor another's result


def test_client_half_is_built_from_public_bytes_only():
    proto = make_protocol("plain", 2)
    setup = proto.setup.to_bytes()
    assert isinstance(setup, bytes) and proto.clients[0].setup == proto.clients[1].setup
    fresh = type(proto.clients[0])(0, setup)
    assert fresh.signing.public_bytes != proto.clients[0].signing.public_bytes  # keys made inside, fresh


def test_dropped_client_is_named_not_waited_for():
    """Dropped client is named not waited for.

    A client whose answer never comes back is a dropout: plain sums the clients that uploaded
    (refusing, naming them, when none did); mask recovers the survivors' sum above the threshold
    and refuses, naming the clients, below it.
    """
    x = _values(3)
    plain = make_protocol("plain", 3)
    plain.link.drop(1, "upload")
    got = plain.weighted_sum("x/t", 0, x, spec=SPEC, recipients=[0, 2])
    assert np.allclose(got, x[0] + x[2], atol=1e-4)
    for k in (0, 2):
        plain.link.drop(k, "upload")
    with pytest.raises(DropoutError, match=r"client\(s\) 0, 1, 2 did not upload \(every contributor dropped\)"):
        plain.weighted_sum("x/t", 1, x, spec=SPEC)
    mask = make_protocol("mask", 3)  # t = 2 of 3
    mask.weighted_sum("x/t", 0, x, spec=SPEC)
    mask.link.drop(1, "masked_upload")  # gone from its upload on, in this and later exchanges
    got = mask.weighted_sum("x/t", 1, x, spec=SPEC, recipients=[0, 2])
    assert mask.last_included == (0, 2) and np.allclose(got, x[0] + x[2], atol=1e-4)
    mask.link.drop(2, "masked_upload")
    with pytest.raises(DropoutError, match=r"client\(s\) 1, 2 dropped out") as err:
        mask.weighted_sum("x/t", 2, x, spec=SPEC, recipients=[0])
    assert err.value.clients == (1, 2)
    ckks = make_protocol("ckks", 3)  # shared key: the survivors' sum
    ckks.link.drop(2, "upload")
    got = ckks.weighted_sum("x/t", 0, x, spec=SPEC, recipients=[0, 1])
    assert np.allclose(got, x[0] + x[1], atol=1e-3)
    for k in (0, 1):
        ckks.link.drop(k, "upload")
    with pytest.raises(DropoutError, match=r"client\(s\) 0, 1, 2 did not answer the 'upload' stage") as err:
        ckks.weighted_sum("x/t", 1, x, spec=SPEC)
    assert err.value.clients == (0, 1, 2)


def test_ckks_mp_missing_partial_decryption_is_named():
    """Ckks-mp missing partial decryption is named.

    ckks-mp is n-out-of-n: a client silent at the partial-decryption (key-switching) stage, even
    one that is neither contributor nor recipient, stops the exchange naming it; nothing is delivered.
    """
    x = _values(3)
    proto = make_protocol("ckks-mp", 3)
    proto.weighted_sum("x/t", 0, x, spec=SPEC)
    proto.link.drop(2, "keyswitch")
    with pytest.raises(
        DropoutError, match=r"client\(s\) 2 did not send its key-switching \(partial decryption\)"
    ) as err:
        proto.weighted_sum("x/t", 1, {0: x[0], 1: x[1]}, spec=SPEC, recipients=[0, 1])
    assert err.value.clients == (2,)
    assert all(c._result is None or c._result[0] != c.plan.exchange for c in proto.clients.values())


@pytest.mark.parametrize("mode", SPLIT_MODES)
def test_each_client_is_told_only_its_own_request(mode):
    proto = make_protocol(mode, 3)
    rows = {k: (np.array([k, 10 + k]), np.ones((2, 2))) for k in range(3)}
    requests = {0: np.array([1]), 1: np.array([7, 12]), 2: np.array([], dtype=np.int64)}
    proto.row_sum("x/r", 0, rows, requests, 20, spec=ValueSpec(max_abs=1.0, tolerance=1e-4))
    plans = [m for m in proto.transcript.messages if m.kind == "control" and m.note == "exchange plan"]
    assert sorted(m.receiver for m in plans) == ["client0", "client1", "client2"]
    for m in plans:
        assert list(m.payload["requests"]) == [int(m.receiver[6:])]


def test_registry_lists_every_backend_once():
    assert modes() == ("plain", "ckks", "mask", "ckks-mp")
    assert "plain" not in secure_modes() and set(secure_modes()) == {"ckks", "mask", "ckks-mp"}
    assert backend("MASK").upload_kind == "masked"
    with pytest.raises(ConfigurationError, match="choose one of plain, ckks, mask, ckks-mp"):
        make_protocol("rot13", 2)
    from dataclasses import fields

    from secure_fgl.config import RunConfig

    assert tuple(f.metadata.get("choices", ()) for f in fields(RunConfig) if f.name == "mode")[0] == modes()


@pytest.mark.parametrize("mode,upload", [("plain", "upload"), ("mask", "masked_upload")])
def test_server_streams_a_sequential_link_client_by_client(mode, upload):
    """Server streams a sequential link client by client.

    Over a sequential link (clients answering in turn, in this process) the plain and mask
    servers call one client per upload and per download call, so they hold one client's blocks at
    a time; over a parallel link they call them all at once.  The sums are the same bits either
    way; plain's are those of folding the float32 uploads in client order.
    """
    rng = np.random.default_rng(0)
    values = {k: rng.normal(size=9000) for k in range(4)}
    totals = {}
    for sequential in (True, False):
        proto = make_protocol(mode, 4)
        proto.link.sequential = sequential
        calls, real = [], proto.link.call
        proto.link.call = lambda stage, requests: calls.append((stage, len(requests))) or real(stage, requests)
        totals[sequential] = proto.weighted_sum("t", 0, values)
        sizes = {stage: {n for s, n in calls if s == stage} for stage in (upload, "download")}
        assert sizes == ({upload: {1}, "download": {1}} if sequential else {upload: {4}, "download": {4}})
    assert np.array_equal(totals[True], totals[False])
    folded = sum(v.astype(np.float32).astype(np.float64) for v in values.values()).astype(np.float32)
    if mode == "plain":
        assert np.array_equal(totals[True], folded)
    else:
        assert np.allclose(totals[True], folded, atol=1e-4)


def test_mask_exchange_after_a_refused_upload_starts_clean():
    """Mask exchange after a refused upload starts clean.

    Client 0's upload is refused in a run's first exchange, while the others' bundles still hold
    the self-mask shares relayed to them: each client reads its bundle anyway (as over a parallel
    link), so the next exchange finds no stale message and sums correctly.
    """
    import dataclasses

    values = {k: np.full(50, 0.25 * (k + 1)) for k in range(3)}
    proto = make_protocol("mask", 3)
    proto.intercept = lambda m: (
        dataclasses.replace(m, round=m.round + 1)
        if m.sender == "client0" and m.receiver == SERVER and m.kind == "masked"
        else m
    )
    with pytest.raises(IntegrityError, match="client 0"):
        proto.weighted_sum("t", 0, values)
    proto.intercept = None
    assert np.allclose(proto.weighted_sum("t", 1, values), 1.5, atol=1e-4)


def test_mask_client_frees_its_encoded_input_after_the_masked_upload():
    """Mask client frees its encoded input after the masked upload.

    A mask client needs only its seeds and shares once its masked upload is built, so it drops
    the encoded input then (an attack simulation keeps it with ``keep_client_state``).
    """
    values = {k: np.full(100, 0.1 * k) for k in range(3)}
    for keep in (False, True):
        proto = make_protocol("mask", 3)
        proto.keep_client_state = keep
        proto.weighted_sum("t", 0, values)
        held = [proto.clients[k].state.encoded for k in range(3)]
        assert all((e is not None) == keep for e in held)
