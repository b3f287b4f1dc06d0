"""Generators: where completions come from (vLLM, an OpenAI-compatible server, or a replay of a past run)."""
