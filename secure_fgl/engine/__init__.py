"""Rounds, evaluation, checkpoints, devices and randomness.

One module per concept, imported by name (nothing is imported here, so a client logic that needs
only :mod:`.rng` does not load the round loop): :mod:`.trainer` (``train``, ``TrainState``),
:mod:`.device` (``resolve_device``, ``seed_everything``), :mod:`.rng`, :mod:`.checkpoint`,
:mod:`.hooks`, :mod:`.progress`.
"""
