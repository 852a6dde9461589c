"""TensorBoard event files in ``RUN/tensorboard`` (``tensorboard --logdir RUN``).

Each finite number of a record is a scalar at its step (``accuracy`` per position as
``accuracy/posK``, see ``base.scalars``). A resume reopens the writer with ``purge_step``:
TensorBoard then hides the events logged after the resumed step by the interrupted run, so
the redone steps show once.
"""

from __future__ import annotations

from pathlib import Path

from dflash_train.faultpoints import reached
from dflash_train.files import explained
from dflash_train.run_folder import TENSORBOARD
from dflash_train.tracking.base import WRITE_TODO, scalars


def _writer(folder: Path, **kwargs):
    from torch.utils.tensorboard import SummaryWriter

    with explained("cannot write TensorBoard logs", folder, WRITE_TODO):
        return SummaryWriter(str(folder), **kwargs)


class TensorBoardSink:
    name = "tensorboard"
    required = False
    train_keys = None  # no keys of its own (RUN/tensorboard)
    resumable = ()

    @staticmethod
    def check_config(train) -> None:
        """No keys of its own."""

    @classmethod
    def check(cls, settings) -> None:
        """Nothing of its own: ``tensorboard`` is a dependency and the run folder is writable."""

    def __init__(self, settings):
        self.folder = Path(settings.run_dir) / TENSORBOARD
        self.writer = _writer(self.folder)

    def log(self, step: int, record: dict) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()
        reached("tensorboard-flush")

    def rewind(self, step: int) -> None:
        self.writer.close()
        self.writer = _writer(self.folder, purge_step=step + 1)

    def close(self) -> None:
        self.writer.close()
