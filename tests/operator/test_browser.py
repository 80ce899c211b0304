"""The admin breaker page driven by a real headless Chromium (OP-6).

Needs Debian's ``chromium`` and ``chromium-driver`` (/usr/bin/chromium, /usr/bin/chromedriver).
Skipped locally when the browser cannot start; fails under ``CI=true``. Screenshots go to a
temporary folder, or to ``docs/img/`` when ``BALDUR_UPDATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles.testing import StaticLiveServerTestCase

import baldur_django as baldur
from baldur_django import services
from baldur_django.core.events import bus
from baldur_django.models import BreakerAudit
from tests.conftest import need_server

CHROMIUM = os.environ.get("BALDUR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BALDUR_CHROMEDRIVER", "/usr/bin/chromedriver")
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def start_browser(profile: str):
    """A headless Chromium, or (None, reason) when it cannot start."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return None, f"{CHROMIUM} or {CHROMEDRIVER} is missing (apt-get install chromium chromium-driver)"
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:  # pragma: no cover - selenium is a dev dependency
        return None, f"selenium is not installed: {exc}"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1600,900",
    ):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    except Exception as exc:
        return None, f"headless Chromium did not start: {type(exc).__name__}: {exc}"
    driver.set_page_load_timeout(30)
    return driver, ""


@pytest.mark.browser
class AdminBrowserTest(StaticLiveServerTestCase):
    """OP-6: log in, select a breaker, force it open with a lifetime, see the list change."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.profile = tempfile.mkdtemp(prefix="baldur-chromium-")
        cls.driver, cls.problem = start_browser(cls.profile)

    @classmethod
    def tearDownClass(cls):
        if cls.driver is not None:
            cls.driver.quit()
        shutil.rmtree(cls.profile, ignore_errors=True)
        super().tearDownClass()

    def setUp(self):
        need_server("headless Chromium", self.driver is not None, self.problem)
        self.had_audit = services.audit_listener in bus.listeners
        services.install_audit_listener()
        self.shots = Path(tempfile.mkdtemp(prefix="baldur-shots-"))
        User.objects.create_superuser("admin", "admin@example.test", "s3cret-pw")

    def tearDown(self):
        if not self.had_audit:
            services.uninstall_audit_listener()

    def shoot(self, name: str) -> Path:
        path = self.shots / name
        self.driver.save_screenshot(str(path))
        assert path.stat().st_size > 10_000, f"{name} looks empty"
        if os.environ.get("BALDUR_UPDATE_SCREENSHOTS") == "1":
            DOCS_IMG.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, DOCS_IMG / name)
        return path

    def wait_for(self, by: str, value: str):
        """The element once the page that holds it has loaded (bounded wait, not a sleep)."""
        from selenium.webdriver.support import expected_conditions as EC
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, 15).until(EC.presence_of_element_located((by, value)))

    def row_state(self, service: str) -> str:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, f'tr[data-service="{service}"]').get_attribute("data-state")

    def test_force_open_from_the_admin(self):
        """OP-6: the whole flow in a real browser, with screenshots of the list and the confirmation page."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        payments = baldur.get_breaker("payments")
        for _ in range(40):
            payments.record_success(payments.acquire())
        payments.record_failure(payments.acquire())
        search = baldur.get_breaker("search")
        for _ in range(5):
            search.record_failure(search.acquire())
        baldur.force_close_circuit("recommendations", ttl_minutes=30, reason="known flaky, keep serving", actor="alice")

        driver = self.driver
        driver.get(f"{self.live_server_url}/admin/login/?next=/admin/baldur_django/breaker/")
        driver.find_element(By.NAME, "username").send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys("s3cret-pw")
        driver.find_element(By.CSS_SELECTOR, 'input[type="submit"]').click()
        scope = self.wait_for(By.ID, "baldur-scope")
        assert driver.current_url.endswith("/admin/baldur_django/breaker/"), driver.current_url
        assert "acts only on the process serving it" in scope.text
        assert self.row_state("payments") == "closed" and self.row_state("search") == "open"
        self.shoot("admin-breaker-list.png")

        driver.find_element(By.CSS_SELECTOR, 'input.action-select[value="payments"]').click()
        Select(driver.find_element(By.NAME, "action")).select_by_value("force_open")
        driver.find_element(By.ID, "baldur-go").click()
        ttl = self.wait_for(By.NAME, "ttl_minutes")
        assert ttl.get_attribute("value") == "90"  # BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES
        ttl.clear()
        ttl.send_keys("45")
        driver.find_element(By.NAME, "reason").send_keys("payment provider maintenance")
        assert payments.forced is None  # nothing happens before confirming
        self.shoot("admin-force-confirm.png")

        driver.find_element(By.ID, "baldur-confirm").click()
        self.wait_for(By.CSS_SELECTOR, "ul.messagelist")
        assert driver.current_url.endswith("/admin/baldur_django/breaker/"), driver.current_url
        assert self.row_state("payments") == "open"
        row = driver.find_element(By.CSS_SELECTOR, 'tr[data-service="payments"]')
        assert "forced open" in row.text and "payment provider maintenance" in row.text
        assert "Forced 1 breaker open for 45 minutes" in driver.find_element(By.CSS_SELECTOR, "ul.messagelist").text
        self.shoot("admin-breaker-forced.png")

        driver.find_element(By.ID, "baldur-audit-link").click()
        assert "payment provider maintenance" in self.wait_for(By.ID, "result_list").text
        self.shoot("admin-audit.png")

        snap = payments.snapshot()
        assert (snap["state"], snap["forced"], snap["force_actor"]) == ("open", "open", "admin")
        audit = BreakerAudit.objects.get(service="payments")
        assert (audit.service, audit.action, audit.ttl_minutes, audit.source) == ("payments", "open", 45.0, "admin")

        # EM-1: the emergency level banner, set through its confirmation page
        from baldur_django.core import emergency

        driver.get(f"{self.live_server_url}/admin/baldur_django/breaker/")
        self.wait_for(By.ID, "baldur-emergency-set").click()
        Select(self.wait_for(By.NAME, "level")).select_by_value("3")
        minutes = driver.find_element(By.NAME, "minutes")
        minutes.clear()
        minutes.send_keys("20")
        driver.find_element(By.NAME, "reason").send_keys("payments and search down")
        assert emergency.status()["level"] == 0  # nothing happens before confirming
        driver.find_element(By.ID, "baldur-emergency-confirm").click()
        banner = self.wait_for(By.ID, "baldur-emergency")
        assert banner.get_attribute("data-level") == "3"
        assert "Emergency level 3" in banner.text and "payments and search down" in banner.text
        assert "in 19 min" in banner.text or "in 20 min" in banner.text
        self.shoot("admin-emergency-banner.png")
        assert emergency.status()["actor"] == "admin"
