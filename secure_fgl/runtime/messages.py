"""Typed requests and replies between a server strategy and its client logic.

In the manner of Flower's ``FitIns``/``FitRes``: each runtime method takes one request class and
answers one reply class (or nothing), and both sides hold dataclasses, never loose dicts:

==================  =====================  ====================  ===================================
method              request                reply                 the client task
==================  =====================  ====================  ===================================
``local_update``    :class:`FitIns`        :class:`FitRes`       local training
``contribute``      :class:`ContributeIns` :class:`ContributeRes` its contribution to an exchange
``privatize``       :class:`PrivatizeIns`  none                  its share of an exchange's DP noise
``receive``         :class:`ReceiveIns`    none                  use an exchange's decoded result
``evaluate``        :class:`EvaluateIns`   :class:`EvaluateRes`  its correct/total counts
``attack``          :class:`AttackIns`     :class:`StateRes`    its state for the attack suite
``save``/``load``   :class:`CheckpointIns` :class:`CheckpointRes` its checkpoint, where it runs
``weights``         :class:`WeightsIns`    :class:`StateRes`    its deployed model's parameters
==================  =====================  ====================  ===================================

The statistics exchanges (FedOMD's hidden moments, GCFL's norms) are contributions like any other:
a :class:`ContributeIns` whose ``config`` names the stage or the parts.

On the wire (:mod:`.wire`) a message is one flat frame: its declared fields by name (``None``
left out), then the entries of its open mapping (the one field named by ``OPEN``: an algorithm's
own settings or public values), so arrays and JSON values cross exactly as before and nothing is
unpickled.  :meth:`RuntimeMessage.from_fields` checks every declared field's type, refuses a missing one
and, for a class without an open mapping, any unknown name: a malformed frame raises
:class:`MessageError` naming the class and the field.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .wire import WireError


class MessageError(WireError):
    """A request or reply that is not what its runtime method takes (a missing, unknown or mistyped field)."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the type ``hint`` (the annotations this module uses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is np.ndarray:
        return isinstance(value, np.ndarray)
    if origin is list:
        return isinstance(value, (list, tuple)) and all(_conforms(v, args[0]) for v in value)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping)
    return hint is Any


