"""Composed prompts: filled templates, seeded, distinct, never equal or near a never-trained prompt."""

from __future__ import annotations

import json
import random
import re

from dflash_train.data.builders import composed_prompts as C
from dflash_train.data.builders import prompts as P


def test_near_catches_paraphrases_not_neighbours():
    heldout = P.content_words("What is the difference between weather and climate?")
    assert P.is_near(P.content_words("Explain the difference between climate and weather."), heldout)
    # all three content words of the held-out prompt inside a longer one
    assert P.is_near(P.content_words("Why is the sky blue during the day but red at sunset?"),
                     P.content_words("Why is the sky blue?")) is False  # {sky, blue}: only two words
    assert P.is_near(P.content_words("I'm curious: how do noise cancelling headphones work, roughly?"),
                     P.content_words("How do noise-cancelling headphones work?"))
    assert not P.is_near(P.content_words("What is the difference between weather and a forecast?"), heldout)
    assert not P.is_near(P.content_words("Write a poem about autumn leaves."), heldout)
    assert not P.is_near(frozenset(), heldout)


def test_promptset_refuses_near_heldout_and_counts_it():
    ps = P.PromptSet(["How do noise-cancelling headphones work?"])
    assert ps.near_heldout("Explain how noise cancelling headphones work in simple words") is not None
    assert not ps.add("Explain how noise cancelling headphones work in simple words", "t")
    assert ps.add("How does a thermostat work?", "t")
    assert ps.rejected["near_heldout"] == 1 and len(ps) == 1


def test_compose_fills_every_slot_and_is_seeded():
    rng = random.Random(0)
    drawn = [C.compose_prompt(rng) for _ in range(3000)]
    for text, source in drawn:
        assert not re.search(r"\{[a-z]{1,2}\}", text), text
        assert source.startswith("composed/") and text.strip() == text and len(text) > 10
    families = {s.split("/")[1] for _, s in drawn}
    assert {"topic", "math", "plan", "v", "m", "pq", "cs", "e", "lk", "o", "x", "g"} <= families
    assert [C.compose_prompt(random.Random(7)) for _ in range(1)] == [C.compose_prompt(random.Random(7))]


def test_add_composed_gives_distinct_prompts_never_near_the_never_trained_sets():
    never = P.load_heldout()
    ps = P.PromptSet(never)
    assert C.add_composed(ps, 4000, seed=1) == 4000
    texts = [it["text"] for it in ps.items]
    assert len({P.normalize(t) for t in texts}) == 4000
    checker = P.PromptSet(never)
    assert not any(checker.is_heldout(t) or checker.near_heldout(t) for t in texts)
    assert ps.rejected["near_heldout"] + ps.rejected["heldout"] > 0  # the guard did act on some draws
    again = P.PromptSet(never)
    C.add_composed(again, 4000, seed=1)
    assert [it["text"] for it in again.items] == texts
    other = P.PromptSet(never)
    C.add_composed(other, 4000, seed=2)
    assert [it["text"] for it in other.items] != texts


def test_add_composed_stops_when_the_templates_run_out():
    ps = P.PromptSet()
    added = C.add_composed(ps, 200_000, seed=0, max_draws_per_prompt=1)  # 200,000 draws, then it stops
    assert 10_000 < added < 200_000 and added == len(ps)


def test_cli_writes_composed_records(tmp_path):
    out = tmp_path / "p.jsonl"
    assert P.main(["--out", str(out), "--no-seeds", "--num-composed", "300", "--seed", "3"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 300
    assert all(r["source"].startswith("composed/") for r in rows)
    assert all(r["messages"][1] == {"role": "assistant", "content": ""} for r in rows)
