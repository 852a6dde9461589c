"""The feature store: the target's context features of a data set, on disk (issue 58).

``dflash-train features`` runs the target once over a data set and writes what training reads from it
(``writer.py``; the job itself, which runs the target, is ``distributed/feature_job.py``);
``train.feature_store=PATH`` trains from it with no target layers loaded
(``reader.py``). ``format.py`` is the on-disk format (docs/spec.md section 6): safetensors shards,
per-rank JSONL indexes, a manifest that fingerprints what produced the store.
"""
