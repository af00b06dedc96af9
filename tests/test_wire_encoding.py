"""data_service.contract.wire_encoding: each encoding round-trips, homogeneous and heterogeneous jobs give
the same bits, bad names and hostile headers are clear errors, a missing decoder stops at start."""
import math
import sys

import numpy as np
import pytest
import torch

from data_service.contract import wire_encoding as we
from data_service.errors import ConfigError, ProtocolError
from data_service.contract.pipeline import PipelineSpec, build_batch
from data_service.server import DataServer, ServerOptions
from dnn_worker import DeviceFeeder, LocalDataset, RemoteDataset, ResumableLoader
from dnn_worker.device.feeder import FinishStage, finish_from_info
from hetero.synthetic.images import write_image_folder

TARGET = "data_service.pipelines.images:build_pipeline"
TOKEN = "tok"
ENCODINGS = ("uint8", "up-zstd", "jpeg:90")


def smooth_images(b: int, c: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Photograph-like content: low-frequency shapes, soft edges, a little sensor noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.linspace(0, 1, h).view(1, 1, h, 1)
    x = torch.linspace(0, 1, w).view(1, 1, 1, w)
    phase = torch.rand(b, c, 1, 1, generator=g) * 6.28
    freq = 1 + torch.rand(b, c, 1, 1, generator=g) * 3
    img = 128 + 70 * torch.sin(freq * 3.14 * x + phase) * torch.cos(freq * 2.0 * y - phase)
    img = img + torch.randn(b, c, h, w, generator=g) * 2
    return img.clamp(0, 255).round().to(torch.uint8)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = ((a.float() - b.float()) ** 2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def wire_bytes(batch: dict) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())


# -- names

@pytest.mark.parametrize("name, canonical", [("", "uint8"), ("uint8", "uint8"), ("up-zstd", "up-zstd"),
                                             ("jpeg", "jpeg:90"), ("JPEG:75", "jpeg:75"), ("jpeg:100", "jpeg:100")])
def test_names_parse_to_a_canonical_encoding(name, canonical):
    assert we.parse(name).name == canonical


@pytest.mark.parametrize("name, message", [
    ("png", r"unknown wire_encoding='png'; use 'uint8'.*'up-zstd'.*'jpeg:Q'"),
    ("jpeg:0", r"wire_encoding='jpeg:0': the JPEG quality must be an integer in 1..100"),
    ("jpeg:101", "must be an integer in 1..100"),
    ("jpeg:high", "must be an integer in 1..100"),
    (90, "wire_encoding=90 must be a string"),
    ("jpeg:\u00b2", r"wire_encoding='jpeg:\u00b2': the JPEG quality must be an integer in 1..100.*use 'uint8'"),
    ("jpeg:\u0663", "must be an integer in 1..100"),
    (["jpeg"], r"wire_encoding=\['jpeg'\] must be a string: 'uint8'.*'jpeg:Q'"),
    ({"q": 90}, "must be a string"),
])
def test_bad_names_are_clear_errors(name, message):
    with pytest.raises(ConfigError, match=message):
        we.parse(name)


@pytest.mark.parametrize("value", ["jpeg:\u00b2", '["jpeg"]'])
def test_bad_names_from_the_command_line_are_config_errors(value):
    from data_service.pipelines.image_options import ImageOptions
    from hetero.options import parse_kv

    options = parse_kv([f"wire_encoding={value}"])
    with pytest.raises(ConfigError, match="wire_encoding=.*'uint8'"):
        ImageOptions.from_kwargs(**options)


def test_bad_names_are_refused_by_the_image_pipeline_options(tmp_path):
    from data_service.pipelines.image_options import ImageOptions

    with pytest.raises(ConfigError, match="unknown wire_encoding='webp'"):
        ImageOptions(wire_encoding="webp")
    with pytest.raises(ConfigError, match="finish_on='server' sends normalised float32"):
        ImageOptions(wire_encoding="jpeg:90", finish_on="server")


# -- round trips

@pytest.mark.parametrize("shape", [(4, 3, 40, 56), (2, 1, 16, 16), (1, 4, 9, 7)])
def test_up_zstd_round_trips_exactly(shape):
    images = smooth_images(*shape)
    images[0, 0, 0, :3] = torch.tensor([0, 255, 0], dtype=torch.uint8)  # wrap-around in the difference
    batch = {"image": images, "label": torch.arange(shape[0])}
    enc = we.encode_batch(batch, we.parse("up-zstd"))
    assert list(enc) == ["image", "image.wire", "label"]
    assert wire_bytes(enc) < wire_bytes(batch) or shape[0] * shape[2] * shape[3] < 1000  # headers outweigh tiny ones
    back = we.decode_batch(enc, "cpu", we.parse("up-zstd"))
    assert list(back) == ["image", "label"]
    assert torch.equal(back["image"], images) and torch.equal(back["label"], batch["label"])


def test_uint8_is_the_batch_itself():
    batch = {"image": smooth_images(2, 3, 8, 8)}
    assert we.encode_batch(batch, we.parse("uint8")) is batch
    assert we.decode_batch(batch, "cpu", we.parse("uint8")) is batch


@pytest.mark.parametrize("channels", [3, 1])
def test_jpeg_round_trips_within_its_psnr_at_a_quarter_of_the_bytes(channels):
    images = smooth_images(4, channels, 64, 48, seed=1)
    batch = {"image": images, "label": torch.arange(4)}
    enc = we.encode_batch(batch, we.parse("jpeg:90"))
    assert enc["image"].dtype == torch.uint8 and enc["image"].dim() == 1
    assert wire_bytes(enc) <= wire_bytes(batch) / (4 if channels == 3 else 3)  # JPEG headers weigh on small ones
    back = we.decode_batch(enc, None, we.parse("jpeg:90"))
    assert back["image"].shape == images.shape and back["image"].dtype == torch.uint8
    assert back["image"].is_contiguous()  # laid out as the uint8 batch: a model may view or flatten it
    assert psnr(back["image"], images) >= 38.0
    lower = we.decode_batch(we.encode_batch(batch, we.parse("jpeg:30")), None)["image"]
    assert psnr(lower, images) < psnr(back["image"], images)  # the quality is applied


def test_a_batch_with_nothing_to_encode_is_named():
    with pytest.raises(ValueError, match=r"found no uint8 \[B, C, H, W\] tensor .*'x': \('torch.float32'"):
        we.encode_batch({"x": torch.zeros(2, 3, 4, 4)}, we.parse("up-zstd"))
    with pytest.raises(ValueError, match="needs a dict batch"):
        we.encode_batch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), we.parse("jpeg"))
    with pytest.raises(ValueError, match="1 or 3 channels"):
        we.encode_batch({"x": torch.zeros(2, 2, 8, 8, dtype=torch.uint8)}, we.parse("jpeg"))


