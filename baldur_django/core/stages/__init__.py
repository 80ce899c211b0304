"""The outbound stages around a protected call: deadline, retry budget, Retry-After gate,
adaptive throttling and bulkhead (see :mod:`.pipeline` for their order)."""
