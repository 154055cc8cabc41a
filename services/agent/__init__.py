"""The node agent: heartbeats, and the per-job controller that runs a gang's ranks on its node."""
