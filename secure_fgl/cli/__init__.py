"""The ``secure-fgl`` command line."""
