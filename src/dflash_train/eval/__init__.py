"""Evaluation: DFlash speculative decoding, tau / speedup reports, the lossless check.

Trainer entry point: ``evaluate(target, drafter, prompts_token_ids, ...)`` from
:mod:`dflash_train.eval.evaluate`; serving folders load with
:func:`dflash_train.eval.loader.load_drafter_folder`.
"""
