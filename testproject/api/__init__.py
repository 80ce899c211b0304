"""The test project's small JSON API: the inbound side of baldur_django at work."""
