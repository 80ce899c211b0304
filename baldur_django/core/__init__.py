"""Pure-Python circuit-breaker core: no Django import anywhere below this package.

Usable on its own from Flask, a script or a Celery worker; the Django layer
(``baldur_django.conf``, ``apps``, ``middleware`` ...) only injects settings,
a shared store and the signal bridge.
"""