# -- hostile or mismatched bytes

def tampered(encoding: str, **changes):
    enc = we.encode_batch({"image": smooth_images(2, 3, 16, 16)}, we.parse(encoding))
    header = enc["image.wire"].clone()
    for index, value in changes.items():
        header[int(index[1:])] = value
    return {"image": enc["image"], "image.wire": header}


@pytest.mark.parametrize("encoding, changes, message", [
    ("jpeg:90", {"i0": 9}, "unknown wire encoding id 9"),
    ("jpeg:90", {"i4": 1 << 40}, "decodes past"),
    ("jpeg:90", {"i4": 32}, r"JPEG 0 is \(16, 16, 3\) \(height, width, channels\), header says \(32, 16, 3\)"),
    ("jpeg:90", {"i7": 5}, "part sizes"),
    ("jpeg:90", {"i1": 0}, "JPEG quality 0 outside"),
    ("up-zstd", {"i3": 1}, "zstd frame holds 1536 bytes, header says 512"),
    ("up-zstd", {"i2": 0}, "is empty"),
])
def test_hostile_headers_are_protocol_errors(encoding, changes, message):
    with pytest.raises(ProtocolError, match=message):
        we.decode_batch(tampered(encoding, **changes), "cpu")


def test_corrupt_jpeg_bytes_behind_a_valid_header_are_protocol_errors():
    enc = we.encode_batch({"image": smooth_images(2, 3, 16, 16)}, we.parse("jpeg:90"))
    size = enc["image.wire"].tolist()[7]
    broken = enc["image"].clone()
    first = broken[:size].numpy()
    at = np.flatnonzero((first[:-1] == 0xFF) & (first[1:] == 0xDA))[0]
    first[at + 1] = 0xFE  # the start of scan becomes a comment: a header, then no image
    with pytest.raises(ProtocolError, match="tensor 'image': its JPEGs do not decode"):
        we.decode_batch({"image": broken, "image.wire": enc["image.wire"]}, "cpu")
    too_long = torch.cat([enc["image.wire"], torch.zeros(1000, dtype=torch.int64)])
    with pytest.raises(ProtocolError, match="malformed wire header"):
        we.decode_batch({"image": enc["image"][:10], "image.wire": too_long}, "cpu")


