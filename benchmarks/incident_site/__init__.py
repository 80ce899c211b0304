"""A small Django site for the incident rehearsal (``benchmarks.incident``).

Served by gunicorn (``benchmarks.incident_site.wsgi:application``) or uvicorn
(``benchmarks.incident_site.asgi:application``) with ``DJANGO_SETTINGS_MODULE`` set to
``benchmarks.incident_site.settings``; every knob comes from the environment
(``INCIDENT_*``, see :mod:`.settings`). Not part of the package and not a test.
"""
