"""A benchmark run inside vLLM: its batches through `vllm.LLM`, paired timing, the method in
vLLM's workers, and the two engines compared decision by decision. Builds on `binding`."""
