"""The one exception type of the data layer.

Every problem a *user* can cause or fix (a missing dataset file, an impossible
partition, a bad split string) raises :class:`DataError` with a one-line message
that names the problem and the fix.  The CLI turns it into exit code 2; library
callers can catch it as a ``ValueError``.
"""

from __future__ import annotations


class DataError(ValueError):
    """A user-facing data problem; the message says what is wrong and how to fix it."""
