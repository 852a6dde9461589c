"""Decoding engines: how tokens are produced with a target (and a DFlash drafter).

* :mod:`.speculative`: the reference loops (Hugging Face cache, greedy and sampling):
  DFlash speculative decoding, plain target decoding, the drafter's context cache;
* :mod:`.static`: the same greedy loops with static shapes and CUDA graphs;
* :mod:`.batched`: batched static-cache generation for ``regenerate`` (many prompts at once);
* :mod:`.cache`: the fixed-address K/V buffers and CUDA-graph capture both static engines use;
* :mod:`.grouped`: grouped-query attention without K/V copies for the static decoder's steps;
* :mod:`.bench_steps`: times the static decoder's plain, verify and draft steps per variant.

Measurement (tau, speedup, the lossless check) lives in :mod:`dflash_train.eval`; the
drafter's attention masks live with the model in :mod:`dflash_train.models.attention`.
"""
