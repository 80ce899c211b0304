"""EM-1: the level file used when BALDUR_EMERGENCY_STATE_FILE is unset belongs to one project."""

from __future__ import annotations

import os
import tempfile
import types

from baldur_django.core.config import SettingsSource
from baldur_django.core.emergency.backends import project_level_file
from baldur_django.core.knobs import KNOBS


def _settings_module(path: str) -> types.ModuleType:
    module = types.ModuleType("site.settings")
    module.__file__ = path
    return module


def test_em1_two_projects_on_one_host_get_two_level_files():
    """EM-1: two Django projects whose settings modules have the same dotted name but live in
    different directories (both `config.settings`) get different default level files."""
    env = {"DJANGO_SETTINGS_MODULE": "config.settings"}
    shop = project_level_file(env, {"config.settings": _settings_module("/srv/shop/config/settings.py")})
    blog = project_level_file(env, {"config.settings": _settings_module("/srv/blog/config/settings.py")})
    assert shop != blog
    assert os.path.dirname(shop) == tempfile.gettempdir() == os.path.dirname(blog)


def test_em1_every_process_of_one_project_shares_the_file():
    """EM-1: the file depends only on the settings module's path, so a web worker, a command
    and a Celery worker of one project (same settings file) agree on it."""
    env = {"DJANGO_SETTINGS_MODULE": "config.settings"}
    modules = {"config.settings": _settings_module("/srv/shop/config/settings.py")}
    assert project_level_file(env, modules) == project_level_file(dict(env), dict(modules))
    assert os.path.basename(project_level_file(env, modules)).startswith("baldur_emergency_")


def test_em1_the_default_is_no_longer_one_file_for_the_whole_host():
    """EM-1: unset by default; the legacy host-wide name is not what an unset setting resolves to."""
    assert KNOBS["BALDUR_EMERGENCY_STATE_FILE"].default is None
    assert SettingsSource(environ={}).get("BALDUR_EMERGENCY_STATE_FILE") is None
    legacy = os.path.join(tempfile.gettempdir(), "baldur_emergency_state.json")
    assert project_level_file() != legacy
