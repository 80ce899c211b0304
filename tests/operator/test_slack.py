"""Slack push of opens and closes through a background sender (OP-8), against a real local HTTP server."""

from __future__ import annotations

import logging
import ssl
import sys
import threading
import urllib.error
import urllib.request

import pytest

import baldur_django as baldur
from baldur_django.contrib import slack
from baldur_django.contrib.slack import CLOSE_EMOJI, OPEN_EMOJI, SlackNotifier, escape
from baldur_django.core.events import bus

from .conftest import Reply


@pytest.fixture(autouse=True)
def fresh_slack_listener():
    """Each test starts with no process-wide notifier; the one ready() installed is put back after."""
    original = slack.get_notifier()
    subscribed = original is not None and original in bus.listeners
    slack.uninstall_slack_listener()
    yield
    slack.uninstall_slack_listener()
    if original is not None:
        slack._notifier = original
        if subscribed:
            bus.subscribe(original)


@pytest.fixture
def notifier(webhook, settings):
    """A fresh process-wide notifier installed as ready() does, pointed at the fake webhook."""
    settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = webhook.url
    return slack.install_slack_listener()


def failing():
    raise ConnectionError("upstream down")


def fail_once(name: str, **overrides) -> None:
    with pytest.raises(ConnectionError):
        baldur.protect(name, failing, **overrides)


def all_text(record: logging.LogRecord) -> str:
    return logging.Formatter("%(message)s %(exc_text)s").format(record) + repr(record.__dict__)


def test_one_post_per_open_and_per_close_with_emoji(clock, webhook, notifier):
    """OP-8: a 🔴 post when the breaker opens and a 🟢 when it closes, naming service, trigger and time; none for HALF_OPEN."""
    overrides = dict(failure_threshold=2, recovery_timeout=10, half_open_max_calls=1)
    fail_once("payments", **overrides)
    fail_once("payments", **overrides)  # opens
    clock.advance(10)
    assert baldur.protect("payments", lambda: "ok", **overrides) == "ok"  # half-open trial closes it
    assert notifier.flush(10)
    texts = webhook.texts
    assert len(texts) == 2
    assert texts[0].startswith(OPEN_EMOJI) and "*payments* opened" in texts[0] and "consecutive_failures" in texts[0]
    assert texts[1].startswith(CLOSE_EMOJI) and "*payments* closed" in texts[1] and "half_open_success" in texts[1]
    assert "2023-11-14 22:13:20 UTC" in texts[0]  # the FakeClock's wall time
    assert notifier.sent == 2 and notifier.dropped == 0 and notifier.failed == 0


def test_forces_post_open_and_close(clock, webhook, notifier):
    """OP-8: a force open is an open, a force closed of an open breaker a close; forcing an already-open breaker posts nothing new."""
    baldur.force_open_circuit("search", ttl_minutes=5, reason="maintenance", actor="alice")
    baldur.force_open_circuit("search", ttl_minutes=10)  # already open: no second open
    baldur.force_close_circuit("search", ttl_minutes=5)
    baldur.release_circuit("search")  # stays closed: nothing
    assert notifier.flush(10)
    texts = webhook.texts
    assert len(texts) == 2
    assert texts[0].startswith(OPEN_EMOJI) and "forced by alice (maintenance), for 5 min" in texts[0]
    assert texts[1].startswith(CLOSE_EMOJI) and "trigger: forced" in texts[1]


def test_service_names_are_escaped_for_slack(clock, webhook, notifier):
    """OP-8: & < > in a service name are escaped, so '<!channel>' is shown rather than pinging everyone."""
    baldur.force_open_circuit("<!channel> & co", ttl_minutes=1)
    assert notifier.flush(10)
    (text,) = webhook.texts
    assert "*&lt;!channel&gt; &amp; co*" in text and "<!channel>" not in text
    assert escape("a&b<c>d") == "a&amp;b&lt;c&gt;d"


def test_dry_run_transitions_are_marked(clock, webhook, notifier, settings):
    """OP-5, OP-8: under dry-run Slack still posts, marked dry-run."""
    settings.BALDUR_DRY_RUN = True
    baldur.force_open_circuit("svc", ttl_minutes=1)
    assert notifier.flush(10)
    assert "dry-run" in webhook.texts[0]


