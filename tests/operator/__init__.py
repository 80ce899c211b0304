"""Operator control: services, admin, commands, Slack, browser (OP-1..OP-8, CFG-4, CB-13)."""
