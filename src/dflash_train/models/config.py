"""The drafter's architecture as a validated dataclass.

A drafter is described by the same fields the DFlash serving format stores in
``config.json`` (docs/spec.md section 4), so export is a plain field copy. Fields the user
leaves as ``None`` are filled from the target (:func:`resolve_drafter_config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """docs/spec.md section 1: one feature -> the middle layer; else layer 1 .. L-3, evenly spaced.

    The expression is the authors' and SGLang's, term for term: the integer product
    ``i * (L - 4)`` is formed first and divided once, then Python's (banker's) ``round``.
    Writing it as ``i * ((L - 4) / (n - 1))`` rounds the quotient first and can land on
    the other side of a .5 tie (L=65, n=15: layer 31 instead of 32), which would pair a
    drafter with different layers than the serving engine computes.
    For the documented example L=36, n=5 it gives [1, 9, 17, 25, 33].
    """
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    if num_features == 1:
        return [num_target_layers // 2]
    if num_target_layers < 4:
        raise ValueError(f"a target with {num_target_layers} layers is too shallow for {num_features} features")
    ids = [int(round(1 + (i * (num_target_layers - 4)) / (num_features - 1))) for i in range(num_features)]
    if len(set(ids)) != len(ids):
        raise ValueError(
            f"the default rule gives repeated target layers {ids} for {num_features} features of a "
            f"{num_target_layers}-layer target; set drafter.target_layer_ids or a smaller num_target_features"
        )
    return ids


def check_target_layer_ids(layer_ids: list[int], num_target_layers: int, field: str = "drafter.target_layer_ids") -> None:
    """Raise ``ValueError`` unless every id names a usable layer: ``0 .. L-2``.

    A feature is the raw output of target layer ``i`` (HF ``hidden_states[i + 1]``).
    The last layer ``L - 1`` has no such state anywhere else: HF's ``hidden_states[L]``
    is taken after the final norm (so the authors' code would feed a different tensor
    than our trainer), and vLLM/SGLang capture a layer's output as the input of layer
    ``i + 1``, which does not exist for the last layer. A drafter trained on it could
    not be served, so it is refused here, before any training.
    """
    out = [i for i in layer_ids if not 0 <= i < num_target_layers]
    if out:
        raise ValueError(
            f"{field} {out} out of range for a target with {num_target_layers} layers "
            f"(valid: 0..{num_target_layers - 2})"
        )
    last = num_target_layers - 1
    if last in layer_ids:
        raise ValueError(
            f"{field} includes {last}, the last layer of a {num_target_layers}-layer target; use 0..{last - 1}: "
            f"its raw output is not exposed (HF hidden_states[{num_target_layers}] is taken after the final "
            f"norm) and vLLM/SGLang cannot capture it (docs/spec.md section 1)"
        )


@dataclass
class DrafterConfig:
    """Shape of a DFlash drafter. ``None`` means "take it from the target"."""

    num_hidden_layers: int = 5  # drafter decoder layers
    block_size: int = 16  # tokens per block B: the anchor plus B - 1 drafted tokens
    hidden_size: int | None = None  # null: the target's (the drafter shares its embedding and lm_head)
    num_attention_heads: int | None = None  # null: the target's
    num_key_value_heads: int | None = None  # null: the target's
    head_dim: int | None = None  # null: the target's
    intermediate_size: int | None = None  # null: the target's
    rms_norm_eps: float | None = None  # null: the target's
    rope_theta: float | None = None  # null: the target's
    rope_scaling: dict[str, Any] | None = None  # null: the target's
    max_position_embeddings: int | None = None  # null: the target's
    vocab_size: int | None = None  # null: the target's (must match it)
    num_target_layers: int | None = None  # null: the target's layer count
    target_layer_ids: list[int] | None = None  # target layers whose outputs condition the drafter (null: evenly spaced, spec section 1)
    num_target_features: int | None = None  # how many layers the automatic choice takes (null: num_hidden_layers)
    mask_token_id: int | None = None  # the block's mask token (null: chosen automatically from the tokenizer)
    layer_types: list[str] | None = None  # full_attention or sliding_attention per layer (null: all full)
    sliding_window: int | None = None  # window of sliding_attention layers
    attention_bias: bool = False  # biases in q/k/v/o projections
    tie_word_embeddings: bool = False  # taken from the target when resolved
    # The drafter kind: dflash (the paper's) or one of models/kinds/ (dflash2: dynamic convolutions + a
    # candidate selector; the kinds' table below lists every kind and its settings).
    kind: str = "dflash"
    # The kind's own settings (the kinds' table below), e.g. {selector_top_k: 8} for dflash2; a missing key
    # takes the kind's default. dflash has none.
    options: dict[str, Any] = field(default_factory=dict)

    def _validate_kind(self) -> None:
        from dflash_train.models.kinds import get_kind

        if not isinstance(self.options, dict):
            raise ValueError(f"drafter.options must be a mapping of the kind's settings, got {self.options!r}")
        get_kind(self.kind).check_options(self.options, self)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field for any impossible combination."""
        self._validate_kind()
        if self.num_hidden_layers < 1:
            raise ValueError(f"drafter.num_hidden_layers must be >= 1, got {self.num_hidden_layers}")
        if self.block_size < 2:
            raise ValueError(f"drafter.block_size must be >= 2, got {self.block_size}")
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"drafter.{name} must be positive, got {value}")
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if heads is not None and kv_heads is not None and heads % kv_heads:
            raise ValueError(
                f"drafter.num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"drafter.layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
                )
            bad = sorted(set(self.layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION})
            if bad:
                raise ValueError(f"drafter.layer_types: unknown type(s) {bad}; use {FULL_ATTENTION!r}/{SLIDING_ATTENTION!r}")
            if SLIDING_ATTENTION in self.layer_types and not self.sliding_window:
                raise ValueError("drafter.layer_types has sliding_attention layers but drafter.sliding_window is not set")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"drafter.sliding_window must be >= 1, got {self.sliding_window}")
        if self.target_layer_ids is not None:
            if not self.target_layer_ids:
                raise ValueError("drafter.target_layer_ids must not be empty")
            if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
                raise ValueError(f"drafter.target_layer_ids has duplicates: {self.target_layer_ids}")
            if self.num_target_layers is not None:
                check_target_layer_ids(self.target_layer_ids, self.num_target_layers)
        if self.mask_token_id is not None and self.vocab_size is not None and not (
            0 <= self.mask_token_id < self.vocab_size
        ):
            raise ValueError(
                f"drafter.mask_token_id {self.mask_token_id} has no row in the target's embedding "
                f"table of {self.vocab_size} rows"
            )

    @property
    def is_resolved(self) -> bool:
        needed = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                  "rms_norm_eps", "rope_theta", "vocab_size", "num_target_layers", "target_layer_ids",
                  "mask_token_id", "layer_types")
        return all(getattr(self, n) is not None for n in needed)

    @property
    def layer_ids(self) -> list[int]:
        assert self.target_layer_ids is not None
        return list(self.target_layer_ids)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DrafterConfig:
        """A checkpoint's ``drafter_config.json``; one written before kinds had ``options`` (their
        settings as top-level keys) is read too: its kind's settings move into ``options``."""
        data = kind_options_moved(dict(data))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown drafter config key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**data)


