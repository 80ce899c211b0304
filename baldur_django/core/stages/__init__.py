"""The load-aware stages a protected call can pass through besides the breaker itself, each
in a module of its own: small, pure Python, and off unless a knob turns it on."""
