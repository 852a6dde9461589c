"""The batched generator on CUDA: a compacted bucket's CUDA graphs decode what the plain ones do.

    python -m pytest -m gpu tests/gpu/test_gpu_batched.py -q
"""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_qwen3

from dflash_train.decoding.batched import StaticCacheGenerator
from dflash_train.decoding.generators import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_compaction_under_cuda_graphs_keeps_every_answer():
    """Rows moved to the front of the K/V buffers mid-bucket are decoded by the smaller shape's own
    captured graph: the answers equal the uncompacted generator's, with fewer row-steps."""
    torch.backends.cuda.matmul.allow_tf32 = False  # float32: no near-tie flips between batch shapes
    model = tiny_qwen3(num_layers=2, hidden=64, vocab=128, seed=4).float().cuda()
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(30, 128, (int(n),), generator=gen).tolist()
               for n in torch.randint(1, 20, (96,), generator=gen)]
    kwargs = dict(stop_ids=set(range(8, 30)), max_batch=64, batch_multiple=8, check_every=4, mode="cudagraph")
    params = SamplingParams(max_new_tokens=32)
    plain = StaticCacheGenerator(model=model, **kwargs)
    compact = StaticCacheGenerator(model=model, compact=True, **kwargs)
    assert compact.generate_ids(prompts, params) == plain.generate_ids(prompts, params)
    assert compact.mode == plain.mode == "cudagraph"  # no capture fell back to eager
    assert compact.stats.compactions >= 2 and compact.stats.row_steps < plain.stats.row_steps
