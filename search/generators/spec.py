"""Generator specs on the command line: `vllm:MODEL_OR_PATH`, `openai:URL[#model]`, `replay:PATH`.

Each generator module is imported only when its spec is used, so `replay:` works without vLLM installed.
"""

from __future__ import annotations

import inspect
from typing import Any

from search.generators.base import Generator, GeneratorError

FORMS = "vllm:MODEL_OR_PATH, openai:URL[#model] or replay:PATH"


def parse_generator_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split a spec into its kind and constructor arguments; GeneratorError names the accepted forms.

    >>> parse_generator_spec("openai:http://127.0.0.1:8000/v1#qwen")
    ('openai', {'base_url': 'http://127.0.0.1:8000/v1', 'model': 'qwen'})
    """
    kind, sep, rest = spec.strip().partition(":")
    rest = rest.strip()
    if not sep or not rest:
        raise GeneratorError(f"generator '{spec}' is not one of {FORMS}")
    if kind == "vllm":
        return kind, {"model": rest}
    if kind == "openai":
        url, _, model = rest.partition("#")
        if not url.startswith(("http://", "https://")):
            raise GeneratorError(f"openai generator needs an http(s) URL, got '{url}': use {FORMS}")
        return kind, {"base_url": url, "model": model.strip() or None}
    if kind == "replay":
        return kind, {"path": rest}
    raise GeneratorError(f"unknown generator kind '{kind}': use {FORMS}")


def make_generator(spec: str, **options: Any) -> Generator:
    """Build the generator a spec names. `options` go to its constructor; those it does not take, and those
    set to None, are dropped, so the runner can pass the same options (e.g. `seed`) whatever the kind."""
    kind, args = parse_generator_spec(spec)
    options = {k: v for k, v in options.items() if v is not None}
    if kind == "replay":
        from search.generators.replay import ReplayGenerator as cls
    elif kind == "openai":
        from search.generators.openai_client import OpenAIGenerator as cls
    else:
        from search.generators.vllm_engine import VLLMGenerator as cls

        options.pop("seed", None)  # every sample carries its own seed; the engine-wide one would change nothing
    return cls(**args, **_accepted(cls, options))


def _accepted(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """The options cls's constructor takes (all of them when it takes **kwargs, as VLLMGenerator does)."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return options
    names = {p.name for p in params}
    return {k: v for k, v in options.items() if k in names}
