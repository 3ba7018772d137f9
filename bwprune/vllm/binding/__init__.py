"""The method inside vLLM's model: model classes, per-forward session, host glue, scheduler.

Imports nothing from `running` or `serving`: a model vLLM loads in a worker needs only this.
"""
