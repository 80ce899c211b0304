"""The stages a protected call can pass through besides the breaker itself: each one small,
pure Python, and off unless a knob turns it on."""
