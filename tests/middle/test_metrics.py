"""``GET /metrics`` on the agent's HTTP API (issue 25): Prometheus text that ``prometheus_client`` parses, behind
the bearer token, whose counters move by exactly what one known answer did."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.middle.test_openai_api import MAX_TOKENS, QUESTION, _api
from tests.middle.toy_ring import run
from tests.support.metric_samples import metric_samples as _samples


def test_metrics_parse_and_move_by_one_answer(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_ring, daemon, client):
            assert daemon.addresses is not None and daemon.addresses.http is not None and daemon.chats is not None
            host, port = daemon.addresses.http
            url, auth = f"http://{host}:{port}/metrics", {"Authorization": f"Bearer {daemon.chats.token}"}
            async with httpx.AsyncClient() as http:
                assert (await http.get(url)).status_code == 401
                scraped = await http.get(url, headers=auth)
                assert scraped.status_code == 200
                assert scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
                before = _samples(scraped.text)
                answer = await client.chat.completions.create(
                    model="toy/decoder", messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS
                )
                after = _samples((await http.get(url, headers=auth)).text)
            assert answer.usage is not None
            moved = {name: after[name] - before.get(name, 0.0) for name in after}
            assert moved["shoal_chat_answers_total"] == 1
            assert moved["shoal_chat_tokens_total"] == answer.usage.completion_tokens == MAX_TOKENS
            assert moved["shoal_chat_prompt_tokens_total"] == answer.usage.prompt_tokens
            assert moved["shoal_chat_steps_total"] >= 1
            assert moved["shoal_chat_answer_seconds_total"] > 0
            assert after["shoal_chat_running"] == 0
            # the toy ring's stages answered this agent's steps: the histogram counts what the counter counts
            assert after["shoal_stage_step_seconds_count"] == after["shoal_stage_steps_total"]
            assert after["shoal_stage_step_seconds_bucket{le=+Inf}"] == after["shoal_stage_steps_total"]

    run(main)


def test_without_the_token_metrics_are_refused_like_the_api(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_ring, daemon, _client):
            assert daemon.addresses is not None and daemon.addresses.http is not None
            host, port = daemon.addresses.http
            async with httpx.AsyncClient() as http:
                refused = await http.get(f"http://{host}:{port}/metrics", headers={"Authorization": "Bearer nope"})
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"

    run(main)


def test_the_heads_own_stage_work_and_every_refusal_are_counted(tmp_path: Path) -> None:
    """Issue 40 §6: a head holding stage 0 computes it in-process for its chats; its sessions and steps are this
    agent's stages' as much as the ring's are, and requests the API refuses count as errors."""

    async def main() -> None:
        async with _api(tmp_path) as (ring, daemon, client):
            assert daemon.addresses is not None and daemon.addresses.http is not None and daemon.chats is not None
            host, port = daemon.addresses.http
            url, auth = f"http://{host}:{port}/metrics", {"Authorization": f"Bearer {daemon.chats.token}"}
            own_stage = ring.chat_stages[0]
            async with httpx.AsyncClient() as http:
                before = _samples((await http.get(url, headers=auth)).text)
                stream = await client.chat.completions.create(
                    model="toy/decoder",
                    messages=[{"role": "user", "content": QUESTION}],
                    max_tokens=MAX_TOKENS,
                    stream=True,
                )
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        break  # an answer under way: its prompt ran on this agent's stage 0
                during = _samples((await http.get(url, headers=auth)).text)
                async for _ in stream:
                    pass
                after = _samples((await http.get(url, headers=auth)).text)
                # refused before any answer began: a body shoal cannot honour, a wrong token, an unknown path
                assert (
                    await http.post(f"http://{host}:{port}/v1/chat/completions", headers=auth, json={"n": 2})
                ).status_code == 400
                assert (await http.get(url, headers={"Authorization": "Bearer nope"})).status_code == 401
                assert (await http.get(f"http://{host}:{port}/v2/nothing", headers=auth)).status_code == 404
                refused = _samples((await http.get(url, headers=auth)).text)
            assert during["shoal_sessions_open"] >= 1 and during["shoal_stage_steps_total"] >= 1
            assert after["shoal_sessions_open"] == 1  # the conversation is kept on stage 0 for its next turn
            moved = after["shoal_stage_steps_total"] - before["shoal_stage_steps_total"]
            assert moved == len(own_stage.steps) > 0  # every step of the answer ran stage 0 here, nothing else did
            assert after["shoal_stage_step_seconds_count"] == after["shoal_stage_steps_total"]
            assert after["shoal_stage_compute_seconds_total"] > 0
            for code in ("bad_request", "unauthorized", "not_found"):
                name = f"shoal_chat_errors_total{{code={code}}}"
                assert refused[name] - after.get(name, 0.0) == 1, code

    run(main)
