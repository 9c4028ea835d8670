"""Building vLLM's own KV caches on the CPU for the vLLM tier (``tests/vllm``)."""
