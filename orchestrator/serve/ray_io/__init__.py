"""The serve domain's I/O with Ray Serve: its REST API on the dashboard (client), the served
endpoint as orch probes it (readiness), validation with Ray Serve LLM's own models (validate) and
the engine argument names read from Ray's installed sources (engine_arg_names). What to serve,
decided without I/O, is the rest of ``orchestrator.serve``."""
