"""A generator that runs vLLM in-process (v1 `AsyncLLM`): n samples per prompt, one engine request each.

Each sample is its own engine request (`n=1`, its own seed) rather than one request with `n` children, so a
sample's text depends only on its seed and every sample is yielded the moment it finishes. vLLM is imported
lazily: importing this module costs nothing on a machine without vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from search.generators.base import Completion, Generator, GeneratorError, SampleRequest, as_finished

log = logging.getLogger(__name__)


class VLLMGenerator(Generator):
    """vLLM's `AsyncLLM` in this process (inside the generator's Ray actor), restarted if the engine dies."""

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.6,  # a cap well below vLLM's 0.9, so an oracle fits on the same GPU
        max_model_len: int | None = None,
        dtype: str = "auto",
        load_format: str = "auto",  # "dummy": random weights, no download (tests)
        enforce_eager: bool = False,
        **engine_kwargs: Any,  # anything else AsyncEngineArgs takes (max_num_seqs, seed, ...)
    ) -> None:
        self.model = model
        self.engine_args: dict[str, Any] = dict(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            load_format=load_format,
            enforce_eager=enforce_eager,
            **engine_kwargs,
        )
        self.restarts = 0  # how often a dead engine was replaced
        self._live: dict[str, tuple[list[str], list[asyncio.Task[Completion | None]]]] = {}
        self._lock = asyncio.Lock()
        self._dead = False
        self._paused = False
        self._engine: Any = self._start()

    # -- engine life -------------------------------------------------------------------------------------

    def _start(self) -> Any:
        """Build the engine (blocks for as long as the model takes to load)."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise GeneratorError(f"vLLM is not installed ({e}); install it with: pip install 'kernelsearch[vllm]'") from e
        try:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.engine_args))
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise GeneratorError(f"cannot start vLLM for {self.model}: {first}") from e

    async def _ensure_engine(self) -> Any:
        """Return a live engine, replacing one that died (once, however many samples ask at the same time)."""
        async with self._lock:
            engine = self._engine
            if engine is not None and not self._dead and not engine.errored:
                return engine
            if engine is None and not self._dead:
                raise GeneratorError(f"the vLLM generator for {self.model} is closed")
            log.warning("vLLM engine for %s is dead; starting a new one", self.model)
            self._engine = None
            if engine is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(engine.shutdown)
            self._engine = await asyncio.to_thread(self._start)
            self._dead = False
            self.restarts += 1
            if self._paused:  # a pause outlives the engine it was meant for
                await self._pause_engine(self._engine)
            return self._engine

    # -- sampling ----------------------------------------------------------------------------------------

    async def sample(self, request: SampleRequest) -> AsyncIterator[Completion]:  # type: ignore[override]
        engine = await self._ensure_engine()
        prompt_ids = self._prompt_ids(engine, request.messages)
        limit = engine.model_config.max_model_len
        if len(prompt_ids) >= limit:
            for i, seed in enumerate(request.seeds):
                yield self._failed(request, i, seed, f"prompt has {len(prompt_ids)} tokens; the model's limit is {limit}")
            return
        max_tokens = min(request.max_tokens, limit - len(prompt_ids))
        sample_ids = [f"{request.request_id}-{i}" for i in range(request.n)]
        tasks = [
            asyncio.create_task(self._one(engine, request, i, sample_ids[i], prompt_ids, max_tokens))
            for i in range(request.n)
        ]
        self._live[request.request_id] = (sample_ids, tasks)
        try:  # aborted, or the consumer stopped early: cancelling a sample aborts it in the engine
            async with contextlib.aclosing(as_finished(tasks)) as finished:
                async for completion in finished:
                    yield completion
        finally:
            self._live.pop(request.request_id, None)

    def _prompt_ids(self, engine: Any, messages: list[dict[str, str]]) -> list[int]:
        """Chat template -> token ids, tokenised once per request and shared by its n samples."""
        tokenizer = engine.get_tokenizer()
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:
            raise GeneratorError(f"cannot apply the chat template of {self.model}: {e}") from e
        return list(tokenizer.encode(text, add_special_tokens=False))  # the template already holds any BOS

    async def _one(
        self, engine: Any, request: SampleRequest, i: int, sample_id: str, prompt_ids: list[int], max_tokens: int
    ) -> Completion | None:
        """Run one sample to its end; None when it was aborted. Never raises (but can be cancelled)."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        seed = request.seeds[i]
        params = SamplingParams(
            n=1,
            seed=seed,
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=max_tokens,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        final = None
        try:
            async for out in engine.generate(await _engine_prompt(engine, prompt_ids), params, sample_id):
                final = out
        except Exception as e:  # EngineDeadError, a rejected request, ...
            if engine.errored:
                self._dead = True  # the next `sample` call starts a new engine
            return self._failed(request, i, seed, f"vLLM: {type(e).__name__}: {e}".strip())
        if final is None or final.outputs[0].finish_reason == "abort":
            return None
        output = final.outputs[0]
        return Completion(
            request_id=request.request_id,
            index=i,
            seed=seed,
            text=output.text,
            tokens=len(output.token_ids),
            prompt_tokens=len(final.prompt_token_ids or prompt_ids),
            finish_reason=output.finish_reason,
        )

    @staticmethod
    def _failed(request: SampleRequest, i: int, seed: int, error: str) -> Completion:
        return Completion(request_id=request.request_id, index=i, seed=seed, text="", error=error)

    async def abort(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is None or self._engine is None:
            return
        sample_ids, tasks = live
        with contextlib.suppress(Exception):  # a dead engine has nothing left to abort
            await self._engine.abort(sample_ids)
        for task in tasks:  # a sample still being added to the engine is stopped here
            task.cancel()

    # -- sharing the GPU with an oracle ---------------------------------------------------------------------

    async def pause(self) -> None:
        """Freeze the engine's scheduler while an oracle on the same GPU times a candidate.

        vLLM's `pause_generation(mode="keep")`: running and waiting requests stay in the engine with their KV
        cache (`clear_cache=False`) and no step runs until `resume_generation`; new requests queue. It returns
        once the engine core is idle and has synchronised the device, so the oracle's timing starts on a quiet
        GPU. (`sleep`/`wake_up` would also free the GPU memory, but it drops the KV cache and reloads weights:
        far too slow for a pause per candidate; `mode="abort"` would throw the samples' progress away.)
        """
        self._paused = True
        async with self._lock:  # not while a dead engine is being replaced (the new one is paused on start)
            engine = self._engine
        if engine is not None and not self._dead and not engine.errored:
            await self._pause_engine(engine)

    async def resume(self) -> None:
        self._paused = False
        async with self._lock:
            engine = self._engine
        if engine is not None and not self._dead and not engine.errored:
            with contextlib.suppress(Exception):  # a dead engine has nothing to resume; the next sample restarts it
                await engine.resume_generation()

    @staticmethod
    async def _pause_engine(engine: Any) -> None:
        try:
            await engine.pause_generation(mode="keep", clear_cache=False)
        except (AttributeError, TypeError) as e:  # older vLLM: no pause, or one that aborts or drains requests
            raise GeneratorError(f"this vLLM cannot freeze generation in place (pause_generation(mode='keep')): {e}") from e

    # -- the rest ----------------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        try:
            import vllm

            version = vllm.__version__
        except ImportError:
            version = None
        args = {k: v for k, v in self.engine_args.items() if isinstance(v, str | int | float | bool | None)}
        return {
            "kind": "vllm",
            "model": self.model,
            "tensor_parallel_size": self.engine_args["tensor_parallel_size"],
            "gpu_memory_utilization": self.engine_args["gpu_memory_utilization"],
            "vllm_version": version,
            "engine_args": args,
        }

    async def close(self) -> None:
        engine, self._engine, self._dead = self._engine, None, False
        for _, tasks in list(self._live.values()):
            for task in tasks:
                task.cancel()
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)


async def _engine_prompt(engine: Any, prompt_ids: list[int]) -> Any:
    """The engine's input for token ids: rendered by the engine's renderer where this vLLM has one (newer
    versions deprecate raw prompts in `generate`), else a plain `TokensPrompt`."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=prompt_ids)
    renderer = getattr(engine, "renderer", None)
    if renderer is not None and hasattr(renderer, "render_cmpl_async"):
        (rendered,) = await renderer.render_cmpl_async([prompt])
        return rendered
    return prompt