def test_nothing_is_posted_while_the_url_is_unset(clock, webhook, settings):
    """OP-8: unset, transitions are only logged: no request, no sender thread; setting the URL turns the push on without restart."""
    notifier = slack.install_slack_listener()
    try:
        fail_once("quiet", failure_threshold=1)
        baldur.force_close_circuit("quiet", ttl_minutes=1)
        assert notifier.flush(5)
        assert webhook.requests == [] and notifier._thread is None
        settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = webhook.url
        baldur.force_open_circuit("quiet", ttl_minutes=1)
        assert notifier.flush(10)
        assert len(webhook.requests) == 1 and webhook.texts[0].startswith(OPEN_EMOJI)
    finally:
        slack.uninstall_slack_listener()


def test_install_is_idempotent(settings):
    """OP-8: installing twice subscribes one listener."""
    try:
        first = slack.install_slack_listener()
        assert slack.install_slack_listener() is first
        assert list(bus.listeners).count(first) == 1
    finally:
        slack.uninstall_slack_listener()
    assert first not in bus.listeners


def test_a_hanging_webhook_adds_no_latency_to_protected_calls(clock, webhook, notifier):
    """OP-8: while the webhook hangs, protected calls that open and close breakers return at once."""
    sys.setswitchinterval(1e-6)
    hold = threading.Event()
    webhook.replies = [Reply(block=hold)]
    try:
        fail_once("slow-hook", failure_threshold=1)  # opens: queued, the sender posts and hangs
        assert webhook.entered.wait(10), "the sender never reached the webhook"
        # The handler is blocked on `hold` now. These calls trip, reject and close breakers,
        # each publishing to the Slack listener, and must all return before we release it.
        fail_once("other", failure_threshold=1)
        with pytest.raises(baldur.CircuitOpenError):
            baldur.protect("other", lambda: "never")
        baldur.force_close_circuit("other", ttl_minutes=1)
        assert baldur.protect("other", lambda: "fine") == "fine"
        assert not hold.is_set() and not webhook.finished.is_set()
        assert notifier.sent == 0
    finally:
        hold.set()
        sys.setswitchinterval(0.005)
    assert notifier.flush(10)
    assert notifier.sent == 3
    assert [t[0] for t in webhook.texts] == [OPEN_EMOJI, OPEN_EMOJI, CLOSE_EMOJI]


def test_a_failing_webhook_never_reaches_the_caller(clock, webhook, notifier, caplog):
    """OP-8: a 500 from the webhook is logged and dropped; the protected call behaves as without Slack."""
    webhook.replies = [Reply(status=500)]
    with caplog.at_level(logging.WARNING, logger="baldur.slack"):
        fail_once("svc", failure_threshold=1)
        with pytest.raises(baldur.CircuitOpenError):
            baldur.protect("svc", lambda: "never")
        assert notifier.flush(10)
    assert notifier.failed == 1 and notifier.sent == 0
    assert any("post_failed status=500" in r.getMessage() for r in caplog.records)


def test_slack_429_is_honoured_and_retried_once(webhook, clock):
    """OP-8: a 429 waits its Retry-After, then posts once more."""
    waits: list[float] = []
    webhook.replies = [Reply(status=429, headers={"Retry-After": "7"}), Reply(status=200)]
    notifier = SlackNotifier(webhook.url, sleep=waits.append)
    bus.subscribe(notifier)
    try:
        baldur.force_open_circuit("rl", ttl_minutes=1)
        assert notifier.flush(10)
    finally:
        bus.unsubscribe(notifier)
        notifier.close()
    assert waits == [7.0]
    assert len(webhook.requests) == 2 and webhook.requests[0] == webhook.requests[1]
    assert notifier.sent == 1 and notifier.failed == 0


def test_slack_429_twice_gives_up_after_one_retry(webhook, clock, caplog):
    """OP-8: a second 429 drops the message (no third try) with a warning."""
    waits: list[float] = []
    webhook.replies = [Reply(status=429, headers={"Retry-After": "1"}), Reply(status=429), Reply(status=200)]
    notifier = SlackNotifier(webhook.url, sleep=waits.append)
    with caplog.at_level(logging.INFO, logger="baldur.slack"):
        notifier.enqueue(webhook.url, "hello")
        assert notifier.flush(10)
    notifier.close()
    assert len(webhook.requests) == 2 and waits == [1.0]
    assert notifier.failed == 1 and notifier.sent == 0
    assert any("again after the retry" in r.getMessage() for r in caplog.records)


