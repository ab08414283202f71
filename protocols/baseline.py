"""The float32 byte baseline: one definition, the same number in every mode.

Every mode's bytes are compared with what the plaintext protocol would carry: the values of
the exchange as float32, ``4`` bytes each, counting exactly the rows (or vector entries) the
plain protocol sends — never the transport padding, block ids, whole blocks or DP-expanded
rows of a particular backend, which differ between modes.

* :meth:`~protocols.base.Protocol.row_sum` with rows of width ``d``: *sparse* layout, client
  ``k`` uploads the ``m_k`` rows it contributes and downloads the ``r_k`` rows it requests,
  ``(m_k + r_k) d 4`` bytes; *dense* layout, every contributor uploads and every requester
  downloads all ``num_rows`` rows.
* vector sums and means (:meth:`~protocols.base.Protocol.weighted_sum` and the rest): each
  contributor uploads its vector of ``L`` entries (a weighted mean's ``[w v, w]``: ``L``
  includes the weight), each recipient downloads one.

:meth:`protocols.base.Protocol._run` records it per tag (``Transcript.plaintext_equiv``,
``comm()['per_tag'][tag]['plaintext_bytes_up']``); FedGCN's ``pretrain_plaintext_equiv_*``
metrics, the CLI summary and the benchmarks read the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

FLOAT32_BYTES = 4


def row_sum_bytes(
    rows_up: Mapping[int, int], rows_down: Mapping[int, int], dim: int, num_rows: int, layout: str
) -> tuple[dict[int, int], dict[int, int]]:
    """Per-client float32 bytes ``(up, down)`` of a row-keyed sum (module doc)."""

    def size(rows: int) -> int:
        return (num_rows if layout == "dense" else int(rows)) * int(dim) * FLOAT32_BYTES

    return {k: size(m) for k, m in rows_up.items()}, {k: size(r) for k, r in rows_down.items()}


def vector_sum_bytes(num_contributors: int, length: int, num_recipients: int) -> tuple[int, int]:
    """Total float32 bytes ``(up, down)`` of a sum of ``length``-entry vectors (module doc)."""
    per_vector = int(length) * FLOAT32_BYTES
    return num_contributors * per_vector, num_recipients * per_vector
