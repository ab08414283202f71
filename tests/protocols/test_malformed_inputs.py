"""Every malformed input to the protocol layer raises a ProtocolError subclass.

The categories: an all-zero X25519 key, shape None, a tag that is not valid UTF-8, zero-length
values, a round >= 2^63, string or complex arrays (never silently truncated to their real part).
Explicit cases cover each category on the plain and mask backends (validation runs before
any backend work, so it is the same code for ckks); hypothesis adds random junk, which must
either aggregate correctly or raise a ProtocolError.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from protocols import DPRequest, ProtocolError, make_protocol
from protocols.ckks.keys import ServerContext
from protocols.ckks.params import N4096
from protocols.errors import IntegrityError, NonFiniteError, ShapeError
from protocols.mask.keys import ExchangeBinding, MaskKeyPair

K = 3
FORBIDDEN = (ValueError, TypeError, OverflowError, AttributeError, UnicodeEncodeError, KeyError, IndexError)
GOOD = {k: np.ones(4) for k in range(K)}
PROTOCOLS = {mode: make_protocol(mode, K) for mode in ("plain", "mask")}


def refused(call, expected=ProtocolError):
    """``call()`` raises ``expected`` (a ProtocolError subclass) and nothing else."""
    try:
        call()
    except ProtocolError as exc:
        assert isinstance(exc, expected), f"{type(exc).__name__} instead of {expected.__name__}: {exc}"
        str(exc).encode("utf-8")  # the message itself prints
        return
    except FORBIDDEN as exc:
        pytest.fail(f"{type(exc).__name__} instead of a ProtocolError: {exc}")
    pytest.fail("malformed input was accepted")


BAD_VALUES = {
    "none": None,
    "ragged": [[1.0, 2.0], [3.0]],
    "complex": np.ones(4) * (1 + 2j),
    "complex_tensor": torch.ones(4, dtype=torch.complex64),
    "strings": np.array(["a", "b", "c", "d"]),
    "objects": np.array([object()] * 4),
    "text": "1234",
    "empty": np.zeros(0),
    "empty_2d": np.zeros((0, 4)),
    "nan": np.array([1.0, math.nan, 0, 0]),
    "inf": np.array([1.0, math.inf, 0, 0]),
    "huge_int": [10**400] * 4,
    "dict": {"a": 1.0},
    "bytes": b"\x00" * 4,
}
BAD_TAGS = {"none": None, "int": 3, "bytes": b"tag", "surrogate": "tag\ud800", "empty": "", "long": "x" * 2000}
BAD_ROUNDS = {
    "negative": -1,
    "2^63": 2**63,
    "2^64": 2**64,
    "float": 1.5,
    "str": "1",
    "none": None,
    "bool": True,
    "np_float": np.float64(1.0),
}
BAD_CLIENTS = {"negative": -1, "K": K, "float": 1.5, "str": "0", "none": None, "bool": True, "huge": 2**70}
BAD_WEIGHTS = {
    "negative": -1.0,
    "nan": math.nan,
    "inf": math.inf,
    "str": "w",
    "none": None,
    "huge_int": 10**400,
    "vector": [1.0, 2.0],
    "complex": 1j,
}


@pytest.mark.parametrize("mode", sorted(PROTOCOLS))
@pytest.mark.parametrize("case", sorted(BAD_VALUES))
@pytest.mark.parametrize("entry", ["weighted_sum", "weighted_mean"])
def test_dense_values(mode, case, entry):
    proto = PROTOCOLS[mode]
    values = {**GOOD, 1: BAD_VALUES[case]}
    refused(lambda: getattr(proto, entry)("t", 0, values))


def test_complex_is_refused_not_truncated():
    refused(lambda: PROTOCOLS["plain"].weighted_sum("t", 0, {0: np.array([1 + 5j])}), ShapeError)
    refused(lambda: PROTOCOLS["plain"].weighted_sum("t", 0, {0: np.array([math.nan])}), NonFiniteError)


@pytest.mark.parametrize("case", sorted(BAD_TAGS))
def test_bad_tags(case):
    for mode, proto in PROTOCOLS.items():
        refused(lambda: proto.weighted_sum(BAD_TAGS[case], 0, GOOD))
        refused(lambda: proto.row_sum(BAD_TAGS[case], 0, {0: ([0], [[1.0]])}, {0: [0]}, 4))
        refused(lambda: proto.central_moments(BAD_TAGS[case], 0, {0: np.ones((2, 2))}))


@pytest.mark.parametrize("case", sorted(BAD_ROUNDS))
def test_bad_rounds(case):
    for mode, proto in PROTOCOLS.items():
        refused(lambda: proto.weighted_mean("t", BAD_ROUNDS[case], GOOD))
        refused(lambda: proto.row_sum("t", BAD_ROUNDS[case], {0: ([0], [[1.0]])}, {0: [0]}, 4))


@pytest.mark.parametrize("case", sorted(BAD_CLIENTS))
def test_bad_client_ids(case):
    bad = BAD_CLIENTS[case]
    proto = PROTOCOLS["mask"]
    refused(lambda: proto.weighted_sum("t", 0, {0: np.ones(4), bad: np.ones(4)}))
    refused(lambda: proto.weighted_sum("t", 0, GOOD, recipients=[0, bad]))
    refused(lambda: proto.row_sum("t", 0, {bad: ([0], [[1.0]])}, {0: [0]}, 4))
    refused(lambda: proto.row_sum("t", 0, {0: ([0], [[1.0]])}, {bad: [0]}, 4))
    refused(lambda: proto.central_moments("t", 0, {bad: np.ones((2, 2))}))


@pytest.mark.parametrize("case", sorted(BAD_WEIGHTS))
def test_bad_weights(case):
    w = {0: 1.0, 1: BAD_WEIGHTS[case], 2: 1.0}
    for proto in PROTOCOLS.values():
        refused(lambda: proto.weighted_sum("t", 0, GOOD, w))
        refused(lambda: proto.weighted_mean("t", 0, GOOD, w))
        refused(
            lambda: proto.classwise_mean(
                "t",
                0,
                {k: np.ones((2, 2)) for k in range(K)},
                {0: [1.0, 1.0], 1: [BAD_WEIGHTS[case]] * 2, 2: [1.0, 1.0]},
            )
        )


def test_missing_weights_recipients_and_mappings():
    proto = PROTOCOLS["plain"]
    cases = [
        lambda: proto.weighted_mean("t", 0, GOOD, {0: 1.0}),  # weights lack clients
        lambda: proto.weighted_mean("t", 0, GOOD, [1.0, 1.0, 1.0]),  # not a mapping
        lambda: proto.weighted_sum("t", 0, [np.ones(4)] * 3),
        lambda: proto.weighted_sum("t", 0, {}),
        lambda: proto.weighted_sum("t", 0, GOOD, recipients=[]),
        lambda: proto.weighted_sum("t", 0, GOOD, recipients=5),
        lambda: proto.weighted_sum("t", 0, GOOD, recipients="01"),
        lambda: proto.weighted_sum("t", 0, {0: np.ones(4), 1: np.ones(5)}),  # shapes differ
        lambda: proto.classwise_mean("t", 0, {0: np.ones((2, 2))}, {}),
        lambda: proto.classwise_mean("t", 0, {0: np.ones((2, 2))}, {0: [1.0, 1.0, 1.0]}),
        lambda: proto.classwise_mean("t", 0, {0: np.ones(2)}, {0: [1.0, 1.0]}),
        lambda: proto.central_moments("t", 0, {0: np.ones(3)}),
        lambda: proto.central_moments("t", 0, {0: np.ones((2, 0))}),
        lambda: proto.central_moments("t", 0, {0: np.ones((2, 2))}, orders=["a"]),
        lambda: proto.central_moments("t", 0, {0: np.ones((2, 2))}, orders=[0]),
        lambda: proto.central_moments("t", 0, {0: np.ones((2, 2))}, orders=5),
        lambda: proto.central_moments("t", 0, [np.ones((2, 2))]),
    ]
    for case in cases:
        refused(case)


ROW_CASES = {
    "float_ids": ({0: ([0.5], [[1.0]])}, {0: [0]}, 4),
    "complex_ids": ({0: (np.array([1j]), [[1.0]])}, {0: [0]}, 4),
    "ids_out_of_range": ({0: ([4], [[1.0]])}, {0: [0]}, 4),
    "negative_ids": ({0: ([-1], [[1.0]])}, {0: [0]}, 4),
    "huge_uint_ids": ({0: (np.array([2**64 - 1], dtype=np.uint64), [[1.0]])}, {0: [0]}, 4),
    "duplicate_ids": ({0: ([1, 1], [[1.0], [1.0]])}, {0: [0]}, 4),
    "not_a_pair": ({0: ([0], [[1.0]], 3)}, {0: [0]}, 4),
    "pair_is_array": ({0: np.zeros(2)}, {0: [0]}, 4),
    "ragged_rows": ({0: ([0, 1], [[1.0], [1.0, 2.0]])}, {0: [0]}, 4),
    "rows_1d": ({0: ([0], [1.0])}, {0: [0]}, 4),
    "rows_zero_width": ({0: ([0], np.zeros((1, 0)))}, {0: [0]}, 4),
    "rows_complex": ({0: ([0], [[1j]])}, {0: [0]}, 4),
    "rows_nan": ({0: ([0], [[math.nan]])}, {0: [0]}, 4),
    "rows_strings": ({0: ([0], [["a"]])}, {0: [0]}, 4),
    "widths_differ": ({0: ([0], [[1.0]]), 1: ([1], [[1.0, 2.0]])}, {0: [0]}, 4),
    "request_out_of_range": ({0: ([0], [[1.0]])}, {0: [9]}, 4),
    "request_float": ({0: ([0], [[1.0]])}, {0: [0.5]}, 4),
    "requests_not_mapping": ({0: ([0], [[1.0]])}, [[0]], 4),
    "no_contributions": ({}, {0: [0]}, 4),
    "num_rows_zero": ({0: ([0], [[1.0]])}, {0: [0]}, 0),
    "num_rows_negative": ({0: ([0], [[1.0]])}, {0: [0]}, -3),
    "num_rows_str": ({0: ([0], [[1.0]])}, {0: [0]}, "4"),
    "num_rows_float": ({0: ([0], [[1.0]])}, {0: [0]}, 4.0),
    "num_rows_huge": ({0: ([0], [[1.0]])}, {0: [0]}, 2**70),
}


@pytest.mark.parametrize("mode", sorted(PROTOCOLS))
@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_sum_inputs(mode, case):
    contrib, requests, num_rows = ROW_CASES[case]
    refused(lambda: PROTOCOLS[mode].row_sum("t", 0, contrib, requests, num_rows))
    refused(lambda: PROTOCOLS[mode].row_sum("t", 0, {0: ([0], [[1.0]])}, {0: [0]}, 4, layout="diagonal"))


# ----------------------------------------------------------------------------- keys
#: the X25519 points of small order (and their non-canonical encodings): each gives an all-zero
#: shared secret, which ``cryptography`` refuses with ValueError
LOW_ORDER_POINTS = [
    bytes(32),
    (1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    (2**255 - 19 - 1).to_bytes(32, "little"),
    (2**255 - 19).to_bytes(32, "little"),
    (2**255 - 19 + 1).to_bytes(32, "little"),
]
BINDING = ExchangeBinding(b"r" * 16, 0, "t", 0)


@pytest.mark.parametrize("point", LOW_ORDER_POINTS, ids=lambda b: b.hex()[:8])
def test_low_order_x25519_keys_refused(point):
    refused(lambda: MaskKeyPair.generate().pairwise_seed(0, 1, point, BINDING), IntegrityError)


@pytest.mark.parametrize("key", [b"", b"\x01" * 31, b"\x01" * 33, "a" * 32, None, 12, [1] * 32])
def test_malformed_x25519_keys_refused(key):
    refused(lambda: MaskKeyPair.generate().pairwise_seed(0, 1, key, BINDING), IntegrityError)


def test_low_order_key_in_the_mask_protocol_is_refused():
    proto = make_protocol("mask", K)
    proto.intercept = lambda m: (
        m if m.kind != "public_key" or m.sender != "client1" else type(m)(**{**m.__dict__, "payload": bytes(32)})
    )
    refused(lambda: proto.weighted_sum("t", 0, GOOD), IntegrityError)


@pytest.mark.parametrize(
    "field,value",
    [("tag", "\udcff"), ("tag", None), ("round", -1), ("round", 2**63), ("seq", -1), ("seq", "0"), ("run_id", "run")],
)
def test_exchange_binding_refuses_bad_fields(field, value):
    fields = {"run_id": b"r", "seq": 0, "tag": "t", "round": 0, field: value}
    refused(lambda: ExchangeBinding(**fields))


@pytest.mark.parametrize("public", ["not bytes", b"", b"SFGL", b"\x00" * 64, None, 7])
def test_ckks_public_context_bytes_refused(public):
    refused(lambda: ServerContext(public, N4096))


@pytest.mark.parametrize(
    "kw",
    [
        {"clip": "1"},
        {"clip": None},
        {"clip": 1.0, "releases": 1.5},
        {"clip": 1.0, "sensitivity": "s"},
        {"clip": 1.0, "weight_bound": math.nan},
        {"clip": -1.0},
        {"clip": math.nan},
    ],
)
def test_bad_dp_requests(kw):
    refused(lambda: DPRequest(**kw))


# ----------------------------------------------------------------------------- random junk
JUNK = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.complex_numbers(allow_nan=True),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.lists(
        st.one_of(
            st.floats(allow_nan=True),
            st.integers(-(2**70), 2**70),
            st.text(max_size=2),
            st.complex_numbers(),
            st.lists(st.floats(), max_size=2),
        ),
        max_size=4,
    ),
    st.dictionaries(st.text(max_size=2), st.floats(), max_size=2),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(value=2.0**64, weight=2.0**64, tag="0", rnd=0, client=0)  # past float32's range: refused, not inf
@given(
    value=JUNK,
    weight=JUNK,
    tag=st.one_of(st.text(max_size=8), JUNK),
    rnd=st.one_of(st.integers(-(2**70), 2**70), JUNK),
    client=st.one_of(
        st.integers(-3, 6), st.none(), st.text(max_size=2), st.floats(), st.booleans(), st.complex_numbers()
    ),
)
def test_random_junk_is_refused_or_summed_exactly(value, weight, tag, rnd, client):
    proto = PROTOCOLS["plain"]
    try:
        out = proto.weighted_sum(tag, rnd, {0: np.ones(1), client: value}, {0: 1.0, client: weight})
    except ProtocolError as exc:
        str(exc).encode("utf-8")
        return
    except FORBIDDEN as exc:
        pytest.fail(f"{type(exc).__name__} instead of a ProtocolError: {exc}")
    expected = np.asarray(value, dtype=np.float64).ravel() * float(weight) + (1.0 if client != 0 else 0.0)
    if client == 0:
        expected = np.asarray(value, dtype=np.float64).ravel() * float(weight)
    np.testing.assert_allclose(out.ravel(), expected, rtol=1e-6, atol=1e-6 * max(1.0, float(np.abs(expected).max())))
