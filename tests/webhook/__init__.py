"""Webhook jobs: the rules, delivery in process, delivery through real failures."""