class RuntimeMessage:
    """Base of every request and reply: the checked, flat wire form (module docstring)."""

    #: the field whose entries go on the wire as fields of their own (an algorithm's open mapping), or None
    OPEN: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if not _conforms(value, _hints(type(self))[f.name]):
                raise MessageError(
                    f"{type(self).__name__}.{f.name} cannot be {type(value).__name__} {value!r:.60}: "
                    f"it is {_hints(type(self))[f.name]}"
                )

    def to_fields(self) -> dict[str, Any]:
        """The flat mapping :func:`.wire.pack` writes: the declared fields (None left out), then the open mapping."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if f.name != self.OPEN and getattr(self, f.name) is not None
        }
        if self.OPEN is not None:
            extra = getattr(self, self.OPEN)
            clash = sorted(set(extra) & {f.name for f in dataclasses.fields(self)})  # type: ignore[arg-type]
            if clash:
                raise MessageError(f"{type(self).__name__}.{self.OPEN} repeats declared field(s) {clash}")
            out.update(extra)
        return out

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]):
        """The message a frame's fields hold; :class:`MessageError` if they are not this class's."""
        rest, kwargs = dict(fields), {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name == cls.OPEN:
                continue
            if f.name in rest:
                kwargs[f.name] = rest.pop(f.name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise MessageError(f"{cls.__name__} without its field {f.name!r}")
        if cls.OPEN is not None:
            kwargs[cls.OPEN] = rest
        elif rest:
            raise MessageError(f"{cls.__name__} has no field(s) {sorted(rest)}")
        return cls(**kwargs)

    def entry(self, name: str) -> Any:
        """Entry ``name`` of the open mapping; :class:`MessageError` naming it when absent."""
        extra = getattr(self, self.OPEN) if self.OPEN is not None else {}
        if name not in extra:
            raise MessageError(f"{type(self).__name__} of {getattr(self, 'tag', '')!r} without {name!r}")
        return extra[name]


# ---------------------------------------------------------------- requests (strategy -> client)
@dataclass(frozen=True)
class FitIns(RuntimeMessage):
    """Train locally in round ``round``.

    ``model``: which of the client's models (an algorithm with several, e.g. fedgcn-gap's encoder tag);
    ``dpsgd_tag``/``dpsgd_std``: DP-SGD, the release tag and the noise std of each local step.
    """

    round: int
    model: str | None = None
    dpsgd_tag: str | None = None
    dpsgd_std: list[float] | None = None


@dataclass(frozen=True)
class ContributeIns(RuntimeMessage):
    """Contribute to exchange ``tag`` of round ``round``: keep it for the protocol half, answer public facts.

    ``dp_clip``/``dp_weight_bound``: the client clips its contribution (a DP release); ``rpb``,
    ``num_blocks``, ``layout``: a row sum's public blocking (:func:`~.exchange.keep_rows`);
    ``config``: the algorithm's own public settings of the exchange (a hop, a statistics stage).
    """

    OPEN: ClassVar[str | None] = "config"

    tag: str
    round: int
    dp_clip: float | None = None
    dp_weight_bound: float | None = None
    rpb: int | None = None
    num_blocks: int | None = None
    layout: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrivatizeIns(RuntimeMessage):
    """Add this client's share of the DP noise of exchange ``tag`` to its kept contribution (:mod:`.dp`).

    ``std``: the share's std (one per uploaded block of a row sum); ``clip``, ``per_row``,
    ``integer``, ``grid_bits``: the release (:class:`protocols.DPRequest`); ``row_len``: a dense
    vector clipped per row; ``blocks``, ``rpb``, ``num_rows``, ``layout``: a row sum's blocks.
    """

    tag: str
    round: int
    std: float | np.ndarray
    clip: float
    per_row: bool
    integer: bool
    grid_bits: int | None = None
    row_len: int | None = None
    blocks: np.ndarray | None = None
    rpb: int | None = None
    num_rows: int | None = None
    layout: str | None = None


@dataclass(frozen=True)
class ReceiveIns(RuntimeMessage):
    """Read the decoded result of exchange ``tag`` (or act on a control message of that tag).

    ``length``: a dense sum's length; ``count``: DP-FedAvg's public number of contributors;
    ``rpb``: a row sum's rows per block; ``noise_std``/``dp_std``: the std of the DP noise in the
    result; ``dp_clip``/``dp_weight_bound``: the clip of a DP weighted mean; ``config``: the
    algorithm's own settings of the exchange.
    """

    OPEN: ClassVar[str | None] = "config"

    tag: str
    round: int
    length: int | None = None
    count: int | None = None
    rpb: int | None = None
    noise_std: float | None = None
    dp_std: float | None = None
    dp_clip: float | None = None
    dp_weight_bound: float | None = None
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EvaluateIns(RuntimeMessage):
    """Report correct/total counts per split (``model``: which of its models, default the deployed one)."""

    model: str | None = None


@dataclass(frozen=True)
class AttackIns(RuntimeMessage):
    """After the run, what this client holds for an attack (:meth:`~.logic.ClientLogic.attack_state`).

    ``what``: the kind of state; ``client``: whose view (a runtime holding several clients' nodes);
    ``x``: the features of a ``query``.
    """

    what: str
    client: int | None = None
    x: np.ndarray | None = None


@dataclass(frozen=True)
class CheckpointIns(RuntimeMessage):
    """Save the client's state to ``path`` where it runs, or load it from there (checked against ``sha256``)."""

    path: str
    sha256: str | None = None


@dataclass(frozen=True)
class WeightsIns(RuntimeMessage):
    """Hand over the deployed model's parameters (``best_model.pt``)."""


# ---------------------------------------------------------------- replies (client -> strategy)
@dataclass(frozen=True)
class FitRes(RuntimeMessage):
    """Whether the client had training nodes, its last local loss and any loss ``terms`` by name.

    ``loss`` None: the client keeps it (DP-SGD: a loss of un-noised gradients never leaves the client).
    """

    OPEN: ClassVar[str | None] = "terms"

    trained: bool
    loss: float | None = None
    terms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ContributeRes(RuntimeMessage):
    """The public facts of a kept contribution.

    ``length``: a dense vector's length; ``rows_up``, ``rows_down``, ``request_blocks``,
    ``upload_blocks``: a row sum's row counts and blocks (:func:`~.exchange.keep_rows`);
    ``public``: what else the algorithm answers in the open (a histogram, sealed row ids, a refusal).
    """

    OPEN: ClassVar[str | None] = "public"

    length: int | None = None
    rows_up: int | None = None
    rows_down: int | None = None
    request_blocks: np.ndarray | None = None
    upload_blocks: np.ndarray | None = None
    public: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EvaluateRes(RuntimeMessage):
    """The counts: ``split -> [correct, total]`` and whatever else the algorithm reports (``eval/counts``)."""

    OPEN: ClassVar[str | None] = "counts"

    counts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StateRes(RuntimeMessage):
    """A client's state by name (arrays and JSON values)."""

    OPEN: ClassVar[str | None] = "state"

    state: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointRes(RuntimeMessage):
    """The digest of the checkpoint written (``save``); nothing for ``load``."""

    sha256: str | None = None


#: runtime method -> (its request class, its reply class or None: an empty frame)
METHODS: dict[str, tuple[type[RuntimeMessage], type[RuntimeMessage] | None]] = {
    "local_update": (FitIns, FitRes),
    "contribute": (ContributeIns, ContributeRes),
    "privatize": (PrivatizeIns, None),
    "receive": (ReceiveIns, None),
    "evaluate": (EvaluateIns, EvaluateRes),
    "attack": (AttackIns, StateRes),
    "save": (CheckpointIns, CheckpointRes),
    "load": (CheckpointIns, CheckpointRes),
    "weights": (WeightsIns, StateRes),
}


def decode_request(method: str, fields: Mapping[str, Any]) -> RuntimeMessage:
    """The typed request of ``method`` from a frame's fields (:class:`MessageError` if malformed)."""
    if method not in METHODS:
        raise MessageError(f"client runtime has no method {method!r}; it answers {', '.join(METHODS)}")
    return METHODS[method][0].from_fields(fields)


def encode_request(method: str, request: RuntimeMessage) -> dict[str, Any]:
    """The wire fields of ``request``, refused unless it is ``method``'s request class."""
    if method not in METHODS:
        raise MessageError(f"client runtime has no method {method!r}; it answers {', '.join(METHODS)}")
    cls = METHODS[method][0]
    if not isinstance(request, cls):
        raise MessageError(
            f"{method} takes a {cls.__name__} (secure_fgl.runtime.messages), not {type(request).__name__}"
        )
    return request.to_fields()


def decode_reply(method: str, fields: Mapping[str, Any]) -> RuntimeMessage | None:
    """The typed reply of ``method`` from a frame's fields (None: a method that answers nothing)."""
    cls = METHODS[method][1]
    if cls is None:
        if fields:
            raise MessageError(f"{method} answers nothing, not {sorted(fields)}")
        return None
    return cls.from_fields(fields)


def encode_reply(method: str, reply: RuntimeMessage | None) -> dict[str, Any]:
    """The wire fields of ``reply``, refused unless it is ``method``'s reply class."""
    cls = METHODS[method][1]
    if cls is None and reply is None:
        return {}
    if cls is None or not isinstance(reply, cls):
        want = "nothing" if cls is None else cls.__name__
        raise MessageError(f"{method} answers {want}, not {type(reply).__name__}")
    return reply.to_fields()
