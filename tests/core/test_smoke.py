import baldur_django as baldur


def test_cb1_closed_passes_calls_through(clock):
    """CB-1: a CLOSED breaker passes the call through and returns its value."""
    calls = []

    @baldur.circuit_breaker("smoke")
    def f(x):
        calls.append(x)
        return x * 2

    assert f(21) == 42
    assert calls == [21]
    assert baldur.get_breaker("smoke").state is baldur.CircuitState.CLOSED