def test_an_encoding_other_than_announced_is_refused():
    enc = we.encode_batch({"image": smooth_images(2, 3, 16, 16)}, we.parse("jpeg:80"))
    with pytest.raises(ProtocolError, match="arrived as 'jpeg:80', but the servers announced 'jpeg:90'"):
        we.decode_batch(enc, "cpu", we.parse("jpeg:90"))
    with pytest.raises(ProtocolError, match="arrived without its 'up-zstd' wire encoding"):
        we.decode_batch({"image": smooth_images(1, 3, 4, 4)}, "cpu", we.parse("up-zstd"))


def test_a_batch_decoding_past_the_servers_announced_max_batch_bytes_is_refused_unallocated(monkeypatch):
    """The announced max_batch_bytes, not the 16 GiB fallback, bounds a decoded batch: a header
    claiming more is refused naming both figures before anything is decompressed."""
    from data_service.protocol.generated import pb

    enc = we.encode_batch({"image": smooth_images(8, 3, 32, 32), "label": torch.arange(8)}, we.parse("up-zstd"))
    decoded = 8 * 3 * 32 * 32 + 8 * 8
    assert torch.equal(we.decode_batch(enc, "cpu", max_bytes=decoded)["image"], smooth_images(8, 3, 32, 32))
    with pytest.raises(ProtocolError, match=rf"decodes to {decoded} bytes, more than the "
                                            rf"max_batch_bytes={decoded - 1} the data servers announced"):
        we.decode_batch(enc, "cpu", max_bytes=decoded - 1)
    header = enc["image.wire"].clone()
    header[2] = 1 << 16  # 9.6 GB of 224-px images claimed, under the 16 GiB fallback
    header[4] = header[5] = 224
    import zstandard

    monkeypatch.setattr(zstandard, "ZstdDecompressor", None)  # refused before any decompression
    finish = FinishStage.load("", {}, "up-zstd", max_batch_bytes=1 << 20)
    assert finish.max_batch_bytes == 1 << 20
    for stage in (finish, finish_from_info(pb.DatasetInfo(wire_encoding="up-zstd", max_batch_bytes=1 << 20))):
        with pytest.raises(ProtocolError, match=rf"tensor 'image': shape \[65536, 3, 224, 224\] decodes to "
                                                rf"{(1 << 16) * 3 * 224 * 224} bytes, more than the "
                                                rf"max_batch_bytes={1 << 20} the data servers announced"):
            stage.unwire({**enc, "image.wire": header}, "cpu")
    assert finish_from_info(pb.DatasetInfo(wire_encoding="up-zstd")).max_batch_bytes == 0  # none: the fallback


