"""The real-SGLang tier: tests against SGLang 0.5.23's own pool classes (see README.md)."""
