"""The faces: each speaks one API (LMSP, OpenAI, …) over the same service.

A face declares its routes once (method, path, handler, scope, OpenAPI operation), translates
each request into a `service.plan.GenerationPlan`, renders its own errors and projects the
run's events into its own frames. `server.py` mounts the faces; nothing below imports one.
"""
