"""vLLM's worker, binding the served method once the model is warm (`--worker-cls`).

vLLM runs dummy forwards while it sizes the KV cache and warms up; those are no requests of
anyone's, so the method is bound after them (`bwprune.vllm.serving.serve.bind_served`), from the
`bwprune` entry of vLLM's `--additional-config`, and unbound when the server stops.
"""

from __future__ import annotations

from vllm.platforms import current_platform

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as _Worker
else:
    from vllm.v1.worker.gpu_worker import Worker as _Worker


class ServingWorker(_Worker):
    def compile_or_warm_up_model(self):
        from bwprune.vllm.serving.serve import bind_served

        warmed = super().compile_or_warm_up_model()
        self.bwprune_bound = bind_served(self.model_runner, self.vllm_config.additional_config)
        return warmed

    def shutdown(self) -> None:
        """The server stops: requests still in a seat leave (their ledger lines are written;
        a finished request is otherwise seen to leave only at the next forward). vLLM waits for
        this only under a shutdown timeout (`serve.drain_s`,
        `bwprune.vllm.serving.serve.server_command`): with its default, 0, it kills the worker at
        once."""
        bound = getattr(self, "bwprune_bound", None)
        if bound is not None:
            self.bwprune_bound = None
            bound.close()
        super().shutdown()
