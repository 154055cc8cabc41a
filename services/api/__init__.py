"""The REST API: commands to the log, queries from read models fed by the bus (CQRS)."""
