"""Acceptance test: stages and their report."""
