"""DP noise is unpredictable: drawn from an OS-keyed AES-CTR keystream, never from --seed.

The regeneration attack on seed-derived noise is replayed here: the attacker
knows everything in ``result.json`` and the checkpoint, reruns the same configuration and
subtracts its noise from the victim's uploads.  Tolerances are >= 6 standard errors.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from support.runs import protocol_maker

import secure_fgl.experiment as experiment
from protocols import DPRequest, Transcript
from protocols.csprng import SecureRandom
from protocols.dp import DPConfig, DPEngine
from secure_fgl.config import RunConfig
from secure_fgl.engine.trainer import CHECKPOINT
from secure_fgl.experiment import run_experiment

SMALL = {"num_nodes": 300, "num_features": 64, "num_classes": 3}


def dp_cfg(out, **kw) -> RunConfig:
    base = dict(
        algorithm="fedavg",
        mode="plain",
        dataset="sbm",
        clients=3,
        rounds=1,
        synthetic=dict(SMALL),
        seed=0,
        dp_epsilon=8.0,
        dp_clip=1.0,
        out=str(out),
    )
    base.update(kw)
    return RunConfig(**base)


def run_capturing_protocol(cfg: RunConfig, monkeypatch) -> tuple[dict, object]:
    """``run_experiment(cfg)`` and the protocol object it used (the server's view)."""
    made = []
    module, name = protocol_maker(cfg)
    real = getattr(module, name)

    def make(*args, **kw):
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(module, name, make)
    # the server's view: every payload it read (a run keeps them only for --attacks)
    monkeypatch.setattr(experiment, "run_transcript", lambda cfg: Transcript(keep_payloads="latest"))
    result = run_experiment(cfg, progress=False)
    monkeypatch.setattr(module, name, real)
    return result, made[0]


def uploads(protocol, tag: str = "fedavg/model") -> dict[str, np.ndarray]:
    return {
        m.sender: np.asarray(m.payload["values"], dtype=np.float64).ravel()
        for m in protocol.transcript.select(tag=tag, round=0, receiver="server")
    }


def test_regeneration_attack_leaves_noise_level_residual(tmp_path, monkeypatch):
    """Regeneration attack leaves noise level residual.

    Rerun with everything the victim's result.json and checkpoint hold (seed, config, DP
    state): the attacker's noise is independent of the victim's, so victim - rerun has std
    sqrt(2) sigma per entry (the clipped updates themselves are identical), not ~1e-6.
    """
    victim, victim_proto = run_capturing_protocol(dp_cfg(tmp_path / "victim"), monkeypatch)
    public = json.loads((tmp_path / "victim" / "result.json").read_text())
    assert (tmp_path / "victim" / CHECKPOINT).exists()
    attacker_cfg = RunConfig.from_dict({**public["config"], "out": str(tmp_path / "attacker")})
    _, attacker_proto = run_capturing_protocol(attacker_cfg, monkeypatch)
    sigma = victim_proto.dp.noise_multiplier("fedavg/model") * 1.0  # per upload, local placement
    seen, regenerated = uploads(victim_proto), uploads(attacker_proto)
    assert seen.keys() == regenerated.keys() and len(seen) == 3
    residual = np.concatenate([seen[c] - regenerated[c] for c in seen])
    assert residual.size > 3_000  # std within 8% = 6.5 standard errors
    assert np.std(residual) == pytest.approx(math.sqrt(2) * sigma, rel=0.08)


def test_noise_key_comes_from_os_urandom_and_is_never_written(tmp_path, monkeypatch):
    """Noise key comes from os urandom and is never written.

    Every key byte comes from os.urandom (a fixed fake key makes two generators agree),
    and the key appears in no file of the run (raw, hex, or as a list of byte values).
    """
    key = bytes(range(100, 132))
    calls = []

    def fake_urandom(n: int) -> bytes:
        calls.append(n)
        return key[:n] if n <= 32 else os.urandom.__wrapped__(n)

    fake_urandom.__wrapped__ = os.urandom
    monkeypatch.setattr(os, "urandom", fake_urandom)
    a, b = SecureRandom(), SecureRandom()
    assert calls == [32, 32]
    assert np.array_equal(a.words(64), b.words(64))  # the key is the only entropy
    monkeypatch.setattr(os, "urandom", fake_urandom.__wrapped__)
    assert not np.array_equal(SecureRandom().words(64), SecureRandom().words(64))

    monkeypatch.setattr(os, "urandom", fake_urandom)
    run_experiment(dp_cfg(tmp_path / "run", rounds=2), progress=False)
    assert 32 in calls[2:]
    forms = [key, key.hex().encode(), json.dumps(list(key))[1:-1].encode(), ", ".join(map(str, key)).encode()]
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]  # the clients' checkpoints too
    assert files
    for path in files:
        blob = path.read_bytes()
        assert not any(f in blob for f in forms), f"noise key written into {path.name}"


def discrete_gaussian_moments(sigma: float) -> tuple[float, float]:
    """Exact (variance, fourth moment) of N_Z(0, sigma^2) by summing its support."""
    x = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41, dtype=np.float64)
    p = np.exp(-x * x / (2 * sigma * sigma))
    p /= p.sum()
    return float(np.sum(p * x * x)), float(np.sum(p * x**4))


@pytest.mark.parametrize("sigma", [0.5, 2.0, 12.8, 300.0])
def test_discrete_gaussian_integer_with_exact_variance(sigma):
    n = 200_000
    x = SecureRandom().discrete_gaussian(sigma, (n,))
    assert np.array_equal(x, np.round(x))
    var, m4 = discrete_gaussian_moments(sigma)
    se_var = math.sqrt((m4 - var * var) / n)
    assert abs(np.mean(x * x) - var) < 6 * se_var
    assert abs(np.mean(x)) < 6 * math.sqrt(var / n)


def test_continuous_samplers_have_stated_moments():
    rng, n = SecureRandom(), 400_000
    u = rng.uniform((n,))
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n)
    z = rng.standard_normal((n,))
    assert abs(z.mean()) < 6 / math.sqrt(n) and abs(np.mean(z * z) - 1) < 6 * math.sqrt(2 / n)
    assert abs(np.mean(z**4) - 3) < 6 * math.sqrt(96 / n)  # Var(z^4) = 105 - 9 = 96


def test_engine_noise_is_fresh_per_engine_and_not_picklable():
    eng = [DPEngine(DPConfig(epsilon=1.0), num_clients=2, protocol_mode="plain") for _ in range(2)]
    out = [e.privatize_vectors("t", 0, {0: np.zeros(20_000)}, DPRequest(clip=1.0))[0] for e in eng]
    assert np.std(out[0] - out[1]) == pytest.approx(math.sqrt(2) * eng[0].noise_multiplier("t"), rel=0.05)
    import pickle

    with pytest.raises(TypeError, match="never serialised"):
        pickle.dumps(eng[0]._noise)