def test_jpegs_bound_for_cuda_are_decoded_there_in_one_batch():
    """The seam the GPU path goes through (nvJPEG is never run here): host bytes in, one call per batch."""
    images = smooth_images(3, 3, 16, 24)
    enc = we.encode_batch({"image": images}, we.parse("jpeg:95"))
    calls = []

    def fake_cuda(parts, device):
        calls.append((device, [p.device.type for p in parts]))
        return we.jpeg_decode_cpu(parts)

    out = we.decode_batch(enc, "cuda:0", we.parse("jpeg:95"), cuda_decode=fake_cuda)
    assert calls == [(torch.device("cuda:0"), ["cpu"] * 3)] and out["image"].shape == images.shape
    up = we.encode_batch({"image": images}, we.parse("up-zstd"))
    assert torch.equal(we.decode_batch(up, "cuda:0", cuda_decode=fake_cuda)["image"], images) and len(calls) == 1


# -- through real data servers: same bits as the homogeneous mode, errors at start

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("wire_images")
    write_image_folder(root, per_class=4, classes=2, seed=2, min_side=48, max_side=64)
    return root


def options(folder, encoding: str) -> dict:
    return {"data_dir": str(folder), "batch_size": 4, "image_size": 32, "wire_encoding": encoding}


def finished(dataset, finish) -> list[torch.Tensor]:
    dataset.set_epoch(0)
    feeder = DeviceFeeder(ResumableLoader(torch.utils.data.DataLoader(dataset, batch_size=None)), "cpu", finish=finish)
    return [b["image"] for b in feeder]


@pytest.fixture(scope="module")
def servers(folder):
    """A data server per encoding, started when a test first asks (two at once, in threads)."""
    import concurrent.futures

    running: dict[str, DataServer] = {}
    pool = concurrent.futures.ThreadPoolExecutor(2)
    starting = {}

    def get(*encodings: str) -> list[DataServer]:
        for e in encodings:
            if e not in running and e not in starting:
                spec = PipelineSpec(TARGET, options(folder, e))
                starting[e] = pool.submit(DataServer(spec, TOKEN, ServerOptions(num_workers=1, probe=False)).start)
        for e in encodings:
            if e not in running:
                running[e] = starting.pop(e).result()
        return [running[e] for e in encodings]

    yield get
    pool.shutdown()
    for server in running.values():
        server.shutdown(grace_s=2.0)


@pytest.mark.parametrize("encoding", [pytest.param("uint8", marks=pytest.mark.slow), "up-zstd", "jpeg:90"])
def test_heterogeneous_and_homogeneous_give_the_same_bits(folder, servers, encoding):
    server = servers(encoding, *[e for e in ("up-zstd", "jpeg:90") if encoding != "uint8" and e != encoding])[0]
    assert server.dataset_info.wire_encoding == encoding
    remote = RemoteDataset([server.address], TOKEN, seed=3, connect_timeout=30.0)
    remote_finish = remote.finish_stage()
    assert remote_finish.wire == we.parse(encoding)
    het = finished(remote, remote_finish)
    local = LocalDataset(PipelineSpec(TARGET, options(folder, encoding)), seed=3)
    homog = finished(local, local.finish_stage())
    assert len(het) == len(homog) == 2
    for a, b in zip(het, homog):
        assert a.dtype == torch.float32 and a.shape == (4, 3, 32, 32)
        assert torch.equal(a, b)
    plain = LocalDataset(PipelineSpec(TARGET, options(folder, "uint8")), seed=3)
    reference = finished(plain, plain.finish_stage())
    if encoding == "jpeg:90":
        assert all(not torch.equal(a, r) for a, r in zip(homog, reference))
    else:
        assert all(torch.equal(a, r) for a, r in zip(homog, reference))  # lossless: the uint8 job's bits


