"""Memory at scale: a recipient keeps only the rows it asked for; compact integer rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protocols import ValueSpec, make_protocol
from protocols.party import ClientHalf
from protocols.row_blocks import RowSelection


def _row_sum_inputs(seed: int = 5, num_rows: int = 60, d: int = 3, clients: int = 3):
    rng = np.random.default_rng(seed)
    contributions = {
        k: (ids, rng.integers(0, 3, (ids.size, d)).astype(np.int16))
        for k, ids in ((k, np.sort(rng.choice(num_rows, 20, replace=False))) for k in range(clients))
    }
    # requests in any order, with a repeated row
    requests = {k: np.append(rng.choice(num_rows, 7, replace=False), 0) for k in range(clients)}
    exact = np.zeros((num_rows, d))
    for ids, rows in contributions.values():
        exact[ids] += rows
    return contributions, requests, exact


@pytest.mark.parametrize("mode", ("plain", "mask", "ckks"))
def test_recipient_holds_only_its_requested_rows(mode, monkeypatch):
    """Recipient holds only its requested rows.

    ``readable=False``: every block a recipient half keeps is cut to its requested rows (the
    rest of each block is dropped as decoded), the half forgets its result once read, and the
    sums equal the whole-block path's.
    """
    contributions, requests, exact = _row_sum_inputs()
    held: dict[int, int] = {}
    deliver = ClientHalf.deliver

    def spy(self, blocks):
        deliver(self, blocks)
        held[self.id] = sum(np.asarray(v).size for v in self._result[1].values())

    monkeypatch.setattr(ClientHalf, "deliver", spy)
    spec = ValueSpec(integer=True, max_abs=2.0, sum_max=6)  # exact in every mode
    whole = make_protocol(mode, 3).row_sum("r", 0, contributions, requests, 60, layout="sparse", spec=spec)
    proto = make_protocol(mode, 3)
    out = proto.row_sum("r", 0, contributions, requests, 60, layout="sparse", spec=spec, readable=False)
    for k, req in requests.items():
        np.testing.assert_array_equal(out[k], whole[k])
        np.testing.assert_array_equal(out[k], exact[req])
        assert held[k] == np.unique(req).size * 3  # only its rows, each once
        assert proto.clients[k]._result is None  # released once consumed
    assert len(proto.last_readable) == 0


def test_row_selection_takes_idempotently_and_assembles_in_request_order():
    rows = np.array([7, 2, 3, 7, 11])
    sel = RowSelection(rows, rows_per_block=4, dim=2)
    blocks = {b: np.arange(8, dtype=float) + 100 * b for b in (0, 1, 2)}
    kept = {b: sel.take(b, v) for b, v in blocks.items()}
    assert [kept[b].size for b in (0, 1, 2)] == [4, 2, 2]  # rows {2, 3}, {7}, {11}
    assert all(sel.take(b, v) is v for b, v in kept.items())  # idempotent
    full = {b: blocks[b].reshape(4, 2) for b in blocks}
    expected = np.stack([full[r // 4][r % 4] for r in rows])
    np.testing.assert_array_equal(sel.assemble(kept), expected)
    np.testing.assert_array_equal(sel.assemble(blocks), expected)
    with pytest.raises(ValueError, match="neither a whole block"):
        sel.take(0, np.zeros(3))


def test_kept_rows_of_integer_sums_are_stored_narrow_and_assembled_exactly():
    rows = np.array([5, 0, 6])
    sel = RowSelection(rows, rows_per_block=4, dim=3)
    counts = {0: np.arange(12, dtype=float), 1: np.arange(12, dtype=float) * 6000}  # kept up to 48,000 > int16
    fractions = {0: counts[0] + 0.5, 1: counts[1]}
    kept = {b: sel.take(b, v) for b, v in counts.items()}
    assert kept[0].dtype == np.int8 and kept[1].dtype == np.int32
    assert sel.take(1, kept[1]) is kept[1]  # still idempotent
    out = sel.assemble(kept)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.stack([counts[r // 4].reshape(4, 3)[r % 4] for r in rows]))
    mixed = {b: sel.take(b, v) for b, v in fractions.items()}
    assert mixed[0].dtype == np.float64  # 0.5 is no integer
    np.testing.assert_array_equal(sel.assemble(mixed), np.stack([fractions[r // 4].reshape(4, 3)[r % 4] for r in rows]))


def test_integer_rows_are_narrowed_exactly_and_others_kept():
    from secure_fgl.algorithms.fedgcn.ops import narrow_integer_rows

    counts = torch.tensor([[0.0, 255.0], [3.0, -2.0]], dtype=torch.float64)
    narrowed = narrow_integer_rows(counts)
    assert narrowed.dtype == torch.int16 and torch.equal(narrowed.to(torch.float64), counts)
    assert narrow_integer_rows(counts / 3).dtype == torch.float64
    assert narrow_integer_rows(torch.full((2, 2), 2.0**40)).dtype == torch.float32  # too wide: unchanged
