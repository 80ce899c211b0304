"""Optional integrations (DRF, Flask, ASGI, Slack, Prometheus); each needs its extra."""
