"""Data layer: read chat data (or plain text), tokenize with exact loss masks, cache, and batch.

The trainer needs only ``DataConfig``, ``load_tokenized`` and the batching classes::

    ds, report = load_tokenized(DataConfig(paths=["train.jsonl"]), tokenizer, block_size=16)
    plan = BatchPlan(ds["length"], token_budget=8192, seed=0)
    it = BatchIterator(ds, plan, pad_id=tokenizer.pad_token_id, rank=r, world_size=w)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .batching import BatchIterator, BatchPlan, MicroBatch
from .cache import cache_key, cached_build, default_cache_dir
from .chat_template import read_chat_template, use_chat_template
from .decontaminate import drop_eval_prompts, evaluation_prompts
from .errors import DataError, SkipReport
from .readers import read_records, resolve_files
from .tokenize import TokenizeOptions, default_num_workers, tokenize_records

if TYPE_CHECKING:
    import datasets

__all__ = ["BatchIterator", "BatchPlan", "DataConfig", "DataError", "MicroBatch", "SkipReport",
           "batch_plan", "load_tokenized", "tokenize_options", "use_chat_template"]


@dataclass
class DataConfig:
    """The ``data:`` section of a job config; ``paths`` defaults to empty so a JobConfig can be built
    before it is filled in, and ``validate()`` then insists on it."""

    paths: list[str] = field(default_factory=list)  # chat or plain-text files (JSONL, JSON, Parquet) or folders of them
    max_length: int = 2048  # tokens per conversation or document; longer ones are cut (and counted)
    supervise: str = "all"  # or "last"
    keep_reasoning: bool = True  # keep <think> content of assistant turns
    min_supervised_tokens: int | None = None  # None -> 2 * block_size
    strict: bool = False  # stop at the first bad record instead of a counted skip
    cache_dir: str | None = None  # tokenized-data cache (null: $DFLASH_DATA_CACHE or ~/.cache/dflash_train/data)
    token_budget: int = 8192  # padded tokens per micro-batch (rows x length)
    pad_to_multiple: int = 64  # pad row lengths to a multiple of this (fewer compiled shapes)
    # Train on a fixed random subset of at most this many examples (data-size scaling runs);
    # the subset depends only on the data, so every rank and every size share one cache entry.
    max_examples: int | None = None
    # Several conversations per row of exactly max_length tokens (no attention, feature or
    # label crosses a conversation): less padding, one static shape.
    pack: bool = False
    # Processes that tokenize when the cache is built (null: min(8, CPU cores); 0 or 1: serial).
    # The cached result does not depend on it.
    num_workers: int | None = None
    # Cut answers that end in a repetition loop down to two periods of the loop (data/loops.py):
    # trivially predictable tokens that inflate the training accuracy and cost compute.
    trim_loops: bool = False
    # Skip conversations whose answers are mostly copies of what precedes them: prompt lookup
    # (n-gram speculation, data/lookup.py) would draft more than this many tokens per step of
    # them (1.0: nothing copied). Null: keep all. Counted as "mostly_copied" in the data report.
    max_lookup_tau: float | None = None
    # Steps a background thread collates and prepares (anchors, feature-cache indices) ahead of
    # the trainer (data/prefetch.py); 0: on the training thread. Training is the same either way.
    prefetch_steps: int = 2
    # The chat template conversations are formatted with: a Jinja template string or the path of
    # a .jinja file (data/chat_template.py). Null: the tokenizer's own. Needed for chat records
    # with a base model's tokenizer, which has none; plain-text records ({"text": ...}) need none.
    chat_template: str | None = None
    # Drop every record that asks an evaluation prompt (a user turn equal to, containing or near one;
    # data/decontaminate.py): the packaged sets heldout and selection, the sets or files listed in
    # exclude_prompts, and the job's eval.prompts (added to exclude_prompts when the config is read).
    # Counted as "eval_prompt" in the data report. False keeps them (then tau on those prompts is recall).
    exclude_eval_prompts: bool = True
    exclude_prompts: list[str] = field(default_factory=list)  # more prompt sets or files to keep out

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        if isinstance(self.paths, str) or not self.paths or not all(isinstance(p, str) for p in self.paths):
            raise ValueError("data.paths: expected a non-empty list of file or folder paths")
        for name in ("max_length", "token_budget", "pad_to_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"data.{name}: expected a positive integer, got {value!r}")
        if self.supervise not in ("all", "last"):
            raise ValueError(f"data.supervise: expected 'all' or 'last', got {self.supervise!r}")
        mst = self.min_supervised_tokens
        if mst is not None and (not isinstance(mst, int) or isinstance(mst, bool) or mst < 0):
            raise ValueError(f"data.min_supervised_tokens: expected a non-negative integer or null, got {mst!r}")
        me = self.max_examples
        if me is not None and (not isinstance(me, int) or isinstance(me, bool) or me < 1):
            raise ValueError(f"data.max_examples: expected a positive integer or null, got {me!r}")
        for name in ("pack", "trim_loops", "exclude_eval_prompts"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"data.{name}: expected true or false, got {getattr(self, name)!r}")
        mlt = self.max_lookup_tau
        if mlt is not None and (not isinstance(mlt, int | float) or isinstance(mlt, bool) or not mlt >= 1):
            raise ValueError(f"data.max_lookup_tau: expected a number >= 1 (tokens per step) or null, got {mlt!r}")
        nw = self.num_workers
        if nw is not None and (not isinstance(nw, int) or isinstance(nw, bool) or nw < 0):
            raise ValueError(f"data.num_workers: expected a non-negative integer or null, got {nw!r}")
        ps = self.prefetch_steps
        if not isinstance(ps, int) or isinstance(ps, bool) or ps < 0:
            raise ValueError(f"data.prefetch_steps: expected a non-negative integer, got {ps!r}")
        read_chat_template(self.chat_template)  # a missing file or a non-template: one line now
        self._validate_exclude_prompts()
        padded = -(-self.max_length // self.pad_to_multiple) * self.pad_to_multiple
        if self.token_budget < padded:
            raise ValueError(f"data.token_budget ({self.token_budget}) must be >= data.max_length rounded up to "
                             f"data.pad_to_multiple ({padded}) so the longest example fits one micro-batch")

    def _validate_exclude_prompts(self) -> None:
        from .prompt_sets import resolve_prompts

        if not isinstance(self.exclude_prompts, list) or not all(isinstance(p, str) for p in self.exclude_prompts):
            raise ValueError("data.exclude_prompts: expected a list of prompt set names or prompt files")
        for source in self.exclude_prompts:
            if not resolve_prompts(source).is_file():
                raise ValueError(f"data.exclude_prompts: {source}: no such prompt file or named set")

    def to_dict(self) -> dict:
        return asdict(self)


def tokenize_options(cfg: DataConfig, block_size: int) -> TokenizeOptions:
    mst = 2 * block_size if cfg.min_supervised_tokens is None else cfg.min_supervised_tokens
    return TokenizeOptions(cfg.max_length, cfg.supervise, cfg.keep_reasoning, mst, cfg.trim_loops,
                           None if cfg.max_lookup_tau is None else float(cfg.max_lookup_tau))


def load_tokenized(cfg: DataConfig, tokenizer, block_size: int) -> tuple[datasets.Dataset, SkipReport]:
    """Tokenized dataset (cached on disk) and the report of what was read, kept and skipped.
    ``data.chat_template``, when set, is installed on ``tokenizer`` first (for every later use)."""
    cfg.validate()
    use_chat_template(tokenizer, cfg.chat_template)
    opts = tokenize_options(cfg, block_size)
    files = resolve_files(cfg.paths)
    excluded = evaluation_prompts(cfg.exclude_prompts) if cfg.exclude_eval_prompts else None
    options = {**opts.key(), "strict": cfg.strict}
    if excluded is not None:
        options["exclude_eval_prompts"] = excluded.fingerprint()
    key = cache_key(files, tokenizer, options)
    cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()

    def build(report: SkipReport):
        records = read_records([str(f) for f in files], report, cfg.strict)
        if excluded is not None:
            records = drop_eval_prompts(records, excluded, report)
        workers = default_num_workers() if cfg.num_workers is None else cfg.num_workers
        return tokenize_records(records, tokenizer, opts, report, cfg.strict, workers)

    ds, report = cached_build(cache_dir, key, build)
    if len(ds) == 0:
        raise ValueError(f"no usable training examples in {cfg.paths}\n{report.format()}")
    if cfg.max_examples is not None and cfg.max_examples < len(ds):
        ds = subset(ds, cfg.max_examples)
    return ds, report


def batch_plan(lengths: list[int], cfg: DataConfig, seed: int) -> BatchPlan:
    """The micro-batch plan the ``data:`` section asks for (packed rows of max_length or not)."""
    return BatchPlan(list(lengths), cfg.token_budget, seed, cfg.pad_to_multiple,
                     pack_length=cfg.max_length if cfg.pack else None)


def subset(ds: datasets.Dataset, n: int) -> datasets.Dataset:
    """``n`` examples drawn without replacement by a fixed seed, in their original order.
    Nested: the subset of size n is contained in the subset of any larger size."""
    import random

    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    return ds.select(sorted(order[:n]))
