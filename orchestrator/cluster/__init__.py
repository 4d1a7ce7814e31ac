"""Ray on the nodes: start/stop/env, the dashboard REST client, and what `orch up` must do (pure decision)."""
