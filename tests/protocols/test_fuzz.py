"""Fuzz suite (sample).

Messages tampered in transit, a malicious server's own requests (ckks-mp) and malformed calls, in mask, ckks and
ckks-mp.

In-model categories (a third party or a faulty channel) must end rejected with the expected
ProtocolError: 0 accepted-wrong, 0 unexpected exceptions.  The full run is
``secure-fgl bench --suite fuzz --cases 20000`` (:mod:`secure_fgl.bench.fuzz`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.errors import MalformedMessageError
from protocols.message import Envelope, decode_body, encode_body
from secure_fgl.bench.fuzz import CASES, format_table, run_fuzz


@pytest.fixture(scope="module")
def records():
    # about 9 cases per (backend, category) pair; one protocol object (one CKKS context) per backend
    return run_fuzz(800, seed=1)


def test_in_model_categories_all_rejected(records):
    bad = [
        r for r in records if r["in_model"] and (r["accepted_wrong"] or r["unexpected"] or r["rejected"] != r["cases"])
    ]
    assert not bad, format_table(bad)
    assert {r["category"] for r in records} == {c.name for c in CASES}


def test_out_of_model_categories_are_reported(records):
    out = [r for r in records if not r["in_model"]]
    assert out and all(
        r["unexpected"] == 0 and r["cases"] == r["rejected"] + r["accepted_correct"] + r["accepted_wrong"] for r in out
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_never_parse_as_a_message(data):
    try:
        Envelope.from_bytes(data)
    except MalformedMessageError:
        return
    raise AssertionError("garbage parsed as a message")


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.binary(max_size=20)
        | st.text(max_size=10)
        | st.floats(allow_nan=False),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
        max_leaves=12,
    ),
    st.data(),
)
def test_body_codec_round_trip_and_truncation(obj, data):
    body = encode_body(obj)
    assert encode_body(decode_body(body)) == body
    if len(body) > 1:
        cut = data.draw(st.integers(0, len(body) - 1))
        with pytest.raises(MalformedMessageError):
            decode_body(body[:cut])
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert np.array_equal(decode_body(encode_body({"a": arr}))["a"], arr)
