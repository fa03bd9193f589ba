"""State-tracking experiments of the Mamba-3 paper (§4.2, Table 5b): parity and modular arithmetic without /
with brackets — data generators (:mod:`.data`), the classifier and its ablations (:mod:`.models`) and the
training / evaluation / sweep command line (:mod:`.train`, entry point :func:`mamba3.tasks.train.main`).
See docs/state_tracking.md."""
from .data import NUM_CLASSES, TASKS, VOCAB, chance, make_batch, sample_batch, scaled_accuracy
from .models import VARIANTS, TaskModel

__all__ = ["TASKS", "VOCAB", "NUM_CLASSES", "chance", "scaled_accuracy", "make_batch", "sample_batch", "VARIANTS",
           "TaskModel"]
