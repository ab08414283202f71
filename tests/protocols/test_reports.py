"""Clear-text reports played by the facade.

Clear-text reports (:func:`protocols.similarity.report_scalars`) played by the facade need the
client halves in this process; behind a link each client runtime reports its own values.
"""

import pytest

from protocols import ConfigurationError, make_protocol
from protocols.link import InProcessLink
from protocols.similarity import report_scalars


def test_in_process_halves_report_what_they_were_given():
    proto = make_protocol("plain", 3)
    assert report_scalars(proto, "norms", 0, {0: 1.5, 2: -0.25}) == {0: 1.5, 2: -0.25}


def test_without_in_process_halves_the_error_names_the_fix():
    proto = make_protocol("plain", 3, link=InProcessLink({}))
    with pytest.raises(ConfigurationError, match="each client runtime reports its own values"):
        report_scalars(proto, "norms", 0, {0: 1.5})