def test_a_permanent_refusal_is_logged_once(webhook, caplog):
    """OP-8: a 4xx (other than 429) is logged once, not per message."""
    webhook.replies = [Reply(status=404), Reply(status=404), Reply(status=404)]
    notifier = SlackNotifier(webhook.url, sleep=lambda s: None)
    with caplog.at_level(logging.DEBUG, logger="baldur.slack"):
        for i in range(3):
            notifier.enqueue(webhook.url, f"message {i}")
        assert notifier.flush(10)
    notifier.close()
    assert len(webhook.requests) == 3 and notifier.failed == 3
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR


def test_the_queue_is_bounded_and_drops_are_counted(webhook, caplog):
    """OP-8: with the sender stuck, messages beyond the queue bound are dropped, counted and logged."""
    hold = threading.Event()
    webhook.replies = [Reply(block=hold)]
    notifier = SlackNotifier(webhook.url, max_queue=2)
    try:
        with caplog.at_level(logging.WARNING, logger="baldur.slack"):
            assert notifier.enqueue(webhook.url, "first")
            assert webhook.entered.wait(10)  # the sender holds "first"; the queue is empty
            results = [notifier.enqueue(webhook.url, f"m{i}", service=f"s{i}") for i in range(5)]
        assert results == [True, True, False, False, False]
        assert notifier.dropped == 3
        drops = [r for r in caplog.records if "slack_notifier.dropped" in r.getMessage()]
        assert len(drops) == 3 and "3 message(s) dropped so far" in drops[-1].getMessage()
    finally:
        hold.set()
    assert notifier.flush(10)
    notifier.close()
    assert notifier.sent == 3 and webhook.texts == ["first", "m0", "m1"]


def test_the_post_has_a_timeout(webhook, caplog):
    """OP-8: a webhook that never answers costs the sender its timeout (5 s by default), then the message is dropped."""
    assert SlackNotifier().timeout == 5.0
    hold = threading.Event()
    webhook.replies = [Reply(block=hold)]
    notifier = SlackNotifier(webhook.url, timeout=0.2)
    try:
        with caplog.at_level(logging.WARNING, logger="baldur.slack"):
            notifier.enqueue(webhook.url, "late")
            assert notifier.flush(10)
    finally:
        hold.set()
        notifier.close()
    assert notifier.failed == 1
    assert any("post_failed" in r.getMessage() and "timed out" in r.getMessage() for r in caplog.records)


