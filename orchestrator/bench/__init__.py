"""Benchmarks: load generator, prompts, targets, SSE decoding, latency math, Prometheus histograms, reports."""
