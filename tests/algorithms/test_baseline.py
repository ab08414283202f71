"""One float32 byte baseline, the same number in every mode.

One float32 byte baseline (protocols/baseline.py): the same number in every mode, and the
one FedGCN's final metrics and the transcript's ``comm`` report.
"""

from __future__ import annotations

import pytest

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment

MODES = ("plain", "ckks", "mask")


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_float32_baseline_is_equal_across_modes(layout):
    cfg = dict(algorithm="fedgcn", dataset="sbm", clients=3, rounds=1, seed=2, options={"layout": layout})
    fed = load_federation(RunConfig(**cfg))
    runs = {m: run_experiment(RunConfig(mode=m, **cfg), progress=False, fed=fed) for m in MODES}
    per_tag = {
        m: {
            t: (v["plaintext_bytes_up"], v["plaintext_bytes_down"])
            for t, v in r["comm"]["per_tag"].items()
            if "plaintext_bytes_up" in v
        }
        for m, r in runs.items()
    }
    assert per_tag["plain"] and per_tag["ckks"] == per_tag["plain"] == per_tag["mask"]
    sums = per_tag["plain"]["fedgcn/neighbour_sums"]
    width = fed.num_features + 1
    for m, r in runs.items():
        fin = r["final"]
        assert (fin["pretrain_plaintext_equiv_bytes_up"], fin["pretrain_plaintext_equiv_bytes_down"]) == sums
        if layout == "dense":
            assert sums == (3 * fed.graph.num_nodes * width * 4,) * 2
    # the plain protocol's own upload of the sums is the baseline plus its block ids (sparse)
    plain_up = runs["plain"]["comm"]["per_tag"]["fedgcn/neighbour_sums"]["bytes_up"]
    assert plain_up >= sums[0]
