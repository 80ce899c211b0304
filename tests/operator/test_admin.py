"""The admin breaker list, its permission-gated actions and the read-only audit (OP-6)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

import baldur_django as baldur
from baldur_django.core import registry as registry_module
from baldur_django.models import BreakerAudit

LIST_URL = "/admin/baldur_django/breaker/"
AUDIT_URL = "/admin/baldur_django/breakeraudit/"


@pytest.fixture
def superuser(db):
    return User.objects.create_superuser("admin", "admin@example.test", "pw")


@pytest.fixture
def viewer(db):
    """A staff user who may see breakers and the audit, but not force."""
    user = User.objects.create_user("viewer", "viewer@example.test", "pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_breaker", content_type__app_label="baldur_django"),
        Permission.objects.get(codename="view_breakeraudit", content_type__app_label="baldur_django"),
    )
    return user


@pytest.fixture
def operator(db):
    """A staff user holding only baldur_django.force_circuit."""
    user = User.objects.create_user("operator", "op@example.test", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="force_circuit", content_type__app_label="baldur_django"))
    return user


@pytest.fixture
def breakers(clock, db):
    """Three breakers: 'alpha' healthy with traffic, 'beta' tripped, 'gamma' forced open (its audit row removed)."""
    alpha = baldur.get_breaker("alpha")
    for _ in range(4):
        alpha.record_success(alpha.acquire())
    alpha.record_failure(alpha.acquire())
    beta = baldur.get_breaker("beta")
    for _ in range(5):
        beta.record_failure(beta.acquire())
    baldur.force_open_circuit("gamma", ttl_minutes=10, reason="planned", actor="someone")
    BreakerAudit.objects.all().delete()
    return clock


def act(client, action, names, **extra):
    data = {"action": action, "_selected_action": list(names), **extra}
    return client.post(LIST_URL, data)


def test_permission_exists(db):
    """OP-6: the permission baldur_django.force_circuit exists with its label."""
    perm = Permission.objects.get(codename="force_circuit", content_type__app_label="baldur_django")
    assert perm.name == "Can force circuit breakers open or closed"


def test_list_shows_every_breaker_with_state_counts_and_force(client, superuser, breakers):
    """OP-6: the list shows live state, consecutive failures, window counts, force and expiry."""
    client.force_login(superuser)
    response = client.get(LIST_URL)
    assert response.status_code == 200
    rows = {row["service"]: row for row in response.context["rows"]}
    assert list(rows) == ["alpha", "beta", "gamma"]
    assert (rows["alpha"]["state"], rows["alpha"]["window_calls"], rows["alpha"]["window_failures"]) == ("closed", 5, 1)
    assert (rows["beta"]["state"], rows["beta"]["consecutive_failures"]) == ("open", 5)
    assert rows["gamma"]["forced"] == "open"
    html = response.content.decode()
    assert 'data-service="beta" data-state="open"' in html
    assert "forced open" in html and "planned" in html
    shown = timezone.localtime(rows["gamma"]["force_expires_dt"]).strftime("%Y-%m-%d %H:%M:%S")
    assert f'<td class="field-expires baldur-time">{shown}' in html and "in 10 min 00 s" in html
    assert 'name="action"' in html and 'value="force_open"' in html


def test_list_says_it_acts_on_this_process_only_on_memory(client, superuser, breakers, settings):
    """OP-6: on the memory backend the page says it acts only on the process serving it."""
    client.force_login(superuser)
    html = client.get(LIST_URL).content.decode()
    assert "acts only on the process serving it" in html
    settings.BALDUR_STATE_BACKEND = "database"
    html = client.get(LIST_URL).content.decode()
    assert "acts only on the process serving it" not in html and "shared store" in html


def test_list_is_live(client, superuser, breakers):
    """OP-6: each load reads the breakers afresh (a recovery timeout shows as HALF_OPEN)."""
    client.force_login(superuser)
    breakers.advance(61)
    rows = {row["service"]: row for row in client.get(LIST_URL).context["rows"]}
    assert rows["beta"]["state"] == "half_open"
    assert rows["gamma"]["state"] == "open"  # forced for 10 minutes


def test_force_open_goes_through_a_confirmation_page(client, superuser, breakers, audit, audit_rows):
    """OP-6: the action shows a confirmation page with lifetime (default from the setting) and reason; confirming forces."""
    client.force_login(superuser)
    response = act(client, "force_open", ["alpha", "beta"])
    assert response.status_code == 200
    assert response.templates[0].name == "admin/baldur_django/breaker/confirm_action.html"
    html = response.content.decode()
    assert 'name="ttl_minutes"' in html and 'value="90"' in html and 'name="reason"' in html
    assert [row["service"] for row in response.context["rows"]] == ["alpha", "beta"]
    assert baldur.get_breaker("alpha").forced is None  # nothing yet
    assert audit_rows() == []

    response = act(client, "force_open", ["alpha", "beta"], post="yes", ttl_minutes="30", reason="db migration")
    assert response.status_code == 302 and response["Location"] == LIST_URL
    for name in ("alpha", "beta"):
        snap = baldur.get_breaker(name).snapshot()
        assert (snap["state"], snap["forced"], snap["force_actor"]) == ("open", "open", "admin")
        assert snap["force_expires_at"] == pytest.approx(breakers.wall() + 30 * 60)
    rows = audit_rows()
    assert [(r["service"], r["action"], r["actor"], r["source"], r["ttl_minutes"], r["reason"]) for r in rows] == [
        ("alpha", "open", "admin", "admin", 30.0, "db migration"),
        ("beta", "open", "admin", "admin", 30.0, "db migration"),
    ]
    messages = [str(m) for m in client.get(LIST_URL).context["messages"]]
    assert any("Forced 2 breakers open for 30 minutes" in m for m in messages)


def test_force_close_and_release_actions(client, superuser, breakers, audit, audit_rows):
    """OP-6: force closed and release act through the same confirmation page; a no-op release writes no audit row."""
    client.force_login(superuser)
    response = act(client, "force_close", ["beta"], post="yes", ttl_minutes="0.5", reason="")
    assert response.status_code == 302
    assert baldur.get_breaker("beta").snapshot()["forced"] == "closed"
    assert baldur.get_breaker("beta").state is baldur.CircuitState.CLOSED

    response = act(client, "release", ["beta", "gamma", "alpha"])
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="ttl_minutes"' not in html and 'name="reason"' in html
    response = act(client, "release", ["beta", "gamma", "alpha"], post="yes", reason="all clear")
    assert response.status_code == 302
    assert baldur.get_breaker("gamma").state is baldur.CircuitState.HALF_OPEN
    assert baldur.get_breaker("beta").forced is None
    rows = audit_rows()
    assert [(r["service"], r["action"], r["reason"]) for r in rows] == [
        ("beta", "close", ""),
        ("beta", "release", "all clear"),
        ("gamma", "release", "all clear"),
    ]
    messages = [str(m) for m in client.get(LIST_URL).context["messages"]]
    assert any("Released 2 breakers" in m for m in messages)
    assert any("1 breaker was not forced" in m and "alpha" in m for m in messages)


@pytest.mark.parametrize("ttl", ["0", "-5", "1441", "abc", "", "nan", "inf"])
def test_bad_lifetime_redisplays_the_form_and_changes_nothing(client, superuser, breakers, audit, audit_rows, ttl):
    """OP-1, OP-6: a lifetime outside 0 < x <= 1440 is refused on the confirmation page; nothing changes."""
    client.force_login(superuser)
    response = act(client, "force_open", ["alpha"], post="yes", ttl_minutes=ttl, reason="x")
    assert response.status_code == 200
    assert response.context["form"].errors["ttl_minutes"]
    assert baldur.get_breaker("alpha").forced is None
    assert audit_rows() == []


def test_default_lifetime_follows_the_setting(client, superuser, breakers, settings):
    """OP-1, OP-6: the confirmation page starts from BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES."""
    settings.BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES = 15
    client.force_login(superuser)
    response = act(client, "force_close", ["alpha"])
    assert response.context["form"]["ttl_minutes"].value() == 15


def test_viewer_sees_the_list_but_cannot_act(client, viewer, breakers, audit, audit_rows):
    """OP-6: a staff user without force_circuit sees the list without actions, and is refused when acting."""
    client.force_login(viewer)
    response = client.get(LIST_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="action"' not in html and "action-select" not in html
    assert [row["service"] for row in response.context["rows"]] == ["alpha", "beta", "gamma"]
    assert act(client, "force_open", ["alpha"]).status_code == 403
    assert act(client, "force_open", ["alpha"], post="yes", ttl_minutes="5").status_code == 403
    assert act(client, "release", ["gamma"], post="yes").status_code == 403
    assert baldur.get_breaker("alpha").forced is None
    assert baldur.get_breaker("gamma").forced == "open"
    assert audit_rows() == []


def test_force_permission_alone_is_enough(client, operator, breakers, audit, audit_rows):
    """OP-6: baldur_django.force_circuit lets a staff user see the list and act."""
    client.force_login(operator)
    assert client.get(LIST_URL).status_code == 200
    response = act(client, "force_open", ["alpha"], post="yes", ttl_minutes="5", reason="")
    assert response.status_code == 302
    assert baldur.get_breaker("alpha").forced == "open"
    assert [(r["actor"], r["source"]) for r in audit_rows()] == [("operator", "admin")]


def test_staff_without_any_baldur_permission_is_refused(client, db, breakers):
    """OP-6: a staff user with no baldur permission cannot see the list."""
    user = User.objects.create_user("nobody", "n@example.test", "pw", is_staff=True)
    client.force_login(user)
    assert client.get(LIST_URL).status_code == 403


def test_anonymous_is_sent_to_login(client, db):
    """OP-6: the page is behind the admin login."""
    response = client.get(LIST_URL)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_no_selection_or_unknown_names_change_nothing(client, superuser, breakers, audit, audit_rows):
    """OP-6: no breaker selected, no action, or a name that is not listed -> a message, nothing changed or registered."""
    client.force_login(superuser)
    assert act(client, "force_open", []).status_code == 302
    assert act(client, "", ["alpha"]).status_code == 302
    response = act(client, "force_open", ["alpha", "ghost"], post="yes", ttl_minutes="5")
    assert response.status_code == 302
    assert "ghost" not in registry_module.registry.names()
    assert baldur.get_breaker("alpha").forced is None
    assert audit_rows() == []
    messages = [str(m) for m in client.get(LIST_URL).context["messages"]]
    assert any("Unknown breaker(s): ghost" in m for m in messages)


def test_breaker_admin_has_no_add_change_or_delete(client, superuser, breakers):
    """OP-6: breakers are not database rows: the admin offers no add, change or delete pages."""
    client.force_login(superuser)
    index = client.get("/admin/").content.decode()
    assert LIST_URL in index and f"{LIST_URL}add/" not in index
    assert client.get(f"{LIST_URL}add/").status_code == 404
    assert client.get(f"{LIST_URL}alpha/change/").status_code == 404


def test_audit_is_listed_read_only(client, superuser, viewer, breakers, audit):
    """OP-6: the audit shows in the admin, read-only even for a superuser."""
    client.force_login(superuser)
    act(client, "force_open", ["alpha"], post="yes", ttl_minutes="12", reason="checking audit")
    row = BreakerAudit.objects.get()
    response = client.get(AUDIT_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "alpha" in html and "checking audit" in html and "force open" in html
    change_url = reverse("admin:baldur_django_breakeraudit_change", args=[row.pk])
    page = client.get(change_url)
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert client.post(change_url, {"reason": "rewritten"}).status_code == 403
    assert client.get(f"{AUDIT_URL}add/").status_code == 403
    assert (
        client.post(reverse("admin:baldur_django_breakeraudit_delete", args=[row.pk]), {"post": "yes"}).status_code
        == 403
    )
    assert BreakerAudit.objects.get().reason == "checking audit"
    client.force_login(viewer)
    assert client.get(AUDIT_URL).status_code == 200


# ------------------------------------------------------------------------------ forget
def test_forget_action_removes_breakers_and_refuses_a_forced_one(
    client, superuser, breakers, settings, audit, audit_rows
):
    """OP-6, OP-7: the admin's Forget action goes through the confirmation page (reason, no lifetime),
    removes the selected breakers from the shared record and registry and the list, is audited, and
    refuses a forced breaker with a message."""
    settings.BALDUR_STATE_BACKEND = "database"
    store = registry_module.registry.store
    baldur.force_open_circuit("gamma", ttl_minutes=10)  # the force, now in the shared store
    for name in ("alpha", "beta"):
        baldur.get_breaker(name).sync()  # registered in the shared store
    BreakerAudit.objects.all().delete()
    client.force_login(superuser)
    response = act(client, "forget", ["beta", "gamma"])
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="ttl_minutes"' not in html and 'name="reason"' in html and "removed from the shared record" in html
    response = act(client, "forget", ["beta", "gamma"], post="yes", reason="gone")
    assert response.status_code == 302
    assert "beta" not in store.names() and "gamma" in store.names()
    listed = client.get(LIST_URL).context
    assert [row["service"] for row in listed["rows"]] == ["alpha", "gamma"]
    assert [(r["service"], r["action"], r["source"], r["actor"], r["reason"]) for r in audit_rows()] == [
        ("beta", "forget", "admin", "admin", "gone")
    ]
    messages = [str(m) for m in listed["messages"]]
    assert any("Forgot 1 breaker: beta." in m for m in messages)
    assert any("gamma: not forgotten" in m and "release it first" in m for m in messages)


def test_forget_needs_the_force_permission(client, viewer, breakers, audit, audit_rows):
    """OP-6, OP-7: without baldur_django.force_circuit the Forget action is refused."""
    client.force_login(viewer)
    assert act(client, "forget", ["alpha"], post="yes").status_code == 403
    assert "alpha" in registry_module.registry.names() and audit_rows() == []


def test_forget_on_the_memory_backend_acts_on_this_process(client, superuser, breakers, audit, audit_rows):
    """OP-6, OP-7: on the memory backend the confirmation page says it acts on this process, and the
    forget removes the breaker from the serving process."""
    client.force_login(superuser)
    assert "this process" in act(client, "forget", ["beta"]).content.decode()
    assert act(client, "forget", ["beta"], post="yes").status_code == 302
    assert "beta" not in registry_module.registry.names()
    assert [r["action"] for r in audit_rows()] == ["forget"]
