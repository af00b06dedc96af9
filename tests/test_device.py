"""Device-side finishing and the prefetch-to-device iterator (CPU here; CUDA tests marked gpu)."""
from __future__ import annotations

import pytest
import torch

from _fault_helpers import wait_until
from conftest import TOKEN
from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec
from dnn_worker import DeviceFeeder, FinishStage, LocalDataset, RemoteDataset
from dnn_worker.device.feeder import FinishError
from dnn_worker.resume.state import VERSION

OPTS = {"size": 40, "batch_size": 8, "shape": [1, 28, 28]}


def spec(finish_on):
    return PipelineSpec("examples.synthetic:build_finished_pipeline", {**OPTS, "finish_on": finish_on})


def test_device_finishing_equals_server_finishing_and_ships_a_quarter_of_the_bytes():
    from data_service.server import DataServer, ServerOptions

    dev = DataServer(spec("device"), TOKEN, ServerOptions(num_workers=1)).start()
    srv = DataServer(spec("server"), TOKEN, ServerOptions(num_workers=1)).start()
    try:
        ds = RemoteDataset([dev.address], TOKEN, seed=2)
        on_device = list(DeviceFeeder(ds, "cpu", finish=ds.finish_stage()))
        on_server = list(RemoteDataset([srv.address], TOKEN, seed=2))
        assert len(on_device) == len(on_server) == 5
        for a, b in zip(on_device, on_server):
            assert a["image"].dtype == torch.float32 and torch.equal(a["image"], b["image"])
        # the server counts a batch after its send returns, which can be after the consumer has it
        for server in (dev, srv):
            wait_until(lambda: server.stats.snapshot().batches_sent == 5, 10, "5 batches counted as sent")
        wire_dev, wire_srv = dev.stats.snapshot().raw_bytes, srv.stats.snapshot().raw_bytes
        # uint8 images + int64 labels vs float32 images + labels: ~4x fewer image bytes
        assert 3.5 < wire_srv / wire_dev <= 4.0
    finally:
        dev.shutdown(grace_s=1)
        srv.shutdown(grace_s=1)


def test_homogeneous_mode_finishes_the_same_way():
    ds = LocalDataset(spec("device"), seed=4)
    finished = list(DeviceFeeder(ds, "cpu", finish=ds.finish_stage()))
    reference = list(LocalDataset(spec("server"), seed=4))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(finished, reference))


@pytest.mark.parametrize("fn, match", [
    ("examples.synthetic:bad_finish_shape", r"'image' from shape \[8, 1, 28, 28\] to \[8, 784\]"),
    ("examples.synthetic:bad_finish_dtype", r"'image' into torch.float64, expected torch.float32"),
])
def test_unexpected_finish_changes_name_the_tensor(fn, match):
    stage = FinishStage.load(fn, {"image": "float32"})
    batch = next(iter(LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS))))
    with pytest.raises(FinishError, match=match):
        stage(batch)


def test_undeclared_dtype_change_is_an_error():
    stage = FinishStage.load("examples.synthetic:normalize", {})
    batch = next(iter(LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS))))
    with pytest.raises(FinishError, match="declare it in Pipeline"):
        stage(batch)


