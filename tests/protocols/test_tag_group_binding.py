"""Related-input tags summed over one contributor set per round (the public schedule's ``groups``).

FedSpray's batch carries the encoder's vector of the same local update: a server that sums the batch over every
client and the encoder over all but the victim (one round) reads the victim's update as the difference.  The
once-per-(round, tag) rule compares repeats of one tag only; the schedule's groups extend it across tags.  Each
client refuses, before it sends anything, a plan for a group member whose contributors differ from the set the
group's first sum of the round was released over, and in mask refuses to sign a survivor set that differs from it
(a dropout the server claims): ContributorSetMismatchError.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols import ValueSpec, make_protocol
from protocols.errors import ContributorSetMismatchError
from protocols.schedule import BROADCAST

K, VICTIM = 4, 1
SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
ROLES = {"batch": BROADCAST, "encoder": BROADCAST, "proxies": BROADCAST}
#: FedSpray's groups: the batch holds the encoder's vector and the proxies' (encoder and proxies share no input)
GROUPS = (("batch", "encoder"), ("batch", "proxies"))
X = {k: np.full(5, 0.1 * (k + 1)) for k in range(K)}


def _protocol(mode="mask", server_mixin=None, groups=GROUPS):
    cls = make_protocol(mode, K).__class__
    if server_mixin is not None:
        server = type(f"Malicious{cls.server_half.__name__}", (server_mixin, cls.server_half), {})
        cls = type(f"Malicious{cls.__name__}", (cls,), {"server_half": server})
    return cls(K, roles=ROLES, groups=[list(g) for g in groups])


def _sent(proto, tag):
    """The contributions uploaded under ``tag`` (mask: masked vectors; ckks-mp: ciphertexts)."""
    kinds = ("masked", "ciphertext")
    return [m for m in proto.transcript.messages if m.tag == tag and m.sender != "server" and m.kind in kinds]


class ClaimedDropoutServer:
    """Drops the victim's masked upload of the encoder sum, as if it had left: the survivors are the others."""

    def call(self, link, stage, messages, *, hook=True):
        got = super().call(link, stage, messages, hook=hook)
        if stage == "masked_upload" and self.plan.tag == "encoder":
            got.pop(VICTIM, None)
        return got


@pytest.mark.parametrize("mode", ["mask", "ckks-mp"])
def test_a_group_member_over_other_contributors_is_refused_before_anything_is_sent(mode):
    proto = _protocol(mode)
    proto.weighted_sum("batch", 0, X, spec=SPEC, recipients=range(K))
    with pytest.raises(ContributorSetMismatchError, match="related inputs") as err:
        proto.weighted_sum("encoder", 0, {k: X[k] for k in range(K) if k != VICTIM}, spec=SPEC, recipients=range(K))
    assert (err.value.tag, err.value.round) == ("encoder", 0)
    assert not _sent(proto, "encoder")


def test_a_claimed_dropout_in_a_group_member_is_refused_before_unmasking():
    proto = _protocol(server_mixin=ClaimedDropoutServer)
    proto.weighted_sum("batch", 0, X, spec=SPEC, recipients=range(K))
    with pytest.raises(ContributorSetMismatchError, match="related inputs"):
        proto.weighted_sum("encoder", 0, X, spec=SPEC, recipients=range(K))
    assert not [m for m in proto.transcript.messages if m.tag == "encoder" and m.kind == "share"]


def test_group_members_over_one_set_tags_in_no_common_group_and_other_rounds_complete():
    proto = _protocol()
    total, fewer = sum(X.values()), {k: X[k] for k in range(K) if k != VICTIM}
    assert np.allclose(proto.weighted_sum("batch", 0, X, spec=SPEC, recipients=range(K)), total, atol=1e-2)
    assert np.allclose(proto.weighted_sum("encoder", 0, X, spec=SPEC, recipients=range(K)), total, atol=1e-2)
    assert np.allclose(
        proto.weighted_sum("encoder", 1, fewer, spec=SPEC, recipients=range(K)), total - X[VICTIM], atol=1e-2
    )
    # encoder and proxies share no input (FedSpray without the batch): a client lost between them is no leak
    assert np.allclose(proto.weighted_sum("encoder", 2, X, spec=SPEC, recipients=range(K)), total, atol=1e-2)
    assert np.allclose(
        proto.weighted_sum("proxies", 2, fewer, spec=SPEC, recipients=range(K)), total - X[VICTIM], atol=1e-2
    )


def test_without_the_group_the_difference_of_two_tags_is_the_victims_input():
    """What the group closes: with no group the two sums complete and differ by the victim's vector."""
    proto = _protocol(groups=())
    every = proto.weighted_sum("batch", 0, X, spec=SPEC, recipients=range(K))
    fewer = proto.weighted_sum("encoder", 0, {k: X[k] for k in range(K) if k != VICTIM}, spec=SPEC, recipients=range(K))
    assert np.allclose(every - fewer, X[VICTIM], atol=1e-2)
