"""What to serve, decided without I/O: the Serve application config (rendering, placement,
routing, in-flight caps, autoscaling bounds), where a model is loaded from, the rollout decisions
and the SLO gate's verdict, and node_hooks (the callback Serve runs on the nodes, shipped as
source). These modules are pure: tests/unit/test_layers.py forbids ray, httpx, paramiko,
subprocess and the state store in them. The I/O with Ray Serve is the subpackage
``orchestrator.serve.ray_io``; the I/O edges of the commands are ``orchestrator.workflows``."""
