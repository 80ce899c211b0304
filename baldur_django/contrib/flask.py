"""Flask extension (IN-6). Never imports Django: only Flask and the core.

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
    from flask import Flask, g
except ImportError as exc:  # pragma: no cover - exercised only without Flask installed
    raise ImportError(
        "baldur_django.contrib.flask needs Flask; install it with pip install 'baldur-django[flask]'"
    ) from exc

from ..core.errors import CircuitOpenError
from ..core.registry import registry

# the status rules are shared with the ASGI middleware (that module is pure Python)
from .asgi import check_service_name, record_status

__all__ = ["BaldurFlask"]

_G_KEY = "_baldur_permit"


class BaldurFlask:
    """Record a Flask app's responses against one breaker (IN-6).

    With a ``service_name``, each request asks the breaker for admission before the
    view (a refusal lets the request run unrecorded) and its response is recorded
    after it: a rate-limit status is a failure that feeds the cascade and the cooldown,
    except a 429 carrying ``X-RateLimit-Mode``; a failure status is a failure; anything
    else a success. A view exception counts once: through the 500 Flask answers, or,
    when Flask propagates it (``TESTING``/``PROPAGATE_EXCEPTIONS``), in teardown.
    Without a ``service_name`` nothing is recorded and no hook is installed.

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
        """Install the request hooks on *app* (none when there is no service name)."""
        app.extensions["baldur"] = self
        if self.service_name is None:
            return
        app.before_request(self._before)
        app.after_request(self._after)
        app.teardown_request(self._teardown)

    def _before(self) -> None:
        breaker = registry.get(self.service_name)  # type: ignore[arg-type]
        assert breaker is not None
        try:
            permit = breaker.acquire()
        except CircuitOpenError:
            return None
        setattr(g, _G_KEY, (breaker, permit))
        return None

    def _after(self, response: Any) -> Any:
        taken = g.pop(_G_KEY, None)
        if taken is not None:
            breaker, permit = taken
            record_status(breaker, permit, response.status_code, response.headers.get)
        return response

    def _teardown(self, exc: BaseException | None) -> None:
        taken = g.pop(_G_KEY, None)
        if taken is None:
            return
        breaker, permit = taken
        if isinstance(exc, Exception):
            breaker.record_failure(permit)
        else:
            breaker.record_ignored(permit)
