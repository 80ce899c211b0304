"""The load-aware stages a protected call runs through, each in a module of its own."""
