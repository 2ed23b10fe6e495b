"""``jenga serve``: an OpenAI-compatible HTTP server on jenga's own engine.

``app`` (routes) · ``schemas`` (request bodies -> ``SamplingParams``) · ``responses`` (bodies,
chunks, incremental text) · ``engine_loop`` (the thread that owns the ``LLM``) · ``metrics``
(Prometheus) · ``guard`` (API key, body size) · ``errors`` (OpenAI's error body) ·
``launch`` (uvicorn in the foreground or in a background thread) · ``cli`` (the subcommand).
Needs the ``serve`` extra (fastapi, uvicorn, prometheus_client).
"""
