"""Builders of training data and prompt sets from what installs offline (``python -m`` entry points).

``offline_data``: chat records from PyPI-shipped corpora (the demo's data); ``prompts``: a
large deduplicated prompt set for regeneration, never containing a held-out prompt;
``composed_prompts``: requests filled in from hand-written templates. Each module has
``build_parser()`` and ``main(argv=None)``, so it can be registered as a sub-command.
"""
