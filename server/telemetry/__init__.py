"""What the server tells its operators: Prometheus metrics (shared and per protocol) and logs."""
