"""Flask extension. Never imports Django: only Flask and the core.

::

    from flask import Flask
    from baldur_django.contrib.flask import BaldurFlask

    app = Flask(__name__)
    BaldurFlask(app, service_name="catalogue")

    # or, with an application factory:
    baldur = BaldurFlask(service_name="catalogue")
    def create_app():
        app = Flask(__name__)
        baldur.init_app(app)
        return app

Settings come from ``BALDUR_*`` environment variables (or their defaults).
"""

from __future__ import annotations

from typing import Any

try:
    from flask import Flask, Response, g, request
except ImportError as exc:  # pragma: no cover - exercised only without Flask installed
    raise ImportError(
        "baldur_django.contrib.flask needs Flask; install it with pip install 'baldur-django[flask]'"
    ) from exc

from ..core import inbound
from ..core.breaker import Permit
from ..core.inbound import ShedAnswer
from ..core.registry import registry
from .asgi import check_service_name

__all__ = ["BaldurFlask"]

_G_KEY = "_baldur_permit"


class BaldurFlask:
    """Record a Flask app's responses against one breaker.

    A thin shell over the inbound policy (:mod:`baldur_django.core.inbound`), the one
    Django's middleware and the ASGI middleware use. With a ``service_name``, each
    request asks the breaker for admission before the view: a refusal lets the request
    run unrecorded, or, with ``BALDUR_MIDDLEWARE_SHED_LOAD`` on, answers a 503 with
    ``Retry-After`` and ``X-Baldur-Shed`` instead of running the view. The response is
    recorded after the view: a rate-limit status is a failure that feeds the cascade
    and the cooldown, except the application's own 429s (``X-RateLimit-Mode`` or
    ``X-RateLimit-Limit``, or a request marked with ``baldur_django.mark_rate_limited``);
    a failure status is a failure; anything else a success. A view exception counts
    once: through the 500 Flask answers, or, when Flask propagates it
    (``TESTING``/``PROPAGATE_EXCEPTIONS``), in teardown. Without a ``service_name``
    nothing is recorded and no hook is installed.

    Args:
        app: a ``flask.Flask`` application, or None to call :meth:`init_app` later.
        service_name: breaker name (str), or None.

    Raises:
        ConfigError: *service_name* is neither None nor a non-empty string.
    """

    def __init__(self, app: Flask | None = None, service_name: str | None = None) -> None:
        self.service_name = check_service_name(service_name)
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Install the request hooks on *app* (none when there is no service name).

        Args:
            app: the Flask application.
        """
        app.extensions["baldur"] = self
        if self.service_name is None:
            return
        app.before_request(self._before)
        app.after_request(self._after)
        app.teardown_request(self._teardown)

    def _before(self) -> Response | None:
        breaker = registry.get(self.service_name)  # type: ignore[arg-type]
        assert breaker is not None
        permit = inbound.admit(breaker)
        if isinstance(permit, Permit):
            setattr(g, _G_KEY, (breaker, permit))
        elif isinstance(permit, ShedAnswer):
            return Response(permit.body, status=permit.status, headers=list(permit.headers))
        return None

    def _after(self, response: Any) -> Any:
        taken = g.pop(_G_KEY, None)
        if taken is not None:
            breaker, permit = taken
            inbound.record(breaker, permit, response.status_code, response.headers, request)
        return response

    def _teardown(self, exc: BaseException | None) -> None:
        taken = g.pop(_G_KEY, None)
        if taken is None:
            return
        breaker, permit = taken
        if exc is None:
            inbound.release(breaker, permit)
        else:
            inbound.record_exception(breaker, permit, exc)
