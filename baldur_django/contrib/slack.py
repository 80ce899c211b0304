"""Slack push of breaker opens and closes.

A bus listener turns each open into a 🔴 message and each close into a 🟢 message naming
the service, the trigger and the time, and hands it to a background sender thread through
a bounded queue. The protected call that caused the transition only pays for formatting
the text and one ``put_nowait``: it never waits for Slack, and a full queue drops the
message (counted in :attr:`SlackNotifier.dropped` and logged).

The sender posts ``{"text": ...}`` with a 5 s timeout (``urllib.request``, no extra
dependency) through an opener of its own, with a TLS context made at its first post from
the system's trust store (``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` apply): never urllib's
process-wide opener, which other code may replace (``install_opener``) and which, from
Python 3.12, keeps the TLS trust it read at the first ``urlopen`` of the process. Slack's 429 is honoured once: wait its ``Retry-After``, post again. A
permanent refusal (another 4xx) is logged once per status code. The webhook URL is a
secret: it never appears in a log record or in an exception text produced here.

Enabled by ``BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL`` (read on every event, so a settings
change applies without restart); unset, nothing is queued and the events are only
logged by the core's logging listener. The URL must be ``https://``: a plain ``http://``
one would send the secret in clear, so it is a system check error (``baldur.E054``) at
startup, the listener posts nothing while it is set, and a notifier or a message given
one is refused with a :class:`~baldur_django.core.errors.ConfigError` that does not
show it. Pure Python: usable without Django.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from ..core.classify import parse_retry_after
from ..core.config import SettingsSource
from ..core.config import settings as default_settings
from ..core.errors import ConfigError
from ..core.events import Event, Forced, Reset, StateChanged, bus
from ..core.knobs import KNOBS
from ..core.names import show_name
from ..core.outbox import Outbox

__all__ = [
    "SlackNotifier",
    "escape",
    "check_webhook_url",
    "install_slack_listener",
    "uninstall_slack_listener",
    "get_notifier",
]

_log = logging.getLogger("baldur.slack")

SETTING = "BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL"
OPEN_EMOJI = "\U0001f534"  # red circle
CLOSE_EMOJI = "\U0001f7e2"  # green circle
_STOP = object()


def escape(text: Any) -> str:
    """Escape ``&``, ``<`` and ``>`` for Slack's message markup (so ``<!channel>`` in a
    service name is shown, not acted on)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def check_webhook_url(url: Any) -> str:
    """Check a Slack webhook URL: it must be ``https://`` with a host.

    The same rule as the ``BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL`` setting.

    Args:
        url: the webhook URL.

    Returns:
        str: the URL without surrounding blanks.

    Raises:
        ConfigError: empty, not text, plain ``http://`` (it would send the secret in clear)
            or not a URL. The message never contains the URL: it is a secret.
    """
    checked = KNOBS[SETTING].coerce(url)
    if not checked:
        raise ConfigError(f"{SETTING}: no webhook URL given")
    return str(checked)


def _utc(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _own_opener() -> Callable[..., Any]:
    """A new ``urllib.request`` opener with a TLS context of its own.

    The context is ``ssl.create_default_context()``, made now: it trusts the system's
    certificates as they are configured at this moment (``SSL_CERT_FILE``, ``SSL_CERT_DIR``).
    Proxies come from the environment, as with ``urllib.request.urlopen``. urllib's
    process-wide opener is not used: any code can replace it, and from Python 3.12 it keeps
    the TLS trust of whenever the process first called ``urlopen``.

    Returns:
        ``callable(request, timeout=seconds)`` returning the response (an
        ``OpenerDirector.open``).
    """
    context = ssl.create_default_context()
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context)).open


