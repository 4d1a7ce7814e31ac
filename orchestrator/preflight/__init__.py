"""Preflight: finding codes, checks by topic (pure), and the run over gathered facts."""
