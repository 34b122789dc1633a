"""``GET /metrics`` on the agent's HTTP API (issue 25): Prometheus text that ``prometheus_client`` parses, behind
the bearer token, whose counters move by exactly what one known answer did."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.middle.test_openai_api import MAX_TOKENS, QUESTION, _api
from tests.middle.toy_ring import run

pytestmark = pytest.mark.api


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample (labels other than ``node`` written out)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "node")
            found[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return found


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
