"""``dflash-train export RUN_OR_CHECKPOINT OUT``: write the serving folder of docs/spec.md section 4.

What this command reads
-----------------------

The layout of run and checkpoint folders belongs to ``dflash_train.run_folder``; export
reads two files of a checkpoint::

    CKPT/drafter_config.json   DrafterConfig.to_dict() of the resolved config (JSON object,
                               no other keys)
    CKPT/drafter.safetensors   DFlashDrafter.state_dict() (the trainable drafter only:
                               layers.*, norm, fc, hidden_norm; no embedding/lm_head).
                               A "module." / "_orig_mod." prefix (DDP, torch.compile) is
                               stripped; any dtype (cast on export).

Given a run folder, export picks its newest complete checkpoint (``COMPLETE`` marker
present) that holds both files and whose files match ``checksums.json``; checkpoints without
them are ignored, a corrupt one is passed over with a warning (as ``train.resume=auto`` does).
A checkpoint named explicitly must verify: a corrupt one is refused, never exported. A folder that is
neither a checkpoint nor a run with one is refused with an error. Without ``--target``,
the target is the one the job config (``config.json`` of the checkpoint, else of the run)
names, when it still exists: it gives the tokenizer and checks the pairing.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch

from dflash_train.files import SealMismatch, note, read_sealed_json
from dflash_train.models.config import DrafterConfig
from dflash_train.run_folder import (
    COMPLETE,
    CONFIG,
    DRAFTER_CONFIG,
    DRAFTER_WEIGHTS,
    checkpoint_folders,
    is_complete,
    newest_verified,
    verify_checkpoint,
)

_PREFIXES = ("module.", "_orig_mod.")


def _is_checkpoint(folder: Path) -> bool:
    return (folder / DRAFTER_CONFIG).is_file() and (folder / DRAFTER_WEIGHTS).is_file()


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path`` denotes (itself, or a run's newest complete one)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder: expected a run folder or a checkpoint folder")
    if _is_checkpoint(path):
        if not is_complete(path):
            warnings.warn(f"checkpoint {path} has no {COMPLETE} marker; it may be partially written", stacklevel=2)
        problem = verify_checkpoint(path)
        if problem is not None:
            raise ValueError(f"checkpoint {path} is corrupt: {problem}; export an older checkpoint, or the run "
                             f"folder (its newest checkpoint that verifies)")
        return path

    def passed_over(folder: Path, problem: str) -> None:
        warnings.warn(f"checkpoint {folder} is corrupt ({problem}); trying the previous one", stacklevel=3)

    usable = newest_verified(path, usable=lambda f: is_complete(f) and _is_checkpoint(f), on_corrupt=passed_over)
    if usable is not None:
        return usable
    folders = checkpoint_folders(path)
    detail = (f"; {len(folders)} checkpoint(s) under {folders[0].parent} lack {COMPLETE} or "
              f"{DRAFTER_CONFIG}/{DRAFTER_WEIGHTS}") if folders else ""
    raise ValueError(
        f"{path} is neither a checkpoint folder ({DRAFTER_CONFIG} + {DRAFTER_WEIGHTS}) nor a run folder with a "
        f"complete checkpoint under checkpoints/ (marked by {COMPLETE}){detail}"
    )


def _trained_target(ckpt: Path, run: Path | None) -> str | None:
    """The target a run trained against: ``target.path`` of its job config (the trainer
    saves it in the checkpoint and in the run folder), when it still exists. The checkpoint's
    copy is covered by its ``checksums.json`` (verified before an export); the run's carries its
    own checksum: one that does not match names no target (a note; ``--target`` names it)."""
    for folder in (ckpt, run):
        try:
            if folder is None:
                continue
            config = (json.loads((folder / CONFIG).read_text()) if folder == ckpt
                      else read_sealed_json(folder / CONFIG, "run config"))
            target = config.get("target")
        except SealMismatch as err:
            note(f"dflash-train: {err}; the target it names is not used")
            continue
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(target, dict) and isinstance(target.get("path"), str):
            path = Path(target["path"]).expanduser()
            path = path / target["gguf_file"] if isinstance(target.get("gguf_file"), str) else path
            if path.exists():
                return str(path)
    return None


def read_training_artifact(path: str | Path) -> tuple[DrafterConfig, dict[str, torch.Tensor], str | None]:
    """``(DrafterConfig, drafter state_dict, target path or None)`` from a run or checkpoint folder."""
    from dflash_train.export.serving import read_safetensors
    from dflash_train.files import read_json

    path = Path(path).expanduser()
    ckpt = find_checkpoint(path)
    raw = read_json(ckpt / DRAFTER_CONFIG)
    try:
        cfg = DrafterConfig.from_dict(raw)
        cfg.validate()
    except (TypeError, ValueError) as err:
        raise ValueError(f"{ckpt / DRAFTER_CONFIG}: {err}") from None
    state = read_safetensors(ckpt / DRAFTER_WEIGHTS)
    for prefix in _PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    run = path if ckpt != path else None
    return cfg, state, _trained_target(ckpt, run)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _gguf_target(path: str | None):
    """``--gguf TARGET.gguf``: the target GGUF read and its architecture checked, up front (one line
    when llama.cpp cannot serve a DFlash drafter for it)."""
    if path is None:
        return None
    from dflash_train.export.gguf import read_target_gguf
    from dflash_train.llamacpp import check_target_architecture

    target = read_target_gguf(path)
    check_target_architecture(target.architecture, path)
    return target


def run_export(args: argparse.Namespace) -> int:
    from dflash_train.export.serving import build_drafter, check_against_target, export_drafter

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        raise FileExistsError(f"{out} already exists and is not empty; pass --force to replace it")
    ckpt = find_checkpoint(args.run_or_checkpoint)
    target_gguf = _gguf_target(args.gguf)  # checked before anything is written
    cfg, state, target_path = read_training_artifact(args.run_or_checkpoint)
    target_path = args.target or target_path
    tokenizer = None
    if target_path is not None:
        from transformers import AutoConfig

        target_dir = Path(target_path)
        gguf = {}
        if target_dir.suffix == ".gguf":
            target_dir, gguf = target_dir.parent, {"gguf_file": target_dir.name}
        cfg = check_against_target(cfg, AutoConfig.from_pretrained(target_dir, **gguf), "the checkpoint")
        if args.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(target_dir, **gguf)
    elif args.tokenizer:
        print("dflash-train export: no target known (none in the run's config.json that exists, no --target): "
              "tokenizer not copied")
    if target_gguf is not None:  # the drafter against the target GGUF, before anything is written
        from dflash_train.export.gguf import check_pairing

        if cfg.attention_bias:
            raise ValueError("--gguf: llama.cpp's dflash graph has no attention biases (drafter.attention_bias)")
        check_pairing({"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
                       "num_target_layers": cfg.num_target_layers}, target_gguf, f"checkpoint {ckpt}")
    drafter = build_drafter(cfg, state, str(ckpt / DRAFTER_WEIGHTS))
    dtype = _DTYPES[args.dtype]
    written = export_drafter(drafter, cfg, out, tokenizer=tokenizer, force=args.force, dtype=dtype)
    gguf_path = None
    if target_gguf is not None:
        from dflash_train.export.gguf import write_drafter_gguf

        gguf_path = write_drafter_gguf(written, target_gguf.path, dtype=args.dtype)
    summary = {
        "checkpoint": str(ckpt),
        "block_size": cfg.block_size,
        "layers": cfg.num_hidden_layers,
        "target_layer_ids": cfg.target_layer_ids,
        "mask_token_id": cfg.mask_token_id,
        "dtype": str(dtype).removeprefix("torch."),
        "tokenizer": tokenizer is not None,
        "gguf": str(gguf_path) if gguf_path else None,
    }
    print(f"dflash-train export: wrote {written} {json.dumps(summary)}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a trained drafter as a DFlash serving folder (vLLM / SGLang / transformers)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "run_or_checkpoint",
        metavar="RUN_OR_CHECKPOINT",
        help="a run folder (newest complete checkpoint is used) or a checkpoint folder",
    )
    p.add_argument("out", metavar="OUT", help="output folder (must not exist or be empty, unless --force)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument(
        "--tokenizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="copy the target's tokenizer files into OUT (default: yes, when the target is known)",
    )
    p.add_argument(
        "--target",
        default=None,
        help="target model folder (overrides the one the run's config.json names); checks the pairing, "
        "gives the tokenizer",
    )
    p.add_argument(
        "--gguf",
        metavar="TARGET_GGUF",
        default=None,
        help="also write OUT/drafter.gguf for llama.cpp (--spec-type draft-dflash), with the vocabulary of "
        "TARGET_GGUF, the target GGUF llama.cpp will serve it with (dflash-train llama-cpp convert makes one); "
        "its weights take --dtype",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(_DTYPES),
        default="bfloat16",
        help="dtype of the exported weights (default: bfloat16, what the authors ship; float32 keeps "
        "a float32 checkpoint exact). Folder layout and serving: docs/spec.md section 4",
    )
    p.set_defaults(func=run_export)
