"""A draft model with another tokenizer (through text), and the n-gram + model hybrid, on real SmolLM2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.head.cross_drafter import CrossTokenizerDrafter, TextBridge
from agent.head.decode import DecodeStats
from agent.head.drafters import HybridDrafter
from agent.head.drafting import DrafterFactory, make_drafter
from agent.head.model_drafter import ModelDrafter
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import CompiledStage, LocalPipeline
from shards.manifest import Manifest
from tests.integration.local_decode import GREEDY, greedy_tokens

CODE = [
    "def add(a, b):\n    return a + b\n",
    "for item in items:\n    print(item)\n",
    "<|im_start|>user\nHello there, how are you?<|im_end|>\n<|im_start|>assistant\nFine, thanks.",
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(exported: Callable[..., Path]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(exported(1, "int4") / "tokenizer"))


@pytest.fixture(scope="module")
def small_tokenizer(smollm2_tokenizer: Any) -> Any:
    """A genuinely different byte-level BPE (a few hundred merges), same special tokens."""
    return smollm2_tokenizer.train_new_from_iterator(CODE * 20, vocab_size=400)


def test_text_bridge_between_two_tokenizers(smollm2_tokenizer: Any, small_tokenizer: Any) -> None:
    bridge = TextBridge(smollm2_tokenizer, small_tokenizer)
    for text in CODE:
        target_ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        draft_ids = bridge.to_draft(target_ids)
        assert draft_ids != target_ids  # the vocabularies really differ
        assert small_tokenizer.decode(draft_ids) == smollm2_tokenizer.decode(target_ids)
        # the draft's text, back in target ids, continues the context exactly
        cut = len(target_ids) // 2
        rest = bridge.draft_text(
            small_tokenizer.encode(smollm2_tokenizer.decode(target_ids[cut:]), add_special_tokens=False)
        )
        continued = bridge.continuation(target_ids[:cut], rest)
        assert continued
        assert smollm2_tokenizer.decode(target_ids[:cut] + continued) == text


def test_drafting_through_text_keeps_greedy_tokens(
    exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]], smollm2_tokenizer: Any
) -> None:
    # f32: mask-based rewind is exact there, so speculation may not change a single token
    config = RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", precision="f32")
    target_dir, draft_dir = exported(3, "int4"), exported(1, "int4")
    pipeline = LocalPipeline(target_dir, Manifest.load(target_dir), config)
    draft_manifest = Manifest.load(draft_dir)
    stage = CompiledStage(draft_dir, draft_manifest.stages[0], draft_manifest.weights, config)
    # the same tokenizer on both sides of the bridge: every draft still goes through text and back
    through_text = CrossTokenizerDrafter(ModelDrafter(stage, GREEDY), TextBridge(smollm2_tokenizer, smollm2_tokenizer))
    hybrid = make_drafter("ngram+draft", target_dir, Manifest.load(target_dir), GREEDY, config, draft_dir)
    assert isinstance(hybrid, HybridDrafter)
    prompts = chat_ids[:1]  # every draft goes through text (or the hybrid's lookup) and is judged: one answer
    plain = [greedy_tokens(pipeline, prompt) for prompt in prompts]
    for name, drafter in (("through text", through_text), ("ngram+draft", hybrid)):
        stats = DecodeStats()
        for prompt, want in zip(prompts, plain, strict=True):
            assert greedy_tokens(pipeline, prompt, drafter, stats) == want, name
        print(f"\n{name}: acceptance {stats.acceptance:.0%} of {stats.drafted} drafted in {stats.steps} steps")
        # the draft is the target's own weights in int4: most drafts must survive the round trip
        assert stats.drafted > 0 and stats.acceptance > 0.5, name


def test_drafters_of_one_factory_share_the_model_not_the_state(
    exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]]
) -> None:
    """Two conversations' drafters from one factory (one compiled draft model, as an agent's chats use it):
    interleaving them gives each exactly the drafts it gives alone."""
    config = RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", precision="f32")
    target_dir, draft_dir = exported(3, "int4"), exported(1, "int4")
    factory = DrafterFactory("draft", target_dir, Manifest.load(target_dir), config, draft_dir)
    a, b = factory.new(GREEDY), factory.new(GREEDY)
    assert a is not None and b is not None
    interleaved = [
        a.propose(chat_ids[0], 4).tokens,
        b.propose(chat_ids[1], 4).tokens,
        a.propose(chat_ids[0][:-3], 4).tokens,
        b.propose(chat_ids[1] + [42], 4).tokens,
    ]
    alone = []
    for context in (chat_ids[0], chat_ids[1], chat_ids[0][:-3], chat_ids[1] + [42]):
        fresh = factory.new(GREEDY)
        assert fresh is not None
        alone.append(fresh.propose(context, 4).tokens)
    assert interleaved == alone
    assert interleaved[0] != interleaved[1]  # the two contexts draft differently: state really is per drafter
    assert DrafterFactory("ngram", target_dir, Manifest.load(target_dir), config).new(GREEDY) is not None
    assert DrafterFactory("none", target_dir, Manifest.load(target_dir), config).new(GREEDY) is None
