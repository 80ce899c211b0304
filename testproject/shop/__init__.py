"""The shop app: orders, and a charge view whose payments call is guarded by a breaker."""
