"""A small shop project used to show and test baldur_django against a real HTTP dependency."""
