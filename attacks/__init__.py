"""Leakage attacks on a finished run: each reads what its observer holds and is scored against the ground truth."""
