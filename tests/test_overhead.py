"""Whole-run overhead (issue 17): the checkpointed transcript and the overhead benchmark's records."""
from __future__ import annotations

import numpy as np

from protocols import make_protocol
from secure_fgl.engine.transcript_state import TranscriptState


def _transcript_after_exchanges(n: int):
    proto = make_protocol("mask", 3)
    for r in range(n):
        proto.weighted_mean("t", r, {k: np.full(4, float(k)) for k in range(3)})
    return proto.transcript


def test_transcript_state_round_trips_every_message_without_payloads():
    transcript = _transcript_after_exchanges(2)
    text = TranscriptState(transcript).encode()
    copy = _transcript_after_exchanges(0)
    TranscriptState(copy).restore(text)
    assert copy.messages == [m.without_payload() for m in transcript.messages]
    assert copy.comm()["per_tag"]["t"]["bytes_up"] == transcript.comm()["per_tag"]["t"]["bytes_up"] > 0


def test_transcript_state_encodes_only_new_messages():
    proto = make_protocol("plain", 2)
    state = TranscriptState(proto.transcript)
    proto.weighted_sum("a", 0, {0: np.ones(2), 1: np.ones(2)})
    first = state.encode()
    proto.weighted_sum("a", 1, {0: np.ones(2), 1: np.ones(2)})
    second = state.encode()
    assert second.startswith(first + "\n") and second.count("\n") + 1 == len(proto.transcript.messages)
