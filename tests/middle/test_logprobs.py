"""``logprobs`` / ``top_logprobs`` on the OpenAI-style API (issue 40 §6), with the real ``openai`` client on the toy
ring: each token's log-probability and the most likely alternatives are ``log_softmax`` of the logits one toy
stage holding every layer computes in process at that position, for chat and legacy completions, whole and
streamed, greedy (with drafts verified through the ring) and sampled (a token outside the alternatives sent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

from agent.sampling.params import SamplingParams
from tests.middle.test_openai_api import QUESTION, _api
from tests.middle.toy_ring import ToyRing, reference, run
from tests.support.toy_model import ToyStage, ToyTokenizer, whole_model

TOLERANCE = 1e-5  # float32 on the wire, float64 here


def _log_softmax(ring: ToyRing, prompt: list[int], answer: list[int]) -> np.ndarray:
    """``[len(answer), vocab]``: the in-process model's log-probabilities at the position of each answer token."""
    whole = ToyStage(whole_model(ring.manifest), ring.weights).new_session()
    logits = whole.step(np.asarray([prompt + answer[:-1]], dtype=np.int64))[0].astype(np.float64)
    rows = logits[len(prompt) - 1 :]
    peak = rows.max(axis=-1, keepdims=True)
    return rows - (peak + np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True)))


def _check_token(expected: np.ndarray, token: int, logprob: float, top: list[tuple[str, float]], wanted: int) -> None:
    """One token's scores against its row of the in-process log-probabilities."""
    text = ToyTokenizer().decode
    assert logprob == pytest.approx(expected[token], abs=TOLERANCE)
    assert len(top) == wanted
    best = np.argsort(-expected, kind="stable")[:wanted]
    assert [value for _, value in top] == pytest.approx(expected[best].tolist(), abs=TOLERANCE)
    assert [piece for piece, _ in top] == [text([int(i)], skip_special_tokens=False) for i in best]


def test_chat_logprobs_are_the_models_whole_and_streamed_greedy_and_sampled(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (ring, _daemon, client):
            messages = [{"role": "user", "content": QUESTION}]
            prompt = ToyTokenizer().encode_chat(messages)
            greedy = await reference(ring, prompt, 20)
            expected = _log_softmax(ring, prompt, greedy)
            whole = await client.chat.completions.create(
                model="toy/decoder", messages=messages, max_tokens=20, logprobs=True, top_logprobs=5
            )
            content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
            assert content is not None and len(content) == len(greedy)
            for row, (token, entry) in enumerate(zip(greedy, content, strict=True)):
                top = [(alt.token, alt.logprob) for alt in entry.top_logprobs]
                _check_token(expected[row], token, entry.logprob, top, 5)
                assert entry.bytes == list(entry.token.encode())
            assert "".join(entry.token for entry in content) == whole.choices[0].message.content

            # sampled, with no alternatives asked: most tokens are not the most likely one sent
            params = SamplingParams(temperature=1.3, top_p=0.95, seed=5)
            sampled = await reference(ring, prompt, 24, params)
            expected = _log_softmax(ring, prompt, sampled)
            assert sum(int(np.argmax(expected[i])) != t for i, t in enumerate(sampled)) >= 3
            stream = await client.chat.completions.create(
                model="toy/decoder",
                messages=messages,
                max_tokens=24,
                temperature=1.3,
                top_p=0.95,
                seed=5,
                logprobs=True,
                stream=True,
            )
            entries = [
                e
                async for chunk in stream
                if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content or []
            ]
            assert len(entries) == len(sampled)
            for row, (token, entry) in enumerate(zip(sampled, entries, strict=True)):
                _check_token(expected[row], token, entry.logprob, [], 0)

            without = await client.chat.completions.create(model="toy/decoder", messages=messages, max_tokens=4)
            assert without.choices[0].logprobs is None

    run(main)


def test_completion_logprobs_in_the_legacy_shape_whole_and_streamed(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (ring, _daemon, client):
            prompt_text = "once upon a time"
            prompt = ToyTokenizer().encode(prompt_text, True)
            greedy = await reference(ring, prompt, 12)
            expected = _log_softmax(ring, prompt, greedy)
            done = await client.completions.create(model="toy/decoder", prompt=prompt_text, max_tokens=12, logprobs=3)
            scored = done.choices[0].logprobs
            assert scored is not None and scored.tokens is not None and scored.token_logprobs is not None
            assert scored.top_logprobs is not None and scored.text_offset is not None
            assert len(scored.tokens) == len(greedy) and "".join(scored.tokens) == done.choices[0].text
            assert scored.text_offset == [sum(map(len, scored.tokens[:i])) for i in range(len(greedy))]
            for row, token in enumerate(greedy):
                assert scored.token_logprobs[row] == pytest.approx(expected[row][token], abs=TOLERANCE)
                alternatives = scored.top_logprobs[row]
                assert max(alternatives.values()) == pytest.approx(expected[row].max(), abs=TOLERANCE)
                assert scored.tokens[row] in alternatives and len(alternatives) <= 4

            stream = await client.completions.create(
                model="toy/decoder", prompt=prompt_text, max_tokens=12, logprobs=3, stream=True
            )
            values = [
                v
                async for chunk in stream
                if chunk.choices and chunk.choices[0].logprobs
                for v in chunk.choices[0].logprobs.token_logprobs or []
            ]
            assert values == pytest.approx(scored.token_logprobs, abs=1e-7)

    run(main)


def test_logprobs_out_of_bounds_are_refused_naming_the_field(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_ring, _daemon, client):
            hi = [{"role": "user", "content": "hi"}]
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(model="toy/decoder", messages=hi, logprobs=True, top_logprobs=21)
            assert refused.value.param == "top_logprobs"
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(model="toy/decoder", messages=hi, top_logprobs=2)
            assert refused.value.param == "top_logprobs" and "needs 'logprobs': true" in refused.value.message
            with pytest.raises(openai.BadRequestError) as refused:
                await client.completions.create(model="toy/decoder", prompt="hi", logprobs=-1)
            assert refused.value.param == "logprobs"

    run(main)
