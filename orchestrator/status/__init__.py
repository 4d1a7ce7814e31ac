"""Status domain logic: node table, serving problems, engine stats from metrics and logs."""
