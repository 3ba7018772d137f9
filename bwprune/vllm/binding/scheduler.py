"""vLLM's scheduler, with every forward all prompts or all decode steps.

vLLM's scheduler fills each forward's token budget with decode tokens and prompt chunks together.
A method of this project decides per forward, for the batch: a prompt forward is observed apart
and runs dense, a decode forward runs the kept set in force (`bwprune.engine.protocol`), so a
stream in vLLM (`bwprune.vllm.binding.session.StreamSession`) needs the two kinds apart. This
scheduler gives a forward to arriving prompts first, whole (chunked prefill off), while the running
requests wait that one step: the prefill-first policy of vLLM's V0 engine, and what the HF stream
does (`bwprune.generation.stream`). So a stream has the same forwards in both engines.
"""

from __future__ import annotations

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler


class UnmixedScheduler(Scheduler):
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """Prompts that can take a seat run alone; if none could (no KV blocks yet), the running
        requests decode instead, so waiting never stalls the batch (that forward's output carries
        what the empty one drained, `carried`)."""
        if len(self.waiting) and len(self.running) < self.max_num_running_reqs:
            for request in self.running:  # `schedule` advances current_step first: skip one
                request.next_decode_eligible_step = max(
                    request.next_decode_eligible_step, self.current_step + 2
                )
            out = super().schedule(throttle_prefills)
            if out.total_num_scheduled_tokens or not self.running:
                return out
            return carried(out, super().schedule(throttle_prefills))
        return super().schedule(throttle_prefills)


def carried(dropped: SchedulerOutput, out: SchedulerOutput) -> SchedulerOutput:
    """`out` with what `dropped` (an output that never reaches the workers) drained from the
    scheduler: the requests that finished or were preempted since the last forward, and the
    freed or new cache entries. Without it the workers never hear those requests finished: each
    keeps its state in vLLM's model runner, and its slot in a method's stream, for good (a
    preempting server grew, and its stream ran out of slots)."""
    out.finished_req_ids = dropped.finished_req_ids | out.finished_req_ids
    if dropped.preempted_req_ids:
        out.preempted_req_ids = dropped.preempted_req_ids | (out.preempted_req_ids or set())
    out.free_encoder_mm_hashes = dropped.free_encoder_mm_hashes + out.free_encoder_mm_hashes
    for name in ("new_block_ids_to_zero", "kv_cache_block_copies"):
        if getattr(dropped, name):
            setattr(out, name, getattr(dropped, name) + (getattr(out, name) or []))
    return out
