"""Benchmarks that print measured costs and ratios (``secure-fgl bench --suite NAME``)."""
