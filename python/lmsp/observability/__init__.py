"""Watching the service run: Prometheus metrics (`GET /metrics`) and the access log."""
