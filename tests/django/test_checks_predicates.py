"""CB-18, CFG-3: the system check of the predicates' dotted paths in BALDUR_SERVICES.

A path that cannot be imported is ``baldur.E080``; one that names something that is not a
function (not an exception class either, for ``ignore_exceptions``) is ``baldur.E081``;
each with a hint, naming the service and the key. A path that is not even dotted is the
value error of BALDUR_SERVICES itself (``baldur.E022``), like any other bad entry.
"""

from __future__ import annotations

import os

import pytest
from django.test import override_settings

from baldur_django.checks import Codes, check_settings
from baldur_django.conf import baldur_settings

GOOD = "tests.core.test_predicates"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("BALDUR_") and name != "BALDUR_TEST_DB":
            monkeypatch.delenv(name)
    baldur_settings.reset()


def errors_for(services):
    with override_settings(BALDUR_SERVICES=services):
        return [m for m in check_settings() if m.id and m.id.startswith("baldur.")]


def test_cb18_check_ids_are_their_own():
    """CB-18: the predicate checks have ids of their own, used by no knob."""
    from baldur_django.checks import KNOB_IDS

    assert {Codes.PREDICATE_NOT_IMPORTABLE, Codes.PREDICATE_NOT_CALLABLE} == {"baldur.E080", "baldur.E081"}
    assert not {Codes.PREDICATE_NOT_IMPORTABLE, Codes.PREDICATE_NOT_CALLABLE} & set(KNOB_IDS.values())


def test_cb18_good_paths_pass_the_check():
    """CB-18: importable paths to an exception class and to functions raise nothing."""
    assert (
        errors_for(
            {
                "payments": {
                    "ignore_exceptions": [f"{GOOD}.Skip", f"{GOOD}.is_skip_text"],
                    "failure_predicate": f"{GOOD}.only_connection_errors",
                    "result_predicate": f"{GOOD}.is_bad_value",
                }
            }
        )
        == []
    )


def test_cb18_objects_in_django_settings_are_refused_naming_the_key():
    """CB-18, CFG-3: BALDUR_SERVICES takes dotted paths only (so every value stays printable and
    JSON, as `baldur_status --config` shows it): a function object is the value error E022."""
    from tests.core.test_predicates import only_connection_errors

    (error,) = errors_for({"payments": {"failure_predicate": only_connection_errors}})
    assert error.id == "baldur.E022"
    assert "['failure_predicate']" in error.msg and "dotted import path" in error.msg


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("failure_predicate", "myapp.breakers.is_outage"),
        ("result_predicate", f"{GOOD}.no_such_function"),
        ("ignore_exceptions", ["nowhere_at_all.NotFound"]),
    ],
)
def test_cb18_a_path_that_cannot_be_imported_is_e080(key, path):
    """CB-18: a path that cannot be imported is baldur.E080, naming service, key and path, with a
    hint saying what the key takes."""
    (error,) = errors_for({"payments": {key: path}})
    shown = path[0] if isinstance(path, list) else path
    assert error.id == Codes.PREDICATE_NOT_IMPORTABLE
    assert f"BALDUR_SERVICES['payments']['{key}']" in error.msg and shown in error.msg
    assert "dotted import path" in error.hint and "myapp.breakers.is_outage" in error.hint


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("failure_predicate", f"{GOOD}.NOT_CALLABLE"),
        ("result_predicate", f"{GOOD}.Response"),  # a class: calling it judges nothing
        ("ignore_exceptions", [f"{GOOD}.Skip", f"{GOOD}.Response"]),  # a class that is not an exception
    ],
)
def test_cb18_a_path_to_something_not_callable_is_e081(key, path):
    """CB-18: a path naming a value that is not a function (nor an exception class, for
    ignore_exceptions) is baldur.E081."""
    (error,) = errors_for({"payments": {key: path}})
    assert error.id == Codes.PREDICATE_NOT_CALLABLE
    assert f"BALDUR_SERVICES['payments']['{key}']" in error.msg
    assert error.hint


def test_cb18_every_bad_path_is_reported_once():
    """CB-18: one error per bad path, over several services and keys."""
    found = errors_for(
        {
            "a": {"failure_predicate": "nope.missing"},
            "b": {"ignore_exceptions": ["nope.one", f"{GOOD}.NOT_CALLABLE"], "result_predicate": "nope.two"},
        }
    )
    assert sorted(m.id for m in found) == ["baldur.E080", "baldur.E080", "baldur.E080", "baldur.E081"]


def test_cb18_a_path_that_is_not_dotted_is_the_services_value_error():
    """CB-18, CFG-3: 'not a path' fails the BALDUR_SERVICES parser (E022), naming the key; the
    import check then stays silent (one error for one mistake)."""
    (error,) = errors_for({"payments": {"failure_predicate": "is outage"}})
    assert error.id == "baldur.E022"
    assert "['failure_predicate']" in error.msg and "dotted import path" in error.msg


def test_cb18_the_check_runs_in_manage_py_check():
    """CB-18: `manage.py check` fails on a bad predicate path with the id."""
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    with (
        override_settings(BALDUR_SERVICES={"payments": {"failure_predicate": "myapp.breakers.is_outage"}}),
        pytest.raises(SystemCheckError, match=r"baldur\.E080"),
    ):
        call_command("check", "--tag", "baldur")
