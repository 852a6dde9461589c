"""Where a trainer's micro-batches and their context features come from.

A feature source has three methods:

* ``next_step()``: the micro-batches of this rank's next optimizer step (from the trainer's
  own iterator, whose position a checkpoint records);
* ``features(micro_batch, input_ids, attention_mask)``: their target features, [rows, s, n*h]
  (with ``train.distill`` > 0, only ``LocalFeatures``: a pair, the features and the target's
  final hidden states [rows, s, h]);
* ``finish()``: nothing more will be asked (a disaggregated drafter tells its target ranks).

``LocalFeatures`` runs the local target (one process, colocated ranks). The disaggregated
topology passes ``distributed.disagg.FeatureReceiver`` (features computed on target ranks);
``TimedFeatures`` times any source's forward into the run's ``Timings``. The trainer takes
the source as an argument (a factory of the trainer, since the source reads its iterator).
"""

from __future__ import annotations

import torch


class LocalFeatures:
    def __init__(self, trainer):
        self.batches = trainer.batches
        self.target = trainer.target
        self.layer_ids = trainer.drafter_cfg.target_layer_ids
        self.final_hidden = trainer.opts.distill > 0

    def next_step(self):
        return self.batches.next_step()

    def features(self, micro_batch, input_ids, attention_mask):
        doc_ids = None if micro_batch.doc_ids is None else micro_batch.doc_ids.to(input_ids.device)
        return self.target.features(input_ids, attention_mask, self.layer_ids, doc_ids, final_hidden=self.final_hidden)

    def finish(self) -> None:
        pass


class TimedFeatures:
    """A source whose ``features`` calls are timed as ``target_forward``."""

    def __init__(self, source, timings):
        self.source, self.timings = source, timings

    def next_step(self):
        return self.source.next_step()

    def features(self, micro_batch, input_ids, attention_mask):
        with self.timings.measure("target_forward"):
            return self.source.features(micro_batch, input_ids, attention_mask)

    def finish(self) -> None:
        self.source.finish()


class CachedFeatures:
    """Computes each micro-batch's features once and serves them again (the planner times
    the target and the drafter separately on the same micro-batches)."""

    def __init__(self, source):
        self.source = source
        self.cache: dict[int, torch.Tensor] = {}

    def next_step(self):
        return self.source.next_step()

    def features(self, micro_batch, input_ids, attention_mask) -> torch.Tensor:
        key = id(micro_batch)
        if key not in self.cache:
            self.cache[key] = self.source.features(micro_batch, input_ids, attention_mask)
        return self.cache[key]

    def finish(self) -> None:
        self.source.finish()
