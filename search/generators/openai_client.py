"""A generator for any OpenAI-compatible chat server (`vllm serve`, SGLang, llama.cpp's server, ...).

One streaming HTTP request per sample (`n: 1`, its own `seed`), all in flight at once, so each sample's text
depends only on its seed and is yielded the moment it finishes. Aborting closes the samples' HTTP streams:
vLLM's server cancels a request whose client went away, so the GPU stops working on it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from search.generators.base import Completion, Generator, GeneratorError, SampleRequest, as_finished


def normalize_base_url(url: str) -> str:
    """`host:8000`, `http://host:8000/` and `http://host:8000/v1` all mean `http://host:8000/v1`."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


class OpenAIGenerator(Generator):
    """Samples from an OpenAI-compatible `/v1/chat/completions` endpoint over streaming HTTP."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,  # default: $OPENAI_API_KEY, else none (a local server needs none)
        timeout: float = 600.0,  # seconds without a byte from the server before a sample fails
        max_connections: int = 256,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout, connect=10.0, pool=None)  # wait for a free connection, never fail
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=32)
        self.model = self._check(model)
        self._client: httpx.AsyncClient | None = None  # made on first use, inside the caller's event loop
        self._live: dict[str, list[asyncio.Task[Completion | None]]] = {}

    def _check(self, model: str | None) -> str:
        """Ask the server what it serves (GET /v1/models): proves it is reachable, and names the model when
        none was given (the first one listed)."""
        url = f"{self.base_url}/models"
        try:
            response = httpx.get(url, headers=self._headers, timeout=10.0)
            response.raise_for_status()
            served = [m["id"] for m in response.json()["data"]]
        except httpx.HTTPError as e:
            raise GeneratorError(f"OpenAI-compatible server at {self.base_url} is unreachable: {e}") from e
        except (ValueError, KeyError, TypeError) as e:
            raise GeneratorError(f"{url} did not answer with a model list") from e
        if model is None:
            if not served:
                raise GeneratorError(f"the server at {self.base_url} serves no model")
            return served[0]
        if model not in served:
            raise GeneratorError(f"the server at {self.base_url} does not serve {model!r} (it serves {served})")
        return model

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=self._timeout, limits=self._limits
            )
        return self._client

    async def sample(self, request: SampleRequest) -> AsyncIterator[Completion]:  # type: ignore[override]
        tasks = [asyncio.create_task(self._one(request, i)) for i in range(request.n)]
        self._live[request.request_id] = tasks
        try:  # aborted, or the consumer stopped early: close what is still streaming
            async with contextlib.aclosing(as_finished(tasks)) as finished:
                async for completion in finished:
                    yield completion
        finally:
            self._live.pop(request.request_id, None)

    async def _one(self, request: SampleRequest, i: int) -> Completion:
        """Stream one sample to its end. Never raises, but cancelling it closes its HTTP stream."""
        seed = request.seeds[i]
        body = {
            "model": self.model,
            "messages": request.messages,
            "n": 1,
            "seed": seed,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        done = Completion(request_id=request.request_id, index=i, seed=seed, text="")
        parts: list[str] = []
        try:
            async with self._http().stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")
                    done.error = f"HTTP {response.status_code} from {self.base_url}: {_one_line(detail)}"
                    return done
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, comments, keep-alives
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        done.error = f"{self.base_url}: {_one_line(json.dumps(chunk['error']))}"
                        return done
                    for choice in chunk.get("choices") or []:
                        parts.append((choice.get("delta") or {}).get("content") or "")
                        done.finish_reason = choice.get("finish_reason") or done.finish_reason
                    if usage := chunk.get("usage"):
                        done.tokens = usage.get("completion_tokens") or 0
                        done.prompt_tokens = usage.get("prompt_tokens") or 0
        except httpx.HTTPError as e:
            done.error = f"request to {self.base_url} failed: {type(e).__name__}: {_one_line(str(e))}"
            return done
        except ValueError as e:  # a chunk that is not JSON
            done.error = f"bad stream from {self.base_url}: {_one_line(str(e))}"
            return done
        done.text = "".join(parts)
        return done

    async def abort(self, request_id: str) -> None:
        for task in self._live.get(request_id, []):
            task.cancel()

    def describe(self) -> dict[str, Any]:
        return {"kind": "openai", "base_url": self.base_url, "model": self.model}

    async def close(self) -> None:
        for tasks in list(self._live.values()):
            for task in tasks:
                task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
