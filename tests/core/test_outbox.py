"""The background senders' queue (Slack posts OP-8, propagation publishes EM-6)."""

from __future__ import annotations

import threading

from baldur_django.core.outbox import Outbox


def test_em6_op8_offer_refuses_when_full_and_never_waits():
    box = Outbox(2)
    assert box.offer("a") and box.offer("b")
    assert box.offer("c") is False  # full: refused at once, nothing queued
    assert [box.get(), box.get()] == ["a", "b"]


def test_em6_op8_drained_waits_for_task_done_not_for_get():
    box = Outbox(4)
    box.offer("a")
    box.offer("b")
    assert box.drained(0) is False
    box.get()
    box.get()
    assert box.drained(0) is False  # taken but not finished: still waiting
    box.task_done()
    assert box.drained(0) is False
    box.task_done()
    assert box.drained(0) is True


def test_em6_op8_drained_wakes_when_a_sender_thread_finishes():
    box = Outbox(4)
    box.offer("a")
    taken = threading.Event()
    release = threading.Event()

    def sender() -> None:
        box.get()
        taken.set()
        release.wait(5)
        box.task_done()

    thread = threading.Thread(target=sender)
    thread.start()
    assert taken.wait(5)
    assert box.drained(0.01) is False
    release.set()
    assert box.drained(5) is True
    thread.join(5)
