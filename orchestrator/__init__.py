"""orch: deploy vLLM on a cluster of GPU machines through Ray.

The package is a pure core (manifest, probes' parsers, preflight, planner, rendering) with thin
edges (SSH/local runners, Ray and Serve REST clients, state database). Only ``orchestrator.cli``
prints and picks exit codes.
"""

__version__ = "0.1.0"
