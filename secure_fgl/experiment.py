"""One experiment end to end: data -> partition -> protocol -> algorithm -> rounds -> (attacks) -> ``result.json``.

The CLI, the report sweeps and the examples call
:func:`run_experiment`; it is the API a researcher scripts against.

``result.json`` (written atomically; schema ``secure_fgl/schemas/result.schema.json``, version
policy in :mod:`secure_fgl.results`):

* ``schema_version``, ``secure_fgl_version``, ``git_commit``, ``started_at``, ``finished_at``,
  ``library_versions`` — provenance; ``status`` — ``attacks_running`` or ``complete``;
* ``config``  — the full :class:`RunConfig` (``options`` with every default filled in);
* ``options`` — the algorithm's resolved options; ``device`` — the device actually used;
* ``final``   — ``test_acc`` (fraction, at the best-validation round), ``val_acc``,
  ``last_test_acc``, ``best_round``, ``per_client`` and algorithm-specific metrics;
* ``rounds``  — per-round metrics;
* ``comm``    — ``bytes_up``/``bytes_down``/``bytes_p2p`` in total and ``per_tag``, from the transcript;
* ``time``    — seconds per phase (data, setup = pre-training exchanges, train, eval, attacks, total);
* ``privacy`` — unit, epsilon spent, delta, accountant and every release (:mod:`secure_fgl.privacy`),
  or ``null`` without DP;
* ``attacks`` — attack results (a list) when ``--attacks`` was given (failures recorded inside);
* ``files``   — the run folder's other files (``best_model.pt``, ``checkpoint.pt``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import nullcontext
from pathlib import Path

from .config import RunConfig
from .data.load import load_federation
from .engine.device import resolve_device, seed_everything
from .engine.files import write_json_atomic
from .engine.hooks import finish_hooks, make_hooks
from .engine.progress import Phases
from .engine.trainer import train
from .engine.transcript_state import SIDE_FILE, TranscriptState
from .manifest import accepted_keys, threat_model
from .preflight import preflight
from .privacy import privacy_section
from .provenance import now_utc, provenance
from .results import SCHEMA_VERSION, accuracy_at_chance
from .run_identity import fingerprint, resolved_config, write_run_file
from .runtime.build import (
    make_executor,
    make_run_protocol,
    make_runtime_protocol,
    make_strategy,
    run_transcript,
    sites_hold_data,
)

__all__ = ["run_experiment", "load_federation", "make_run_protocol", "DP_LEDGER"]

#: the DP accountant's state after the latest release, written before that release's upload
#: leaves: a run resumed after a crash counts releases its checkpoint missed
DP_LEDGER = "dp_ledger.json"


def run_experiment(cfg: RunConfig, *, progress: bool = True, fed=None, phases: Phases | None = None) -> dict:
    """Run one configuration; returns the result dict (also written to ``cfg.out``).

    Every setting is checked (:func:`~secure_fgl.preflight.preflight`) before any data is
    loaded.  With ``cfg.out``, ``result.json`` is written once training ends (``status:
    attacks_running`` when attacks follow) and rewritten after the attacks (``complete``).
    When an exception escapes, the executor the run started (Ray, the local runtimes, Flower)
    is shut down before it propagates.

    Args:
        cfg: The run's settings.
        progress: Print the progress of each phase.
        fed (object): An already loaded federation (its data is then not loaded again).
        phases: The timer of the run's phases (default: one made with ``progress``).

    Returns:
        The result dict, as written to ``result.json``.
    """
    opened: list = []  # the executor, once made
    try:
        return _run_experiment(cfg, progress, fed, phases, opened)
    except BaseException:
        for executor in opened:
            try:
                executor.shutdown()
            except Exception as e:  # the run's own error is the one to report
                print(f"warning: shutting the executor down after the error failed: {type(e).__name__}: {e}")
        raise


def _run_experiment(cfg: RunConfig, progress: bool, fed, phases: Phases | None, opened: list) -> dict:
    started = provenance()
    site_data = fed is None and sites_hold_data(cfg)  # the driver loads no data (docs/deployment.md)
    options = preflight(cfg, check_data=fed is None and not site_data)
    t_start = time.perf_counter()
    times: dict[str, float] = {}
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    out_dir = Path(cfg.out) if cfg.out else None
    phases = phases if phases is not None else Phases(enabled=progress)
    config = resolved_config(cfg, options)
    before = {"elapsed": 0.0}  # seconds spent by the sessions before a --resume

    t0 = time.perf_counter()
    if fed is None and not site_data:
        with phases("data", f"loading {cfg.dataset} and partitioning it over {cfg.clients} clients ({cfg.partition})"):
            fed = load_federation(cfg)
    times["data"] = time.perf_counter() - t0
    if out_dir is not None:  # after every check the data can fail
        write_run_file(out_dir, config, started)  # the run's identity (run_identity.py)
        phases.log(f"run folder: {out_dir}")

    # one runtime per client and the algorithm's server strategy (docs/runtime.md)
    t0 = time.perf_counter()
    # a cluster's start-up (Ray, its actors, the client runtimes on them) is a phase of its own
    with phases("startup", "starting Ray and the client runtimes") if cfg.executor == "ray" else nullcontext():
        executor = make_executor(cfg, str(device))
        opened.append(executor)
        if site_data:  # the public facts and data digests, from the sites
            fed = executor.federation(cfg)
        protocol = make_runtime_protocol(cfg, fed.num_clients, executor, run_transcript(cfg))
        algo = make_strategy(cfg, fed, protocol, options, executor)
    if cfg.executor == "ray":
        times["startup"] = time.perf_counter() - t0

    # checkpoints are written only with an --out folder; the transcript's lines go to a side file there
    transcript_state = TranscriptState(protocol.transcript, out_dir / SIDE_FILE) if out_dir is not None else None

    def save_extra():
        return {
            "transcript": transcript_state.encode(),
            "plaintext_equiv": {k: list(v) for k, v in protocol.transcript.plaintext_equiv.items()},
            "batches": {k: [list(p) for p in v] for k, v in protocol.transcript.batches.items()},
            "dp": protocol.dp.state_dict() if protocol.dp is not None and hasattr(protocol.dp, "state_dict") else None,
            "setup_time": times.get("setup", 0.0),
            "elapsed": before["elapsed"] + time.perf_counter() - t_start,
        }

    def load_extra(extra):
        transcript_state.restore(extra["transcript"])
        protocol.transcript.plaintext_equiv = {k: list(v) for k, v in extra["plaintext_equiv"].items()}
        for k, v in (extra.get("batches") or {}).items():
            protocol.transcript.attribute(k, tuple(tuple(p) for p in v))
        if extra.get("dp") is not None and protocol.dp is not None:
            protocol.dp.load_state_dict(extra["dp"], ledger=json.loads(ledger.read_text()) if ledger.exists() else None)
        times["setup"] = extra.get("setup_time", 0.0)
        before["elapsed"] = extra.get("elapsed", 0.0)

    resuming = cfg.resume and out_dir is not None and (out_dir / "checkpoint.pt").exists()
    if protocol.dp is not None and out_dir is not None:  # write-ahead record of every DP release
        ledger = out_dir / DP_LEDGER
        if not cfg.resume:
            ledger.unlink(missing_ok=True)
        elif not resuming and ledger.exists():  # crashed before the first checkpoint
            protocol.dp.load_state_dict(protocol.dp.state_dict(), ledger=json.loads(ledger.read_text()))
        protocol.dp.on_release = lambda dp_state: write_json_atomic(ledger, dp_state)
    t0 = time.perf_counter()
    if not resuming:
        with phases("setup", f"{cfg.mode} keys and {cfg.algorithm}'s pre-training exchanges"):
            algo.setup()
        times["setup"] = time.perf_counter() - t0
    hooks = make_hooks(
        out_dir,
        log=tuple(x for x in cfg.log.split(",") if x),
        save_best=cfg.save_best_model,
        resume=resuming,
        config=config,
    )
    state = train(algo, cfg, out_dir, progress=progress, extra_state=(save_extra, load_extra), hooks=hooks)
    times.update(state.time)

    best = state.best or algo.evaluate()
    final = {
        "test_acc": best["test_acc"],
        "val_acc": best["val_acc"],
        "train_acc": best["train_acc"],
        "test_acc_client_mean": best["test_acc_client_mean"],
        "best_round": state.best_round,
        "last_test_acc": state.rounds[-1]["test_acc"] if state.rounds else None,
        "rounds_run": state.next_round,
        "stopped_early": state.stopped_early,
        "per_client": best["per_client"],
        **algo.final_metrics(),
    }
    final["at_chance"] = accuracy_at_chance(final["test_acc"], getattr(fed, "num_classes", None))
    if final["at_chance"]:
        phases.log(
            f"warning: test accuracy {final['test_acc']:.3f} is at chance (1/{fed.num_classes} classes = "
            f"{1 / fed.num_classes:.3f}): the model learned nothing"
            + (" -- the DP noise may drown the signal" if cfg.dp_epsilon is not None else "")
        )

    result = {
        "schema_version": SCHEMA_VERSION,
        **started,
        "finished_at": None,
        "status": "complete",
        "config": config,
        "config_fingerprint": fingerprint(config),
        "options": dataclasses.asdict(options),
        "device": str(device),
        "num_clients": fed.num_clients,
        "final": final,
        "rounds": state.rounds,
        "comm": protocol.transcript.comm(),
        "time": times,
        "privacy": privacy_section(cfg, algo, protocol),
        "attacks": [],
        "num_classes": getattr(fed, "num_classes", None),
        "files": _files(out_dir),
    }
    for line in (result["privacy"] or {}).get("warnings", []) + (result["privacy"] or {}).get("uncovered", []):
        print(f"privacy warning: {line}")
    if cfg.attacks:
        result["status"] = "attacks_running"
        _write(out_dir, result)  # training is never lost to an attack failure
        t0 = time.perf_counter()
        with phases("attacks", f"{', '.join(cfg.attacks)} on the finished run"):
            result["attacks"] = _run_attacks(cfg, algo, protocol, fed)
        times["attacks"] = time.perf_counter() - t0
        result["status"] = "complete"
    result["comm"] = protocol.transcript.comm()
    # what each client accepted, pinned by the run manifest (protocols/manifest.py)
    result.update(accepted_keys(protocol, executor, algo.alive()))
    result["threat_model"] = threat_model(cfg, protocol)
    result["runtime"] = {**executor.describe(), "stats": dataclasses.asdict(executor.stats)}
    t0 = time.perf_counter()
    executor.shutdown()
    if cfg.executor == "ray":
        times["shutdown"] = time.perf_counter() - t0
    times["total"] = before["elapsed"] + time.perf_counter() - t_start
    result["finished_at"] = now_utc()
    result["files"] = _files(out_dir)
    _write(out_dir, result)
    finish_hooks(hooks, result)
    return result


def _run_attacks(cfg: RunConfig, algo, protocol, fed) -> list[dict]:
    """The attack entries; a crash of the runner itself becomes one entry with its error."""
    from attacks.runner import run_attacks  # top layer: attacks read the finished run

    try:
        return run_attacks(cfg.attacks, algo=algo, protocol=protocol, fed=fed, cfg=cfg)
    except Exception as e:  # the run's result must survive; the error is recorded in it
        return [{"name": "attack_runner", "applicable": False, "error": f"{type(e).__name__}: {e}"}]


def _files(out_dir: Path | None) -> dict:
    """Files of the run folder (name -> what it holds)."""
    if out_dir is None:
        return {}
    what = {
        "checkpoint.pt": "last-round state for --resume (private: 0600)",
        "best_model.pt": "weights at the best-validation round (torch.load(..., weights_only=True))",
        "rounds.csv": "per-round metrics",
        "tensorboard": "TensorBoard scalars",
        "wandb": "Weights & Biases run files",
        "mlflow.db": "MLflow runs",
        "mlartifacts": "MLflow artifacts",
        "run.log": "progress log",
        SIDE_FILE: "the transcript's messages without payloads (checkpoint.pt holds their count and SHA-256)",
    }
    return {name: desc for name, desc in what.items() if (out_dir / name).exists()}


def _write(out_dir: Path | None, result: dict) -> None:
    if out_dir is not None:
        write_json_atomic(out_dir / "result.json", result)