def test_a_missing_decoder_stops_the_consumer_at_start(servers, monkeypatch):
    server, = servers("jpeg:90")

    def missing(datas):
        raise RuntimeError("decode_jpeg is not compiled in")

    monkeypatch.setattr(we, "jpeg_decode_cpu", missing)
    remote = RemoteDataset([server.address], TOKEN, seed=0, connect_timeout=30.0)
    with pytest.raises(ConfigError, match=r"wire_encoding='jpeg:90' cannot decode JPEG on this DNN node "
                                          r"\(RuntimeError: decode_jpeg is not compiled in\)"):
        remote.hello()
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard fails
    with pytest.raises(ConfigError, match="wire_encoding='up-zstd' needs zstandard to decode on this DNN node"):
        FinishStage.load("", {}, "up-zstd")
    with pytest.raises(ConfigError, match="unknown wire_encoding='jpeg2000'"):
        FinishStage.load("", {}, "jpeg2000")


def test_a_pipeline_with_an_unknown_encoding_fails_the_server_at_start(folder):
    spec = PipelineSpec("examples.synthetic:build_pipeline", {"size": 8, "batch_size": 4})
    pipe = spec.load()
    pipe.wire_encoding = "jpeg:900"
    from data_service.contract.pipeline import PipelineInfo

    with pytest.raises(ConfigError, match="wire_encoding='jpeg:900': the JPEG quality"):
        PipelineInfo.of(pipe)
    with pytest.raises(ConfigError, match="unknown wire_encoding='gif'"):
        DataServer(PipelineSpec(TARGET, options(folder, "gif")), TOKEN, ServerOptions(num_workers=1)).start()


@pytest.mark.slow  # a data server's start and probe batch (about 2.5 s)
def test_a_batch_that_decodes_past_max_batch_bytes_fails_the_server_at_start(folder):
    """max_batch_bytes bounds the batch a DNN node decodes, not only what travels: a JPEG batch whose
    wire bytes fit but whose images do not stops the data server at start, naming both figures."""
    decoded = 4 * 3 * 32 * 32 + 4 * 8  # four 32-px crops and their int64 labels
    with pytest.raises(ConfigError, match=rf"decodes to {decoded} bytes on the DNN nodes \(\d+ bytes on the wire "
                                          rf"as jpeg:90\), more than max_batch_bytes={decoded - 1}"):
        DataServer(PipelineSpec(TARGET, options(folder, "jpeg:90")), TOKEN,
                   ServerOptions(num_workers=1, max_batch_bytes=decoded - 1)).start()


def test_a_launched_job_decodes_and_names_its_encoding_in_metrics_json(folder, tmp_path):
    """``--hp pipeline.wire_encoding=jpeg:90``: one trainer rank (batches built in-process) takes the
    encoded batches through its finish stage and writes the encoding into metrics.json."""
    import json

    from hetero.ports import free_port
    from launcher.train import trainer
    from launcher.config import LaunchConfig

    cfg = LaunchConfig.from_hyperparameters({
        "pipeline": TARGET, "pipeline.data_dir": str(folder), "pipeline.batch_size": 4, "pipeline.image_size": 32,
        "pipeline.wire_encoding": "jpeg:90", "homogeneous": True, "homogeneous_loader": "dataloader",
        "loader_workers": 0, "evaluate": "", "max_steps": 2, "warmup_steps": 0, "checkpoint": False,
        "emulate_step_s": 0.001, "master_port": free_port()})
    job = trainer.TrainJob(cfg=cfg, mode="homogeneous", host="algo-1", dnn_hosts=("algo-1",), node_rank=0, nprocs=1,
                           master_addr="127.0.0.1", model_dir=str(tmp_path / "model"), output_dir=str(tmp_path / "out"))
    assert trainer.train(0, job)["status"] == "completed"
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["wire_encoding"] == "jpeg:90" and metrics["pipeline_options"]["wire_encoding"] == "jpeg:90"
    assert metrics["steps"] == 2
