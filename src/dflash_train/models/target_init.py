"""Start a drafter from the target's last layers (``train.drafter_init=target``).

A drafter layer has the shape of a target decoder layer (same heads, head size, MLP
width, parameter names), so the target's deepest layers are a natural starting point:
they already turn a hidden state into the next token's. Drafter layer ``i`` of ``N``
takes target layer ``L - N + i``'s attention projections, MLP and two layer norms; the
drafter's final ``norm`` takes the target's final norm, which feeds the same lm_head.
``q_norm``/``k_norm`` are copied when the target has them (Qwen3) and stay at ones
otherwise (Llama); ``fc`` and ``hidden_norm``, which read the target features, have no
counterpart and keep their initialization.

Every shape is checked before anything is copied, so a mismatch is one ``ValueError``
naming the drafter field to change, at start-up. No training code here: the trainer
calls this after building the drafter and before wrapping it or making the optimizer.
"""

from __future__ import annotations

import torch
from torch import nn

COPIED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
IF_PRESENT = ("self_attn.q_norm", "self_attn.k_norm")
FIELDS = {"q_proj": "num_attention_heads/head_dim", "k_proj": "num_key_value_heads/head_dim",
          "v_proj": "num_key_value_heads/head_dim", "o_proj": "num_attention_heads/head_dim",
          "gate_proj": "intermediate_size", "up_proj": "intermediate_size", "down_proj": "intermediate_size",
          "q_norm": "head_dim", "k_norm": "head_dim"}
WHERE = "train.drafter_init=target"


def source_layers(num_drafter_layers: int, num_target_layers: int) -> list[int]:
    """Target layer of each drafter layer: the last ``N`` of the target, in order."""
    if num_drafter_layers > num_target_layers:
        raise ValueError(f"{WHERE}: drafter.num_hidden_layers ({num_drafter_layers}) exceeds the target's "
                         f"{num_target_layers} layers")
    return [num_target_layers - num_drafter_layers + i for i in range(num_drafter_layers)]


def _field(name: str) -> str:
    key = next((p for p in name.split(".") if p in FIELDS), None)
    return f"drafter.{FIELDS.get(key, 'hidden_size')}"


def _pairs(dst: nn.Module, src: nn.Module, what: str, prefixes=COPIED + IF_PRESENT
           ) -> list[tuple[str, nn.Parameter, torch.Tensor]]:
    """(name, drafter parameter, target tensor) for every copied parameter, shapes checked.
    ``prefixes``: the submodules copied ("": the module's own parameters)."""
    mine, theirs = dict(dst.named_parameters()), dict(src.named_parameters())
    out = []
    for prefix in prefixes:
        names = sorted({n for n in (*mine, *theirs) if (n.rsplit(".", 1)[0] if "." in n else "") == prefix})
        if prefix in IF_PRESENT and not any(n in theirs for n in names):
            continue
        for name in names:
            if name not in mine or name not in theirs:
                has = "drafter" if name in mine else "target"
                fix = ("set drafter.attention_bias as the target's" if name.endswith(".bias") else
                       "the target's layers are not Llama/Qwen-style; use train.drafter_init=random")
                raise ValueError(f"{WHERE}: {what}: only the {has} has {name}; {fix}")
            if mine[name].shape != theirs[name].shape:
                raise ValueError(f"{WHERE}: {what}: {name} is {list(mine[name].shape)} in the drafter but "
                                 f"{list(theirs[name].shape)} in the target; leave {_field(name)} unset "
                                 f"(the target's) or use train.drafter_init=random")
            out.append((name, mine[name], theirs[name]))
    return out


@torch.no_grad()
def init_from_target(drafter: nn.Module, target) -> list[int]:
    """Copy the target's last layers and final norm into ``drafter`` (see the module doc).

    ``target`` is a ``models.target.Target``. Returns the target layer ids used.
    Target tensors sharded by FSDP2 are gathered (a collective: every rank calls this).
    """
    layers = target.layers
    ids = source_layers(len(drafter.layers), len(layers))
    plan = []
    for i, j in enumerate(ids):
        plan += _pairs(drafter.layers[i], layers[j], f"drafter layer {i} <- target layer {j}")
    if target.final_norm is None:
        raise ValueError(f"{WHERE}: cannot find the final norm of the target ({type(target.model).__name__})")
    plan += _pairs(drafter.norm, target.final_norm, "final norm", prefixes=("",))
    for _, param, source in plan:
        full = source.full_tensor() if hasattr(source, "full_tensor") else source
        param.copy_(full.to(param.device, param.dtype))
    return ids
