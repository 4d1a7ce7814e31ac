"""Serving: Serve app config rendering and validation, Serve REST client, rollout decisions, readiness probe."""