@pytest.fixture
def untrusting_global_opener():
    """urllib's process-wide opener replaced by one whose TLS context trusts nothing: what
    another library's ``install_opener`` does, and what Python 3.12+ makes of the first
    ``urlopen`` of a process (its HTTPS handler keeps the trust read then)."""
    untrusting = urllib.request.HTTPSHandler(context=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    urllib.request.install_opener(urllib.request.build_opener(untrusting))
    yield
    urllib.request.install_opener(None)


def test_the_post_does_not_use_urllibs_process_wide_opener(untrusting_global_opener, webhook, clock, notifier):
    """OP-8: the notifier posts through an opener of its own, with the trust store as it is
    when it first posts (here SSL_CERT_FILE naming the fake webhook's certificate), whatever
    other code did to urllib's process-wide opener."""
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(urllib.request.Request(webhook.url, data=b"{}", method="POST"), timeout=10)
    fail_once("trusted", failure_threshold=1)
    assert notifier.flush(10)
    assert len(webhook.texts) == 1 and "*trusted* opened" in webhook.texts[0]
    assert notifier.sent == 1 and notifier.failed == 0


def test_the_url_never_appears_in_logs(webhook, caplog, clock, settings):
    """OP-8: across 429s, refusals, server errors, timeouts and refused connections, no log record carries the URL."""
    import socket

    # an earlier test (Django's LOGGING in a command test) may have left these loggers quiet
    # or detached from the root handler that caplog listens on
    for name in ("baldur", "baldur.slack"):
        logger = logging.getLogger(name)
        logger.propagate, logger.disabled = True, False
        caplog.set_level(logging.DEBUG, logger=name)

    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    dead_url = f"https://127.0.0.1:{dead_port}/services/T0DEAD/B0DEAD/deadSECRETTOKEN"
    hold = threading.Event()
    webhook.replies = [
        Reply(status=429, headers={"Retry-After": "0"}),
        Reply(status=429),
        Reply(status=403),
        Reply(status=500),
        Reply(block=hold),
    ]
    notifier = SlackNotifier(webhook.url, sleep=lambda s: None, timeout=0.3)
    try:
        with caplog.at_level(logging.DEBUG):
            for i in range(4):
                notifier.enqueue(webhook.url, f"m{i}")
            assert notifier.flush(10)
            notifier.enqueue(dead_url, "to nowhere")
            assert notifier.flush(10)
            settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = "ftp://hooks.example.test/services/T/B/ftpSECRETTOKEN"
            SlackNotifier().webhook_url()  # an invalid URL setting: logged without its value
    finally:
        hold.set()
        notifier.close()
    assert notifier.failed == 5
    assert len(caplog.records) >= 5
    for record in caplog.records:
        text = all_text(record)
        for secret in ("SECRETTOKEN", "T0SECRET", "B0SECRET", "/services/", webhook.url, dead_url):
            assert secret not in text, record.getMessage()
    assert "SECRETTOKEN" not in repr(notifier)


def test_message_for_ignores_other_events():
    """OP-8: half-open steps, lapses, releases, rejections and peer-propagated transitions post nothing."""
    from baldur_django.core.events import CallRejected, ForceLapsed, Released, StateChanged

    ignored = [
        StateChanged("s", 0.0, from_state="open", to_state="half_open", trigger="recovery_timeout"),
        StateChanged("s", 0.0, from_state="closed", to_state="open", trigger="propagated"),
        ForceLapsed("s", 0.0, previous="open", from_state="open", to_state="half_open"),
        Released("s", 0.0, previous="open", from_state="open", to_state="half_open"),
        CallRejected("s", 0.0, reason="open", state="open"),
    ]
    assert [SlackNotifier.message_for(e) for e in ignored] == [None] * len(ignored)


# ------------------------------------------------------------------ https only (OP-8)
PLAIN_HTTP = "http://hooks.slack.com/services/T0PLAIN/B0PLAIN/plainSECRETTOKEN"


def test_a_plain_http_webhook_is_a_startup_error(settings):
    """OP-8, CFG-3: an http:// webhook URL is system check error baldur.E054 with a hint asking for
    https://; neither the message nor the hint shows the URL; ``manage.py check`` fails."""
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    from baldur_django.checks import check_settings

    settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = PLAIN_HTTP
    (error,) = [m for m in check_settings() if m.id == "baldur.E054"]
    assert "plain http:// URL would send the webhook's secret in clear" in error.msg
    assert "https://" in error.hint
    assert "SECRETTOKEN" not in error.msg + error.hint and "hooks.slack.com" not in error.msg + error.hint
    with pytest.raises(SystemCheckError, match=r"baldur\.E054"):
        call_command("check", "--tag", "baldur")
    settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = "https://hooks.slack.com/services/T/B/fine"
    assert [m for m in check_settings() if m.id == "baldur.E054"] == []


def test_a_notifier_or_message_with_a_plain_http_url_is_refused():
    """OP-8: SlackNotifier(url=http://...) and enqueue(http://...) raise ConfigError without the URL;
    nothing is queued and no sender starts."""
    with pytest.raises(baldur.ConfigError, match="http:// URL would send") as info:
        SlackNotifier(PLAIN_HTTP)
    assert "SECRETTOKEN" not in str(info.value) and "hooks.slack.com" not in str(info.value)
    notifier = SlackNotifier()
    with pytest.raises(baldur.ConfigError, match="https:// URL is required") as info:
        notifier.enqueue(PLAIN_HTTP, "hello")
    assert "SECRETTOKEN" not in str(info.value)
    assert notifier._thread is None and notifier.dropped == 0


def test_the_listener_posts_nothing_to_a_plain_http_url(clock, webhook, settings, caplog):
    """OP-8: with an http:// URL set, an open queues nothing (no sender starts) and the listener says
    once, without the URL, that the push is off; the protected call is unaffected."""
    settings.BALDUR_META_WATCHDOG_SLACK_WEBHOOK_URL = webhook.url.replace("https://", "http://")
    notifier = slack.install_slack_listener()
    with caplog.at_level(logging.WARNING, logger="baldur.slack"):
        for name in ("one", "two"):
            for _ in range(5):
                fail_once(name)
    assert notifier._thread is None and webhook.requests == []
    disabled = [r for r in caplog.records if "slack_notifier.disabled" in r.getMessage()]
    assert len(disabled) == 1 and "http:// URL would send" in disabled[0].getMessage()
    assert "SECRETTOKEN" not in all_text(disabled[0]) and "/services/" not in all_text(disabled[0])
