"""vLLM's scheduler, with every forward all prompts or all decode steps.

vLLM's scheduler fills each forward's token budget with decode tokens and prompt chunks together.
A method of this project decides per forward, for the batch: a prompt forward is observed apart
and runs dense, a decode forward runs the kept set in force (`bwprune.engine.protocol`), so a
stream in vLLM (`bwprune.vllm.session.StreamSession`) needs the two kinds apart. This scheduler
gives a forward to arriving prompts first, whole (chunked prefill off), while the running requests
wait that one step: the prefill-first policy of vLLM's V0 engine, and what the HF stream does
(`bwprune.generation.stream`). So a stream has the same forwards in both engines.
"""

from __future__ import annotations

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler


class UnmixedScheduler(Scheduler):
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """Prompts that can take a seat run alone; if none could (no KV blocks yet), the running
        requests decode instead, so waiting never stalls the batch."""
        if len(self.waiting) and len(self.running) < self.max_num_running_reqs:
            for request in self.running:  # `schedule` advances current_step first: skip one
                request.next_decode_eligible_step = max(
                    request.next_decode_eligible_step, self.current_step + 2
                )
            out = super().schedule(throttle_prefills)
            if out.total_num_scheduled_tokens or not self.running:
                return out
        return super().schedule(throttle_prefills)
