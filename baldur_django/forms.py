"""Forms of the admin's confirmation pages: lifetime and reason of a force, and
the Emergency Mode level."""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from . import services
from .core.errors import ConfigError
from .core.knobs import MAX_LIFETIME_MINUTES

__all__ = ["ForceForm", "ReleaseForm", "EmergencyLevelForm", "StepDownForm"]


class ReleaseForm(forms.Form):
    """Reason for a release (optional text, at most ``services.MAX_REASON_LENGTH`` characters)."""

    reason = forms.CharField(
        label=_("Reason"),
        required=False,
        max_length=services.MAX_REASON_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_("Recorded in the audit and the log."),
    )


class ForceForm(ReleaseForm):
    """Lifetime (minutes, 0 < x <= 1440) and reason of a force open or force closed.

    The lifetime starts at ``BALDUR_CB_MANUAL_OVERRIDE_TTL_MINUTES``. ``cleaned_data
    ["ttl_minutes"]`` is a float number of minutes.
    """

    ttl_minutes = forms.FloatField(
        label=_("Lifetime (minutes)"),
        help_text=format_lazy(
            _("The force lapses on its own after this many minutes: more than 0, at most {limit} (24 hours)."),
            limit=MAX_LIFETIME_MINUTES,
        ),
        widget=forms.NumberInput(attrs={"step": "any", "min": "0", "max": str(MAX_LIFETIME_MINUTES)}),
    )
    field_order = ["ttl_minutes", "reason"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            default = services.default_ttl_minutes()
            # a new dict (not setdefault): django-stubs types ``initial`` as a read-only mapping
            self.initial = {"ttl_minutes": int(default) if float(default).is_integer() else default, **self.initial}

    def clean_ttl_minutes(self) -> float:
        value = self.cleaned_data["ttl_minutes"]
        if value is None or not math.isfinite(value) or value <= 0 or value > MAX_LIFETIME_MINUTES:
            raise forms.ValidationError(
                _("The lifetime must be more than 0 and at most %(limit)s minutes (you gave %(value)s)."),
                code="ttl_range",
                params={"value": value, "limit": MAX_LIFETIME_MINUTES},
            )
        try:
            return services.validate_lifetime(value)
        except ConfigError as exc:  # pragma: no cover - same bounds as above
            raise forms.ValidationError(str(exc), code="ttl_range") from None


class EmergencyLevelForm(forms.Form):
    """Level (0..3), lifetime in minutes (0 < x <= 1440, blank = the default lifetime) and
    reason for setting the Emergency Mode level. ``cleaned_data["level"]`` is an int,
    ``cleaned_data["minutes"]`` a float or None."""

    level = forms.TypedChoiceField(
        label=_("Level"),
        coerce=int,
        choices=[
            (0, _("0 - normal operation (clears the emergency)")),
            (1, _("1 - recorded, no breaker behaviour changes")),
            (2, _("2 - recorded, no breaker behaviour changes")),
            (3, _("3 - freeze: no breaker trips, probes or closes on its own")),
        ],
    )
    minutes = forms.FloatField(
        label=_("Lifetime (minutes)"),
        required=False,
        help_text=format_lazy(
            _("The level lapses on its own after this many minutes: more than 0, at most {limit} (24 hours)."),
            limit=MAX_LIFETIME_MINUTES,
        ),
        widget=forms.NumberInput(attrs={"step": "any", "min": "0", "max": str(MAX_LIFETIME_MINUTES)}),
    )
    reason = ReleaseForm.base_fields["reason"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            default = services.default_ttl_minutes()
            self.initial = {"minutes": int(default) if float(default).is_integer() else default, **self.initial}

    def clean_minutes(self) -> float | None:
        value = self.cleaned_data.get("minutes")
        if value is None:
            return None
        if not math.isfinite(value) or value <= 0 or value > MAX_LIFETIME_MINUTES:
            raise forms.ValidationError(
                _("The lifetime must be more than 0 and at most %(limit)s minutes (you gave %(value)s)."),
                code="minutes_range",
                params={"value": value, "limit": MAX_LIFETIME_MINUTES},
            )
        return float(value)


class StepDownForm(forms.Form):
    """Stepping the level down has nothing to ask: the form only carries the confirmation."""
