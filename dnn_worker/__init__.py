"""GPU-side consumer: batches from data servers (or in-process) as a torch dataset."""
from .transport.control import ControlClient
from .device.feeder import DeviceFeeder, FinishStage
from .local_dataset import LocalDataset
from .loader import ResumableLoader
from .remote_dataset import RemoteDataset

__all__ = ["ControlClient", "DeviceFeeder", "FinishStage", "LocalDataset", "RemoteDataset", "ResumableLoader"]
