"""data_service.pipelines.images: JPEG image-folder pipeline, its errors, skipped samples in stats,
``hetero synth --images``, and ResNet-18 trained through a real data server."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_service import SkipSample
from data_service.errors import BatchBuildError, ConfigError
from data_service.contract.pipeline import PipelineSpec, SampleError, build_batch
from data_service.server import DataServer, ServerOptions
from examples import imagefolder
from hetero.synthetic.images import write_image_folder

ROOT = Path(__file__).resolve().parent.parent
TARGET = "data_service.pipelines.images:build_pipeline"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """3 classes x 8 small JPEGs (drawn at 64-96 px a side to keep the tests fast)."""
    root = tmp_path_factory.mktemp("images")
    write_image_folder(root, per_class=8, classes=3, seed=1, min_side=64, max_side=96)
    return root


def load(folder: Path, **options):
    return PipelineSpec(TARGET, {"data_dir": str(folder), **options}).load()


def test_batches_are_uint8_crops_finished_on_the_device(folder):
    pipe = load(folder, batch_size=6, image_size=32)
    cfg = pipe.epoch_shape()
    batch = build_batch(pipe, cfg, seed=3, epoch=0, index=1)
    assert batch["image"].shape == (6, 3, 32, 32) and batch["image"].dtype == torch.uint8
    assert batch["label"].dtype == torch.int64 and set(batch["label"].tolist()) <= {0, 1, 2}
    assert torch.equal(build_batch(pipe, cfg, seed=3, epoch=0, index=1)["image"], batch["image"])
    assert not torch.equal(build_batch(pipe, cfg, seed=4, epoch=0, index=1)["image"], batch["image"])
    assert pipe.finish_target() == "data_service.pipelines.images:finish" and pipe.finish_dtypes == {"image": "float32"}
    finished = imagefolder.finish(batch)["image"]
    assert finished.dtype == torch.float32 and finished.shape == batch["image"].shape
    expected = (batch["image"][:, 1].float() - 0.456 * 255) / (0.224 * 255)
    assert torch.allclose(finished[:, 1], expected, atol=1e-5)


def test_float32_on_the_wire_is_four_times_the_bytes(folder):
    device = build_batch(*(lambda p: (p, p.epoch_shape()))(load(folder, batch_size=4, image_size=32)), 0, 0, 0)
    server = build_batch(*(lambda p: (p, p.epoch_shape()))(load(folder, batch_size=4, image_size=32,
                                                                   finish_on="server")), 0, 0, 0)
    assert server["image"].dtype == torch.float32
    assert server["image"].nbytes == 4 * device["image"].nbytes == 4 * 4 * 3 * 32 * 32


def test_synthetic_folder_layout_and_sizes(tmp_path):
    from torchvision.io import decode_image

    paths = write_image_folder(tmp_path, per_class=2, classes=3, seed=0)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        "circle/00000.jpg", "circle/00001.jpg", "square/00000.jpg", "square/00001.jpg",
        "triangle/00000.jpg", "triangle/00001.jpg"]
    for p in paths:
        img = decode_image(str(p))
        assert img.shape[0] == 3 and 300 <= img.shape[1] <= 500 and 300 <= img.shape[2] <= 500
    with pytest.raises(ConfigError, match="classes=9 must be in 1..6"):
        write_image_folder(tmp_path, classes=9)


@pytest.mark.slow
def test_hetero_synth_images_cli(tmp_path):
    run = subprocess.run([sys.executable, "-m", "hetero", "synth", "--images", str(tmp_path / "imgs"), "--classes",
                          "2", "--per-class", "3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 JPEG images in 2 classes (circle, square)" in run.stdout
    assert len(list((tmp_path / "imgs").glob("*/*.jpg"))) == 6
    both = subprocess.run([sys.executable, "-m", "hetero", "synth", str(tmp_path / "m"), "--images",
                           str(tmp_path / "i")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "not two of them" in both.stderr and not both.stdout


def test_folder_errors_name_the_folder_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("SM_CHANNEL_TRAINING", raising=False)
    with pytest.raises(ConfigError, match="SM_CHANNEL_TRAINING is unset"):
        imagefolder.build_pipeline()
    with pytest.raises(ConfigError, match="no such directory"):
        imagefolder.build_pipeline(data_dir=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="is empty: expected one sub-folder per class"):
        imagefolder.build_pipeline(data_dir=str(tmp_path))
    (tmp_path / "cat").mkdir()
    (tmp_path / ".hidden").write_text("ignored")
    with pytest.raises(ConfigError, match=r"class folders 'cat' but no .jpg"):
        imagefolder.build_pipeline(data_dir=str(tmp_path))
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(ConfigError, match=r"1 file\(s\) .* not images by their name .*notes.txt.*move them out"):
        imagefolder.build_pipeline(data_dir=str(tmp_path))
    (tmp_path / "cat" / "notes.txt").unlink()
    (tmp_path / "stray.jpg").write_bytes(b"")
    with pytest.raises(ConfigError, match="files outside class folders .*stray.jpg"):
        imagefolder.build_pipeline(data_dir=str(tmp_path))


@pytest.mark.parametrize("options, message", [
    ({"batch_size": 0}, "batch_size=0 must be an integer >= 1"),
    ({"image_size": 4}, "image_size=4 must be an integer in 8..4096"),
    ({"min_scale": 0}, r"min_scale=0 must be in \(0, 1\]"),
    ({"on_corrupt": "ignore"}, "on_corrupt='ignore' must be 'fail'"),
    ({"finish_on": "gpu"}, "finish_on='gpu' must be 'device'"),
    ({"limit": -1}, "limit=-1 must be an integer >= 0"),
    ({"batch_size": 100}, "holds 24 images, fewer than batch_size=100"),
])
def test_bad_options_are_named(folder, options, message):
    with pytest.raises(ConfigError, match=message):
        load(folder, **options)


def _with_corrupt(tmp_path: Path, folder: Path) -> tuple[Path, Path]:
    import shutil

    root = tmp_path / "imgs"
    shutil.copytree(folder, root)
    bad = root / "circle" / "00003.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated mid-scan
    return root, bad


def test_corrupt_jpeg_fails_naming_the_file(tmp_path, folder):
    root, bad = _with_corrupt(tmp_path, folder)
    pipe = load(root, batch_size=24, image_size=16)
    with pytest.raises(SampleError) as info:
        build_batch(pipe, pipe.epoch_shape(), 0, 0, 0)
    assert isinstance(info.value.cause, imagefolder.CorruptImageError)
    text = str(info.value)
    assert str(bad) in text and "does not decode" in text and "on_corrupt=skip" in text
    assert ".cpp" not in text  # torchvision's source location is not the user's business


def test_corrupt_jpeg_is_skipped_and_counted_in_server_stats(tmp_path, folder):
    from dnn_worker import RemoteDataset

    root, bad = _with_corrupt(tmp_path, folder)
    # in-process: the batch holding the file comes out one shorter
    pipe = load(root, batch_size=8, image_size=16, on_corrupt="skip")
    sizes = [len(build_batch(pipe, pipe.epoch_shape(), 0, 0, i)["label"]) for i in range(3)]
    assert sorted(sizes) == [7, 8, 8] and pipe.samples_skipped == 1
    # through a real data server: the stat adds the workers' counts up
    spec = PipelineSpec(TARGET, {"data_dir": str(root), "batch_size": 8, "image_size": 16, "on_corrupt": "skip"})
    server = DataServer(spec, "tok", ServerOptions(num_workers=1)).start()
    try:
        got = list(RemoteDataset([server.address], "tok", seed=0, connect_timeout=30.0))
        assert sorted(len(b["label"]) for b in got) == [7, 8, 8]
        snap = server.stats.snapshot()
        # counted per build: a batch the server built twice (a re-request) counts its skip twice
        assert 1 <= snap.samples_skipped <= 1 + snap.batches_built - snap.batches_sent
    finally:
        server.shutdown(grace_s=2.0)


def test_a_batch_with_every_sample_skipped_is_an_error(folder):
    class Skipping:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise SkipSample(f"sample {i} unreadable")

    from data_service import Pipeline

    pipe = Pipeline(dataset=Skipping(), batch_size=2)
    with pytest.raises(SampleError, match="every one of the 2 samples of this batch was skipped"):
        build_batch(pipe, pipe.epoch_shape(), 0, 0, 0)


@pytest.mark.slow
def test_corrupt_image_reaches_the_consumer_with_the_file_name(tmp_path, folder):
    from dnn_worker import RemoteDataset

    root, bad = _with_corrupt(tmp_path, folder)
    spec = PipelineSpec(TARGET, {"data_dir": str(root), "batch_size": 24, "image_size": 16})
    # the server builds batch 0 at start: a corrupt file there stops it at once
    with pytest.raises(ConfigError, match=f"fails on epoch 0, batch 0.*{bad}.*does not decode"):
        DataServer(spec, "tok", ServerOptions(num_workers=1)).start()
    server = DataServer(spec, "tok", ServerOptions(num_workers=1, probe=False)).start()
    try:
        with pytest.raises(BatchBuildError, match=f"{bad}.*does not decode"):
            next(iter(RemoteDataset([server.address], "tok", seed=0, connect_timeout=30.0)))
    finally:
        server.shutdown(grace_s=2.0)


def test_resnet18_counts_classes_or_asks_for_them(folder, monkeypatch):
    monkeypatch.delenv("SM_CHANNEL_TRAINING", raising=False)
    assert imagefolder.resnet18(data_dir=str(folder)).fc.out_features == 3
    assert imagefolder.resnet18(num_classes=7).fc.out_features == 7
    with pytest.raises(ConfigError, match="pass model.num_classes=N"):
        imagefolder.resnet18()


@pytest.mark.slow
def test_resnet18_trains_through_a_data_server(folder):
    """ResNet-18 (no pretrained weights) on 32 px crops, 6 steps through a real data server: loss falls."""
    from torch.utils.data import DataLoader

    from dnn_worker import DeviceFeeder, RemoteDataset

    spec = PipelineSpec(TARGET, {"data_dir": str(folder), "batch_size": 12, "image_size": 32, "min_scale": 0.5})
    server = DataServer(spec, "tok", ServerOptions(num_workers=1)).start()
    torch.manual_seed(0)
    model = imagefolder.resnet18(num_classes=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    try:
        ds = RemoteDataset([server.address], "tok", seed=0, connect_timeout=30.0)
        finish = ds.finish_stage()  # what the server announced: data_service.pipelines.images:finish
        assert finish.target == "data_service.pipelines.images:finish"
        losses = []
        for epoch in range(3):  # 2 batches per epoch
            ds.set_epoch(epoch)
            feed = DeviceFeeder(DataLoader(ds, batch_size=None, num_workers=0), torch.device("cpu"), finish=finish)
            for batch in feed:
                assert batch["image"].dtype == torch.float32  # finished on the consumer's side
                losses.append(imagefolder.train_step(model, batch, optimizer, torch.device("cpu")))
    finally:
        server.shutdown(grace_s=2.0)
    assert len(losses) == 6
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2, losses