def kind_options_moved(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with top-level keys that are some kind's options moved into ``options`` (its own
    kind's) or dropped (another kind's: configs once stored every kind's settings)."""
    from dflash_train.models.kinds import KINDS, get_kind

    own = get_kind(data.get("kind") or "dflash").options
    every = {name for kind in KINDS.values() for name in kind.options}
    options = dict(data.get("options") or {})
    for key in [k for k in data if k in every]:
        value = data.pop(key)
        if key in own:
            options.setdefault(key, value)
    return {**data, "options": options}


@dataclass
class TargetFacts:
    """What the drafter needs to know about its target (read from the HF config)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    vocab_size: int
    tie_word_embeddings: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    # Mixture-of-experts targets (the FLOP model only): the MLP width one token passes through (its
    # top-k experts plus any shared expert) and the router's width (the number of experts). None / 0
    # for a dense target, whose MLP width is ``intermediate_size``.
    active_mlp_width: int | None = None
    router_experts: int = 0


def resolve_drafter_config(cfg: DrafterConfig, target: TargetFacts, mask_token_id: int | None) -> DrafterConfig:
    """Fill every ``None`` field from the target and validate the pairing."""
    from dflash_train.models.kinds import get_kind

    out = dataclasses.replace(cfg, options={**get_kind(cfg.kind).options, **cfg.options})
    copy = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
            "rope_theta", "max_position_embeddings")
    for name in copy:
        if getattr(out, name) is None:
            setattr(out, name, getattr(target, name))
    if out.rope_scaling is None:
        out.rope_scaling = target.rope_scaling
    if out.hidden_size is None:
        out.hidden_size = target.hidden_size
    elif out.hidden_size != target.hidden_size:
        raise ValueError(
            f"drafter.hidden_size {out.hidden_size} must equal the target's hidden size {target.hidden_size}"
        )
    if out.vocab_size is None:
        out.vocab_size = target.vocab_size
    elif out.vocab_size != target.vocab_size:
        raise ValueError(f"drafter.vocab_size {out.vocab_size} differs from the target's {target.vocab_size}")
    if out.num_target_layers is None:
        out.num_target_layers = target.num_hidden_layers
    elif out.num_target_layers != target.num_hidden_layers:
        raise ValueError(
            f"drafter.num_target_layers {out.num_target_layers} differs from the target's "
            f"{target.num_hidden_layers} layers"
        )
    if out.target_layer_ids is None:
        n = out.num_target_features or out.num_hidden_layers
        out.target_layer_ids = default_target_layer_ids(target.num_hidden_layers, n)
    out.num_target_features = len(out.target_layer_ids)
    if out.layer_types is None:
        out.layer_types = [FULL_ATTENTION] * out.num_hidden_layers
    if out.mask_token_id is None:
        out.mask_token_id = mask_token_id
    if out.mask_token_id is None:
        raise ValueError("could not choose a mask token automatically; set drafter.mask_token_id")
    out.tie_word_embeddings = target.tie_word_embeddings
    out.validate()
    return out
