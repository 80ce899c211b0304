"""OT-2: installing the OpenTelemetry reporting adds no work to the CLOSED success path.

Checked on the code rather than the clock (``./dev bench --metrics`` gives the figures, its
``otel`` mode): the profile hook of the Prometheus hot-path test records every Python and C
function the calling thread enters during steady-state CLOSED calls, before ``install()``
and after it, with an SDK configured and the calls made inside a recording span.
"""

from __future__ import annotations

import os

import opentelemetry
import pytest

from baldur_django.contrib import otel
from baldur_django.core import hotpath
from baldur_django.core import wrappers as wrappers_module
from tests.closed_lane import profile, warm_batch


@pytest.mark.parametrize("style", ["decorated", "protect", "async"])
def test_ot2_installing_otel_leaves_the_closed_fast_lane_untouched(clock, telemetry, style):
    """OT-2: steady-state CLOSED successes enter exactly the same functions with the
    reporting installed and a recording span current as without it, none of contrib.otel's
    or opentelemetry's; they are still counted at the next collection."""
    otel.uninstall()
    service = f"ot2-hot-{style}"

    batch, close = warm_batch(service, style)
    before = profile(batch)
    otel.install(telemetry.meters, telemetry.tracers, spans=False)
    with telemetry.tracer.start_as_current_span("request"):
        after = profile(batch)
    close()
    assert after == before
    api_dir = os.path.dirname(opentelemetry.__path__[0])
    touched = [e for e in after if e[1] == otel.__file__ or e[1].startswith(api_dir + os.sep + "opentelemetry")]
    # the hook did see the calls (the wrappers are built by core/wrappers.py)
    assert any(e[1] in (hotpath.__file__, wrappers_module.__file__) or e[2] == "protect" for e in after)
    assert touched == []
    success = {"baldur.service": service, "baldur.outcome": "success"}
    assert telemetry.value(otel.CALLS_COUNTER, **success) == 250
    assert [s.events for s in telemetry.exporter.get_finished_spans()] == [()]
