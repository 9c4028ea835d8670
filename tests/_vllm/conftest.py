"""``builders.py`` imports vLLM at module level: only the vLLM tier (``tests/vllm``) imports it."""

collect_ignore = ["builders.py"]