def test_bad_feeder_options():
    with pytest.raises(ConfigError, match="depth=0"):
        DeviceFeeder([], "cpu", depth=0)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            DeviceFeeder([], "cuda")
    with pytest.raises(ConfigError, match="unknown dtypes"):
        FinishStage.load("examples.synthetic:normalize", {"image": "float128"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetch_matches_cpu_finish_within_tolerance():
    ds = LocalDataset(spec("device"), seed=4)
    gpu = [b["image"].cpu() for b in DeviceFeeder(ds, "cuda", finish=ds.finish_stage(), depth=3)]
    cpu = [b["image"] for b in LocalDataset(spec("server"), seed=4)]
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# -- prefetch bookkeeping: the same loop on every device; the CUDA calls driven on CPU
class RecordingCuda:
    """A ``CudaBackend`` whose calls are recorded; tensors stay on the CPU."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.in_side_stream = False
        self.copied_in_side_stream: list[bool] = []

    def new_stream(self, device):
        self.calls.append(("new_stream",))
        return "side"

    def use_stream(self, stream):
        import contextlib

        backend = self

        @contextlib.contextmanager
        def ctx():
            backend.in_side_stream = True
            try:
                yield
            finally:
                backend.in_side_stream = False
        return ctx()

    def current_stream(self, device):
        return "compute"

    def record_event(self, stream):
        event = {"id": len(self.calls), "stream": stream}
        self.calls.append(("record", event["id"], stream))
        return event

    def wait_event(self, stream, event):
        self.calls.append(("wait", event["id"], stream))

    def synchronize(self, event):
        self.calls.append(("sync", event["id"]))

    def record_stream(self, tensor, stream):
        self.calls.append(("record_stream", tensor.data_ptr(), stream))

    def pin(self, tensor):
        self.calls.append(("pin", tensor.data_ptr()))
        self.copied_in_side_stream.append(self.in_side_stream)
        return tensor.clone()  # a new host buffer, as pinning a pageable tensor makes


class CountingLoader:
    """A stage that counts how many batches were pulled from it (state: that count)."""

    def __init__(self, batches) -> None:
        self.batches = list(batches)
        self.pulled = 0
        self.last_yielded = None

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for i, b in enumerate(self.batches[self.pulled:], self.pulled):
            self.pulled = i + 1
            self.last_yielded = (0, i)
            yield b

    def state_dict(self):
        return {"epoch": 0, "position": self.pulled}

    def load_state_dict(self, state):
        self.pulled = state["position"]

    def set_epoch(self, epoch):
        pass


@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("cuda_calls", [False, True])
def test_feeder_runs_depth_ahead_and_its_state_is_the_last_yielded_batch(depth, cuda_calls):
    from dnn_worker.device.ops import HostOps, StreamOps

    ds = LocalDataset(spec("device"), seed=4)
    host = list(ds)
    backend = RecordingCuda()
    ops = StreamOps(torch.device("cpu"), pin_memory=True, backend=backend) if cuda_calls else HostOps(torch.device("cpu"))
    upstream = CountingLoader(host)
    feeder = DeviceFeeder(upstream, "cpu", finish=ds.finish_stage(), depth=depth, ops=ops)
    got = []
    for n, batch in enumerate(feeder, 1):
        # while the loop holds batch n, exactly ``depth`` more were begun (fewer at the end)
        assert upstream.pulled == min(n + depth, len(host))
        assert feeder.state_dict() == {"version": VERSION, "epoch": 0, "position": n}  # parsed, in this version
        got.append(batch)
        if n == 3:
            break
    reference = list(DeviceFeeder(host, "cpu", finish=ds.finish_stage()))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, reference))
    # a new iteration starts where the loop stopped, not where the prefetch did
    assert [torch.equal(b["image"], r["image"]) for b, r in zip(feeder, reference[3:])] == [True] * 2
    if cuda_calls:
        kinds = [c[0] for c in backend.calls]
        assert kinds.count("pin") == 2 * len(host[:3 + depth]) + 2 * 2  # image + label of every begun batch
        assert all(backend.copied_in_side_stream), "copies are issued on the side stream"
        events = [c[1] for c in backend.calls if c[0] == "record"]
        for event in events[:3]:  # every yielded batch: compute stream waits, host syncs, then record_stream
            i = backend.calls.index(("wait", event, "compute"))
            assert backend.calls[i + 1] == ("sync", event)
            assert [c[0] for c in backend.calls[i + 2:i + 4]] == ["record_stream", "record_stream"]
            assert all(c[2] == "compute" for c in backend.calls[i + 2:i + 4])


def test_feeder_over_a_plain_dataloader_says_how_to_make_it_resumable():
    feeder = DeviceFeeder([torch.zeros(2)], "cpu")
    assert len(list(feeder)) == 1
    with pytest.raises(ConfigError, match=r"DeviceFeeder\(ResumableLoader\(DataLoader"):
        feeder.state_dict()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_feeder_state_is_exact_with_prefetch():
    from torch.utils.data import DataLoader

    from dnn_worker import ResumableLoader

    ds = LocalDataset(spec("device"), seed=4)
    feeder = DeviceFeeder(ResumableLoader(DataLoader(ds, batch_size=None)), "cuda", finish=ds.finish_stage(), depth=3)
    for n, batch in enumerate(feeder, 1):
        assert batch["image"].is_cuda
        if n == 2:
            break
    assert feeder.state_dict()["position"] == 2
    rest = [b["image"].cpu() for b in feeder]
    cpu = [b["image"] for b in DeviceFeeder(LocalDataset(spec("device"), seed=4), "cpu", finish=ds.finish_stage())]
    assert len(rest) == 3
    for a, b in zip(rest, cpu[2:]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


class PinCheckingCuda:
    """The real CUDA calls (``CudaBackend``), noting whether each copy's source was page-locked."""

    def __init__(self) -> None:
        from dnn_worker.device.ops import CudaBackend

        self.real = CudaBackend()
        self.pinned: list[tuple[bool, bool]] = []  # (as received, as copied)
        self.side = None

    def __getattr__(self, name):
        return getattr(self.real, name)

    def new_stream(self, device):
        self.side = self.real.new_stream(device)
        return self.side

    def pin(self, tensor):
        out = self.real.pin(tensor)
        self.pinned.append((tensor.is_pinned(), out.is_pinned()))
        return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("receive_pinned", [False, True])
def test_cuda_copies_come_from_pinned_memory_and_equal_the_host_batches(server_factory, receive_pinned):
    """Copies on the side stream from page-locked memory (the receive buffers themselves with
    ``pin_memory=True``), ``depth`` batches ahead of a slow step: every batch on the GPU is the
    one the server sent, byte for byte, though the pooled receive buffers are reused meanwhile."""
    from dnn_worker.device.ops import StreamOps

    server = server_factory({**OPTS, "size": 200}, num_workers=1)  # 25 batches
    host = [{k: v.clone() for k, v in b.items()} for b in RemoteDataset([server.address], TOKEN, seed=3)]
    ds = RemoteDataset([server.address], TOKEN, seed=3, pin_memory=receive_pinned, shared_memory=False)
    backend = PinCheckingCuda()
    feeder = DeviceFeeder(ds, "cuda", depth=3, ops=StreamOps(torch.device("cuda"), pin_memory=True, backend=backend))
    got = []
    for batch in feeder:
        assert batch["image"].is_cuda and torch.cuda.current_stream() != backend.side
        torch.cuda._sleep(5_000_000)  # a slow step on the compute stream: the next copies overlap it
        got.append({k: v.cpu() for k, v in batch.items()})
    assert len(got) == len(host) == 25
    assert all(torch.equal(a[k], b[k]) for a, b in zip(got, host) for k in ("image", "label"))
    assert backend.pinned and all(copied for _, copied in backend.pinned), "every copy from page-locked memory"
    if receive_pinned:
        assert all(received for received, _ in backend.pinned), "pinned receive buffers need no extra copy"
