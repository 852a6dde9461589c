"""Experiment tracking: the records a run logs, fanned out to ``train.loggers``.

``base`` (the ``Sink`` protocol, the ``Tracking`` fan-out, ``tracking.json``), ``registry``
(the backends by name), and one module per backend: ``jsonl`` (``metrics.jsonl``, always on),
``tensorboard``, ``wandb``, ``mlflow``. Nothing is imported here: ``config.py`` reads the
registry's names while it is itself being imported.
"""
