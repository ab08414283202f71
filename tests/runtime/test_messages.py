"""Typed requests and replies between a strategy and its client logic (secure_fgl/runtime/messages.py).

Each message crosses the wire as the flat frame of its fields and comes back equal; a frame that is
not its method's message (a missing, unknown or mistyped field, an unknown method) is a
:class:`MessageError` naming the class and the field, on the client before its logic runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support.runs import small

from secure_fgl.runtime import wire
from secure_fgl.runtime.messages import (
    METHODS,
    AttackIns,
    ContributeIns,
    ContributeRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    MessageError,
    PrivatizeIns,
    ReceiveIns,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)

REQUESTS = [
    ("local_update", FitIns(3, model="fedgcn-gap/encoder/model", dpsgd_tag="t/dpsgd", dpsgd_std=[0.5, 0.25])),
    (
        "contribute",
        ContributeIns("g/hop/1", 0, dp_clip=1.0, rpb=8, num_blocks=4, layout="sparse", config={"hop": 1}),
    ),
    (
        "privatize",
        PrivatizeIns("t", 2, np.array([0.5, 2.0]), 1.0, False, True, grid_bits=12, blocks=np.arange(2), rpb=8),
    ),
    ("receive", ReceiveIns("t", 2, length=10, dp_std=0.5, config={"stage": "mean", "layers": [0, 1]})),
    ("evaluate", EvaluateIns(model="enc")),
    ("attack", AttackIns("query", client=1, x=np.ones((2, 3), np.float32))),
]
REPLIES = [
    ("local_update", FitRes(trained=True, loss=0.75, terms={"ce": 0.5, "cmd": 0.25})),
    ("contribute", ContributeRes(rows_up=3, rows_down=2, request_blocks=np.arange(3), public={"h": np.ones(2)})),
    ("evaluate", EvaluateRes({"train": [3, 4], "val": [1, 2], "test": [0, 2]})),
]


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("method,message", REQUESTS + REPLIES, ids=lambda x: type(x).__name__)
def test_every_message_crosses_the_wire_unchanged(method, message):
    is_request = isinstance(message, METHODS[method][0])
    fields = encode_request(method, message) if is_request else encode_reply(method, message)
    frame = wire.unpack(wire.pack(fields))
    back = decode_request(method, frame) if is_request else decode_reply(method, frame)
    assert type(back) is type(message)
    for f in dataclasses.fields(message):
        assert _same(getattr(back, f.name), getattr(message, f.name)), f.name


def test_the_frame_is_the_flat_mapping_of_the_fields():
    """A reply's frame is byte for byte the dict it replaced (the recorded ``eval/counts`` bytes stand)."""
    counts = {"train": [3, 4], "val": [1, 2], "test": [0, 2]}
    assert wire.pack(EvaluateRes(counts).to_fields()) == wire.pack(counts)
    ins = ContributeIns("fedgcn/row_ids", 0, config={"masks": np.arange(3), "rows": np.arange(5)})
    assert wire.pack(ins.to_fields()) == wire.pack({"tag": "fedgcn/row_ids", "round": 0, **ins.config})


@pytest.mark.parametrize(
    "method,fields,match",
    [
        ("contribute", {"round": 0}, "ContributeIns without its field 'tag'"),
        ("local_update", {"round": 0, "dp_clip": 1.0}, r"FitIns has no field\(s\) \['dp_clip'\]"),
        ("local_update", {"round": "0"}, "FitIns.round cannot be str"),
        ("privatize", {"tag": "t", "round": 0, "std": "big", "clip": 1.0, "per_row": False, "integer": False}, "std"),
        ("receive", {"tag": 7, "round": 0}, "ReceiveIns.tag cannot be int"),
        ("train_on_my_data", {}, "no method 'train_on_my_data'"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_field(method, fields, match):
    with pytest.raises(MessageError, match=match):
        decode_request(method, fields)


def test_each_side_refuses_the_wrong_message_class():
    with pytest.raises(MessageError, match="local_update takes a FitIns"):
        encode_request("local_update", {"round": 0})
    with pytest.raises(MessageError, match="evaluate answers EvaluateRes, not FitRes"):
        encode_reply("evaluate", FitRes(trained=True, loss=0.0))
    with pytest.raises(MessageError, match="receive answers nothing"):
        decode_reply("receive", {"length": 3})
    with pytest.raises(MessageError, match="ContributeIns of 'g/hop/1' without 'hop'"):
        ContributeIns("g/hop/1", 0).entry("hop")


def test_a_client_runtime_refuses_a_malformed_request_before_its_logic_runs(run_small):
    run = run_small(small("fedavg", "plain", rounds=1).validate())
    runtime, strategy = run.runtimes[0], run.strategy
    before = [p.detach().clone() for p in runtime.logic.model.parameters()]
    for method, fields in (("local_update", {"round": 0, "lr": 10.0}), ("contribute", {"tag": 5, "round": 0})):
        with pytest.raises(MessageError):
            runtime.handle(method, wire.pack(fields))
    assert all(torch.equal(a, b) for a, b in zip(before, runtime.logic.model.parameters()))
    assert not runtime.logic.pending  # nothing was kept for the protocol half
    with pytest.raises(MessageError, match="takes a FitIns"):  # the strategy sends nothing untyped
        strategy.ask("local_update", {0: {"round": 0}})
    done = strategy.ask("local_update", {0: FitIns(0)})
    assert isinstance(done[0], FitRes) and done[0].trained
