"""Export/import of the DFlash serving folder (docs/spec.md section 4); see ``serving`` and ``cli``."""

from dflash_train.export.serving import export_drafter, load_drafter_folder, serving_tensor_names

__all__ = ["export_drafter", "load_drafter_folder", "serving_tensor_names"]
