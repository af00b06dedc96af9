"""``hetero local``: the whole job on one machine, one process per emulated SageMaker node
(job.py: one job; sweep.py: a sweep's jobs; runner.py: the node processes; tree.py: their trees)."""
from .job import (EXIT_STOPPED, LocalJob, LocalResult, check_data, json_dict, local_paths, open_registry,
                  reads_mnist, run_local, training_data)

__all__ = ["EXIT_STOPPED", "LocalJob", "LocalResult", "check_data", "json_dict", "local_paths", "open_registry",
           "reads_mnist", "run_local", "training_data"]
