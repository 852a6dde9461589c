"""Decoding engines: how tokens are produced with a target (and a drafter).

* :mod:`.core`: what every speculative engine shares: sampling, the drafter's
  :class:`~.core.Proposal` and the :class:`~.core.BlockProposer` / :class:`~.core.BlockChooser`
  seams, acceptance (longest matching prefix; the rejection rule), the commit ledger,
  results, and the compile settings of the static engines;
* :mod:`.proposers`: the DFlash drafter as a proposer, and the one DFlash block forward;
* :mod:`.speculative`: the reference loops (Hugging Face cache, greedy and sampling):
  DFlash speculative decoding and plain target decoding;
* :mod:`.static`: the same greedy loops with static shapes and CUDA graphs;
* :mod:`.generators`: generation backends for ``regenerate`` (whole conversations in, text out);
* :mod:`.batched`: batched static-cache generation (the fast backend);
* :mod:`.cache`: the fixed-address K/V buffers and CUDA-graph capture both static engines use;
* :mod:`.grouped`, :mod:`.fused`, :mod:`.skinny`: fewer, cheaper kernels for the static steps.

Layering: this package imports only ``models``, ``devices`` and ``hf_compat``. Measurement
(tau, speedup, the lossless check, replay) lives in :mod:`dflash_train.eval`; the step and
generation benchmarks in :mod:`dflash_train.bench` (``decode_steps``, ``generate``).
"""