class SlackNotifier:
    """Bus listener plus background sender for the Slack push.

    Args:
        url: a fixed ``https://`` webhook URL; None (the default) reads
            ``BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL`` from *source* on every event (an
            invalid value, a plain ``http://`` one included, posts nothing and is logged
            once without the URL).
        source: settings to read the URL from (the process-wide settings by default).
        timeout: seconds allowed for one HTTP post (5).
        max_queue: messages that may wait for the sender; more are dropped and counted.
        sleep: ``callable(seconds)`` used to wait out Slack's ``Retry-After`` (tests pass
            a recorder); by default an interruptible wait.
        max_retry_after: longest wait honoured for a 429, seconds.
        opener: ``callable(request, timeout=...)`` doing the HTTP request; by default an
            ``urllib.request`` opener of the notifier's own, built at its first post with
            ``ssl.create_default_context()`` and the environment's proxies.

    Attributes:
        sent, dropped, failed (int): messages delivered, dropped on a full queue, and
            given up after an error or refusal.

    Raises:
        ConfigError: a bad *url* (not ``https://``; the message does not show it),
            *max_queue* or *timeout*.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        source: SettingsSource | None = None,
        timeout: float = 5.0,
        max_queue: int = 100,
        sleep: Callable[[float], Any] | None = None,
        max_retry_after: float = 60.0,
        opener: Callable[..., Any] | None = None,
    ) -> None:
        if max_queue < 1:
            raise ConfigError(f"max_queue={max_queue!r}: must be at least 1")
        if timeout <= 0:
            raise ConfigError(f"timeout={timeout!r}: must be more than 0 seconds")
        self._fixed_url = check_webhook_url(url) if url else url
        self._source = source or default_settings
        self.timeout = float(timeout)
        self.max_queue = int(max_queue)
        self.max_retry_after = float(max_retry_after)
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._opener = opener
        self._lock = threading.Lock()
        self._queue: Outbox | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._refusals_logged: set[int] = set()
        self._bad_setting_logged = False
        self.sent = 0
        self.dropped = 0
        self.failed = 0

    def __repr__(self) -> str:  # never the URL
        return f"<SlackNotifier sent={self.sent} dropped={self.dropped} failed={self.failed}>"

    # ----------------------------------------------------------------- listener
    def webhook_url(self) -> str | None:
        """The URL to post to, or None when the push is off (setting unset or invalid)."""
        if self._fixed_url is not None:
            return self._fixed_url or None
        try:
            url: str | None = self._source.get(SETTING)
            return url
        except ConfigError as exc:  # its text never shows the URL (a secret)
            if not self._bad_setting_logged:
                self._bad_setting_logged = True
                _log.warning("slack_notifier.disabled: %s is invalid (%s); nothing is posted", SETTING, exc)
            return None

    @staticmethod
    def message_for(event: Event) -> str | None:
        """The Slack text for *event*, or None when it is neither an open nor a close.

        Opens: a transition to OPEN, or a force open of a breaker that was not OPEN.
        Closes: a transition to CLOSED, a force closed of a breaker that was not CLOSED, or
        a reset of a breaker that was not CLOSED.
        Transitions adopted from a peer (trigger ``propagated``) are posted by the peer
        that made them, not here. Dry-run transitions are marked.
        """
        if isinstance(event, StateChanged):
            if event.trigger == "propagated" or event.to_state not in ("open", "closed"):
                return None
            to_state, trigger, dry_run = event.to_state, event.trigger or "unknown", event.dry_run
        elif isinstance(event, Forced):
            if event.to_state == event.from_state or event.to_state not in ("open", "closed"):
                return None
            to_state, dry_run = event.to_state, event.dry_run
            trigger = "forced"
            if event.actor:
                trigger += f" by {show_name(event.actor)}"
            if event.reason:
                trigger += f" ({show_name(event.reason)})"
            trigger += f", for {event.ttl_minutes:g} min"
        elif isinstance(event, Reset):
            if event.to_state == event.from_state:
                return None
            to_state, trigger, dry_run = event.to_state, "reset", False
        else:
            return None
        emoji, verb = (OPEN_EMOJI, "opened") if to_state == "open" else (CLOSE_EMOJI, "closed")
        text = f"{emoji} Circuit breaker *{escape(show_name(event.service))}* {verb} (trigger: {escape(trigger)}) at {_utc(event.at)}"
        if dry_run:
            text += " [dry-run: no call is rejected]"
        return text

    wants_rejections = False  # posts transitions only

    def __call__(self, event: Event) -> None:
        """Bus listener: queue a message for an open or a close; never blocks, never raises."""
        try:
            text = self.message_for(event)
            if text is None:
                return
            url = self.webhook_url()
            if not url:
                return
            self.enqueue(url, text, service=event.service)
        except Exception as exc:  # the bus contains errors too; this keeps the URL out of its log
            _log.error(
                "slack_notifier.listener_failed error=%s",
                self._scrub(f"{type(exc).__name__}: {exc}", self.webhook_url()),
            )

    # ------------------------------------------------------------------- sender
    def enqueue(self, url: str, text: str, *, service: str | None = None) -> bool:
        """Queue *text* for posting to *url*. Returns False (and counts a drop) when full.

        Raises:
            ConfigError: *url* is not an ``https://`` URL (the message does not show it);
                nothing is queued.
        """
        url = check_webhook_url(url)
        q = self._ensure_sender()
        if not q.offer((url, text)):
            with self._lock:
                self.dropped += 1
                dropped = self.dropped
            _log.warning(
                "slack_notifier.dropped service=%s: the send queue is full (%d waiting); %d message(s) dropped so far",
                show_name(service),
                self.max_queue,
                dropped,
            )
            return False
        return True

    def _ensure_sender(self) -> Outbox:
        pid = os.getpid()
        thread = self._thread
        if thread is not None and self._pid == pid and thread.is_alive() and self._queue is not None:
            return self._queue
        with self._lock:
            if self._pid != pid or self._queue is None:  # new process after fork: fresh queue
                self._queue = Outbox(self.max_queue)
            if self._thread is None or self._pid != pid or not self._thread.is_alive():
                self._pid = pid
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, args=(self._queue,), name="baldur-slack-sender", daemon=True
                )
                self._thread.start()
            return self._queue

    def _run(self, q: Outbox) -> None:
        while True:
            item = q.get()
            if item is _STOP:
                q.task_done()
                return
            try:
                self._deliver(*item)
            except Exception as exc:  # pragma: no cover - _deliver catches its own errors
                self.failed += 1
                _log.error("slack_notifier.sender_error error=%s", self._scrub(f"{type(exc).__name__}: {exc}", item[0]))
            finally:
                q.task_done()

    def _deliver(self, url: str, text: str) -> None:
        status, retry_after, error = self._post(url, text)
        if status == 429:
            delay = parse_retry_after(retry_after, default=1.0, cap=self.max_retry_after, now_wall=time.time())
            _log.info("slack_notifier.rate_limited: Slack answered 429; retrying once in %.1fs", delay)
            self._sleep(delay)
            if self._stop.is_set():  # closing: give up rather than post late
                self.failed += 1
                return
            status, retry_after, error = self._post(url, text)
        if status is not None and 200 <= status < 300:
            self.sent += 1
            return
        self.failed += 1
        if status == 429:
            _log.warning("slack_notifier.rate_limited: Slack answered 429 again after the retry; message dropped")
        elif status is not None and 400 <= status < 500:
            if status not in self._refusals_logged:
                self._refusals_logged.add(status)
                _log.error(
                    "slack_notifier.refused status=%d: the webhook refused the message; check "
                    "%s (further %d answers are not logged)",
                    status,
                    SETTING,
                    status,
                )
        elif status is not None:
            _log.warning("slack_notifier.post_failed status=%d: message dropped", status)
        else:
            _log.warning("slack_notifier.post_failed error=%s: message dropped", self._scrub(error or "?", url))

    def _post(self, url: str, text: str) -> tuple[int | None, str | None, str | None]:
        body = json.dumps({"text": text}, ensure_ascii=False).encode("utf-8")
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json; charset=utf-8"}
        )
        try:
            if self._opener is None:  # only the sender thread posts: built once
                self._opener = _own_opener()
            with self._opener(request, timeout=self.timeout) as response:
                response.read(4096)
                return int(getattr(response, "status", None) or response.getcode()), None, None
        except urllib.error.HTTPError as exc:
            retry_after = exc.headers.get("Retry-After") if exc.headers is not None else None
            try:
                exc.close()
            except Exception:  # pragma: no cover
                pass
            return int(exc.code), retry_after, None
        except Exception as exc:  # URLError, timeout, OSError...: described without the URL
            reason = getattr(exc, "reason", None)
            described = f"{type(exc).__name__}: {reason if reason is not None else exc}"
            return None, None, self._scrub(described, url)

    @staticmethod
    def _scrub(text: str, url: str | None) -> str:
        """*text* with the URL and its secret parts (path, query, credentials) removed."""
        if not url:
            return text
        secrets = [url, url.strip()]
        try:
            parts = urlsplit(url.strip())
            secrets += [parts.netloc, parts.path, parts.query, parts.password or "", parts.username or ""]
        except ValueError:
            pass
        for secret in sorted({s for s in secrets if s and len(s) > 1}, key=len, reverse=True):
            text = text.replace(secret, "<webhook>")
        return text

    # --------------------------------------------------------------- lifecycle
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued message was handled (sent, failed or dropped).

        Returns:
            True when the queue drained within *timeout* seconds.
        """
        q = self._queue
        return q is None or q.drained(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sender after the messages already queued; waits at most *timeout* s."""
        thread, q = self._thread, self._queue
        if thread is None or q is None or not thread.is_alive() or self._pid != os.getpid():
            return
        self.flush(timeout)
        self._stop.set()
        q.offer(_STOP)
        thread.join(timeout)


_notifier: SlackNotifier | None = None
_install_lock = threading.Lock()


def get_notifier() -> SlackNotifier | None:
    """The notifier installed by :func:`install_slack_listener`, or None."""
    return _notifier


def _flush_at_exit() -> None:
    notifier = _notifier
    if notifier is not None:
        notifier.flush(timeout=2.0)


def install_slack_listener() -> SlackNotifier:
    """Subscribe the process-wide :class:`SlackNotifier` to the event bus (idempotent).

    Safe to call whether or not ``BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL`` is set: the
    listener reads the setting on every event and does nothing while it is unset. At exit
    it waits up to 2 s for messages still queued.
    """
    global _notifier
    with _install_lock:
        if _notifier is None:
            _notifier = SlackNotifier()
            atexit.register(_flush_at_exit)
        bus.subscribe(_notifier)
        return _notifier


def uninstall_slack_listener() -> None:
    """Unsubscribe the process-wide notifier and stop its sender (tests)."""
    global _notifier
    with _install_lock:
        notifier, _notifier = _notifier, None
    if notifier is not None:
        bus.unsubscribe(notifier)
        notifier.close(timeout=1.0)
