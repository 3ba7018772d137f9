"""vLLM's OpenAI-compatible server with the method inside: the served model, the server's
lifetime, its worker, and what is measured against it (load tests, soak, determinism).
Builds on `binding` and `running`."""
