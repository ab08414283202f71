"""The run manifest: canonical bytes, run id, comparison code; ``secure-fgl keys`` / ``manifest``."""

import json
import stat

import pytest

from protocols import make_protocol
from protocols.auth import SigningKey
from protocols.errors import ConfigurationError
from protocols.manifest import Manifest
from secure_fgl.cli.main import main


def _parties(n=3):
    return {"server": SigningKey().fingerprint, **{f"client{k}": SigningKey().fingerprint for k in range(n)}}


def test_canonical_bytes_and_digest_do_not_depend_on_field_order():
    m = Manifest.new("mask", _parties(), {"b": 1, "a": [1, 2]}, {"colluders": 1}, "ab" * 32)
    doc = m.to_dict()
    shuffled = json.dumps({k: doc[k] for k in reversed(list(doc))}, indent=2).encode()
    again = Manifest.from_bytes(shuffled)
    assert again == m and again.to_bytes() == m.to_bytes() and again.run_id == m.run_id
    assert len(m.run_id) == 16 and len(m.comparison_code) == 39  # 32 base32 characters (160 bits), 8 groups


@pytest.mark.parametrize(
    "field,value",
    [
        ("mode", "ckks"),
        ("options", {"b": 2, "a": [1, 2]}),
        ("security", {"colluders": 2}),
        ("schedule", "cd" * 32),
        ("nonce", "00" * 16),
    ],
)
def test_every_field_changes_the_run_id_and_the_code(field, value):
    m = Manifest.new("mask", _parties(), {"b": 1, "a": [1, 2]}, {"colluders": 1}, "ab" * 32)
    other = Manifest.from_dict({**m.to_dict(), field: value})
    assert other.run_id != m.run_id and other.comparison_code != m.comparison_code


def test_a_changed_fingerprint_changes_the_run_id():
    m = Manifest.new("mask", _parties())
    other = Manifest.from_dict({**m.to_dict(), "parties": {**m.parties, "client1": SigningKey().fingerprint}})
    assert other.run_id != m.run_id


@pytest.mark.parametrize(
    "parties",
    [{"client0": "0" * 64}, {"server": "0" * 64, "client1": "0" * 64}, {"server": "0" * 64, "client0": "XYZ"}],
)
def test_malformed_party_lists_are_refused(parties):
    with pytest.raises(ConfigurationError):
        Manifest.new("mask", parties)


def test_facade_pins_every_half_to_its_manifest():
    p = make_protocol("mask", 3)
    assert p.run_id == p.manifest.run_id == p.setup.run_id
    assert p.server.registry.pinned == p.manifest.parties
    for k, half in p.clients.items():
        assert half.registry.pinned == p.manifest.parties and half.manifest is p.manifest
        assert half.signing.fingerprint == p.manifest.parties[f"client{k}"]
        assert half.parameter("sample_seed") == p.seed


def test_keys_new_writes_an_owner_only_key_and_prints_its_fingerprint(tmp_path, capsys):
    assert main(["keys", "new", "--out", str(tmp_path / "site")]) == 0
    printed = capsys.readouterr().out
    key_file = tmp_path / "site" / "identity.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    fingerprint = SigningKey.load(key_file).fingerprint
    assert f"fingerprint:  {fingerprint}" in printed
    assert main(["keys", "show", str(tmp_path / "site")]) == 0 and capsys.readouterr().out.strip() == fingerprint
    assert main(["keys", "new", "--out", str(tmp_path / "site")]) == 2  # never overwritten
    assert SigningKey.load(key_file).fingerprint == fingerprint


def test_manifest_new_and_verify(tmp_path, capsys):
    fps = {}
    for party in ("server", "client0", "client1"):
        main(["keys", "new", "--out", str(tmp_path / party)])
        fps[party] = SigningKey.load(tmp_path / party / "identity.key").fingerprint
    capsys.readouterr()
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"mode": "mask", "clients": 2, "dataset": "synthetic"}))
    out = tmp_path / "manifest.json"
    args = ["manifest", "new", "--config", str(config), "--out", str(out)]
    assert main(args + [a for p, fp in fps.items() for a in ("--party", f"{p}={fp}")]) == 0
    code = Manifest.from_bytes(out.read_bytes()).comparison_code
    assert f"comparison code: {code}" in capsys.readouterr().out
    verify = ["manifest", "verify", str(out), "--config", str(config)]
    assert main(verify + ["--key", str(tmp_path / "client1"), "--as", "client1"]) == 0
    assert code in capsys.readouterr().out
    assert main(verify + ["--key", str(tmp_path / "client1"), "--as", "client0"]) == 2  # not client0's key
    assert "client0's fingerprint" in capsys.readouterr().err
    config.write_text(json.dumps({"mode": "mask", "clients": 2, "dataset": "synthetic", "seed": 7}))
    assert main(verify) == 2  # another schedule / seed
    assert "sample_seed" in capsys.readouterr().err
    assert main(["manifest", "verify", str(tmp_path / "missing.json")]) == 2  # one line, no traceback
    assert "does not exist" in capsys.readouterr().err


def test_result_records_the_keys_each_client_accepted():
    """Result records the keys each client accepted.

    The manifest reaches the client runtimes from the driver; each client's registry (not the
    server's) is what result.json records, and it holds the manifest's identity keys.
    """
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    cfg = RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=3,
        mode="mask",
        rounds=1,
        synthetic={"num_nodes": 200, "num_features": 16},
    )
    result = run_experiment(cfg, progress=False)
    accepted = result["key_fingerprints"]
    assert sorted(accepted) == ["client0", "client1", "client2"]
    for client, keys in accepted.items():
        assert sorted(keys) == ["client0", "client1", "client2", "server"]
        assert all("channel" in v for p, v in keys.items() if p != "server")
    servers = {keys["server"]["signing"] for keys in accepted.values()}
    assert len(servers) == 1 and len(result["manifest"]["comparison_code"]) == 39
