"""Generator specs on the command line: `vllm:MODEL_OR_PATH`, `openai:URL[#model]`, `replay:PATH`."""

from __future__ import annotations

from typing import Any

from search.generators.base import Generator, GeneratorError

FORMS = "vllm:MODEL_OR_PATH, openai:URL[#model] or replay:PATH"


def parse_generator_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split a spec into its kind and arguments; GeneratorError names the accepted forms."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise GeneratorError(f"generator '{spec}' is not one of {FORMS}")
    if kind == "vllm":
        return kind, {"model": rest}
    if kind == "openai":
        url, _, model = rest.partition("#")
        if not url.startswith(("http://", "https://")):
            raise GeneratorError(f"openai generator needs an http(s) URL, got '{url}'")
        return kind, {"base_url": url, "model": model or None}
    if kind == "replay":
        return kind, {"path": rest}
    raise GeneratorError(f"unknown generator kind '{kind}': use {FORMS}")


def make_generator(spec: str, **options: Any) -> Generator:
    """Build the generator a spec names; `options` go to its constructor (those it does not take are dropped)."""
    kind, args = parse_generator_spec(spec)
    if kind == "replay":
        from search.generators.replay import ReplayGenerator

        return ReplayGenerator(args["path"], seed=int(options.get("seed", 0)))
    if kind == "openai":
        from search.generators.openai_client import OpenAIGenerator

        return OpenAIGenerator(args["base_url"], args["model"])
    from search.generators.vllm_engine import VLLMGenerator

    options.pop("seed", None)
    return VLLMGenerator(args["model"], **options)
