"""One experiment end to end: data -> partition -> protocol -> algorithm -> rounds ->
(attacks) -> ``result.json``.  The CLI, the report sweeps and the examples call
:func:`run_experiment`; it is the API a researcher scripts against.

``result.json`` (written atomically):

* ``config``  — the full :class:`RunConfig`;
* ``final``   — ``test_acc`` (fraction, at the best-validation round), ``val_acc``,
  ``last_test_acc``, ``best_round``, ``per_client`` and algorithm-specific metrics;
* ``rounds``  — per-round metrics;
* ``comm``    — ``bytes_up``/``bytes_down``/``bytes_p2p`` in total and ``per_tag``, from the transcript;
* ``time``    — seconds per phase (data, setup = pre-training exchanges, train, eval, attacks, total);
* ``privacy`` — unit, epsilon spent, delta, accountant and every release (:mod:`secure_fgl.privacy`),
  or ``null`` without DP;
* ``attacks`` — attack results (a list) when ``--attacks`` was given.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from protocols import Transcript, make_protocol
from protocols.transcript import Message

from .algorithms import get_algorithm
from .config import ConfigError, RunConfig
from .engine import resolve_device, seed_everything, train
from .engine.files import write_json_atomic
from .privacy import dp_config, privacy_section

#: the DP accountant's state after the latest release, written before that release's upload
#: leaves: a run resumed after a crash counts releases its checkpoint missed
DP_LEDGER = "dp_ledger.json"


def build_options(cfg: RunConfig, algo_cls) -> Any:
    """The algorithm's Options dataclass filled from ``cfg.options`` (unknown keys refused)."""
    opts_cls = algo_cls.Options
    known = {f.name for f in dataclasses.fields(opts_cls)}
    unknown = set(cfg.options) - known
    if unknown:
        raise ConfigError(f"algorithm {cfg.algorithm!r} has no option(s) {', '.join(sorted(unknown))}"
                          + (f"; its options are {', '.join(sorted(known))}" if known else "; it takes none"))
    return opts_cls(**cfg.options)


def load_federation(cfg: RunConfig):
    from .data import make_federated
    return make_federated(dataset=cfg.dataset, num_clients=cfg.clients, partition=cfg.partition, beta=cfg.beta,
                          resolution=cfg.resolution, keep_largest=cfg.keep_largest, split=cfg.split,
                          seed=cfg.seed, data_root=cfg.data_root, **cfg.synthetic)


def make_run_protocol(cfg: RunConfig, num_clients: int, transcript: Transcript | None = None):
    return make_protocol(cfg.mode, num_clients, transcript=transcript, dp=dp_config(cfg), seed=cfg.seed)


def run_experiment(cfg: RunConfig, *, progress: bool = True, fed=None) -> dict:
    """Run one configuration; returns the result dict (also written to ``cfg.out``)."""
    cfg.validate()
    t_start = time.perf_counter()
    times: dict[str, float] = {}
    algo_cls = get_algorithm(cfg.algorithm)
    options = build_options(cfg, algo_cls)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    out_dir = Path(cfg.out) if cfg.out else None

    t0 = time.perf_counter()
    if fed is None:
        fed = load_federation(cfg)
    times["data"] = time.perf_counter() - t0

    protocol = make_run_protocol(cfg, fed.num_clients)
    algo = algo_cls(fed, protocol, cfg, device, options)

    def save_extra():
        return {"transcript": [dataclasses.asdict(m.without_payload()) for m in protocol.transcript.messages],
                "plaintext_equiv": {k: list(v) for k, v in protocol.transcript.plaintext_equiv.items()},
                "dp": protocol.dp.state_dict() if protocol.dp is not None and hasattr(protocol.dp, "state_dict")
                else None,
                "setup_time": times.get("setup", 0.0)}

    def load_extra(extra):
        protocol.transcript.messages = [Message(**m) for m in extra["transcript"]]
        protocol.transcript.plaintext_equiv = {k: list(v) for k, v in extra["plaintext_equiv"].items()}
        if extra.get("dp") is not None and protocol.dp is not None:
            protocol.dp.load_state_dict(extra["dp"], ledger=json.loads(ledger.read_text()) if ledger.exists() else None)
        times["setup"] = extra.get("setup_time", 0.0)

    resuming = cfg.resume and out_dir is not None and (out_dir / "checkpoint.pt").exists()
    if protocol.dp is not None and out_dir is not None:    # write-ahead record of every DP release
        ledger = out_dir / DP_LEDGER
        if not cfg.resume:
            ledger.unlink(missing_ok=True)
        elif not resuming and ledger.exists():             # crashed before the first checkpoint
            protocol.dp.load_state_dict(protocol.dp.state_dict(), ledger=json.loads(ledger.read_text()))
        protocol.dp.on_release = lambda dp_state: write_json_atomic(ledger, dp_state)
    t0 = time.perf_counter()
    if not resuming:
        algo.setup()
        times["setup"] = time.perf_counter() - t0
    state = train(algo, cfg, out_dir, progress=progress, extra_state=(save_extra, load_extra))
    times.update(state.time)

    best = state.best or algo.evaluate()
    final = {"test_acc": best["test_acc"], "val_acc": best["val_acc"], "train_acc": best["train_acc"],
             "test_acc_client_mean": best["test_acc_client_mean"], "best_round": state.best_round,
             "last_test_acc": state.rounds[-1]["test_acc"] if state.rounds else None,
             "rounds_run": state.next_round, "stopped_early": state.stopped_early,
             "per_client": best["per_client"], **algo.final_metrics()}

    result = {"config": cfg.to_dict(), "final": final, "rounds": state.rounds, "comm": None,
              "time": None, "privacy": privacy_section(cfg, algo, protocol), "attacks": [],
              "num_clients": fed.num_clients, "num_classes": fed.num_classes,
              "device": str(device)}
    for line in (result["privacy"] or {}).get("warnings", []) + (result["privacy"] or {}).get("uncovered", []):
        print(f"privacy: {line}")
    if cfg.attacks:
        t0 = time.perf_counter()
        from attacks.runner import run_attacks  # top layer: attacks read the finished run
        result["attacks"] = run_attacks(cfg.attacks, algo=algo, protocol=protocol, fed=fed, cfg=cfg)
        times["attacks"] = time.perf_counter() - t0
    result["comm"] = protocol.transcript.comm()
    times["total"] = time.perf_counter() - t_start
    result["time"] = times
    if out_dir is not None:
        write_json_atomic(out_dir / "result.json", result)
    return result
