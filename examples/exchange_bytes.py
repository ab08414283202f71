"""Bytes up per tag over the float32 baseline of short secure runs (docs/performance.md).

``python examples/exchange_bytes.py fedomd``: FedOMD (preset ``fedomd-table4``, Cora, 3 rounds)
with the two-stage batched statistics (default) and ``--raw-moments``, in ckks and plain: the
statistics tags' bytes up over their float32 baseline.  ``python examples/exchange_bytes.py
fedgcn``: FedGCN (preset ``fedgcn-table2``, 2 rounds) in ckks, float and ``--fixed-point-bits 20
--update-bound 1``: every tag's ratio.  One JSON line per run.
"""

import json
import sys

from secure_fgl.config import RunConfig
from secure_fgl.experiment import run_experiment
from secure_fgl.presets import load_preset


def run(preset: str, overrides: dict, options: dict | None = None) -> dict:
    base = load_preset(preset)
    cfg = RunConfig.from_dict(
        {
            **base,
            "device": "cpu",
            "save_best_model": False,
            "patience": None,
            **overrides,
            "options": {**base.get("options", {}), **(options or {})},
        }
    ).validate()
    return run_experiment(cfg, progress=False)


def ratios(result: dict, select=lambda tag: True) -> dict:
    per_tag = {t: v for t, v in result["comm"]["per_tag"].items() if v.get("plaintext_bytes_up") and select(t)}
    up = sum(v["bytes_up"] for v in per_tag.values())
    f32 = sum(v["plaintext_bytes_up"] for v in per_tag.values())
    return {
        "bytes_up": up,
        "float32_up": f32,
        "ratio": up / f32,
        "per_tag": {t: round(v["bytes_up"] / v["plaintext_bytes_up"], 3) for t, v in per_tag.items()},
        "test_acc": result["final"]["test_acc"],
    }


def main(which: str) -> None:
    if which == "fedomd":
        for variant, options in (("two-stage", {}), ("raw-moments", {"raw_moments": True})):
            for mode in ("ckks", "plain"):
                r = run("fedomd-table4", {"dataset": "cora", "rounds": 3, "mode": mode}, options)
                print(json.dumps({"variant": variant, "mode": mode, **ratios(r, lambda t: "/hidden" in t)}), flush=True)
    else:
        for bits in (None, 20):
            extra = {"fixed_point_bits": bits, "update_bound": 1.0} if bits else {}
            r = run("fedgcn-table2", {"rounds": 2, "mode": "ckks", **extra})
            print(json.dumps({"fixed_point_bits": bits, **ratios(r)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fedomd")
