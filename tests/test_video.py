"""data_service.video and the video pipeline: the index of a video's frames, the clip sampler, the
decoder's levers (never a different pixel than decoding the video whole), clips a pure function of
(seed, epoch, index), and clips through a real data server bit-identical to those built in-process."""
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from data_service.contract.pipeline import PipelineSpec, SampleError, build_batch
from data_service.errors import ConfigError
from data_service.video.clips import ClipShape, ShortVideo, TooShort
from data_service.video.decode import Box, ClipDecoder, reference_frames
from data_service.video.probe import VideoError, probe
from hetero.synthetic.videos import write_video, write_video_folder

av = pytest.importorskip("av")

TARGET = "data_service.pipelines.video:build_pipeline"


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    """Small videos of the kinds the levers meet: B-frames and a short keyframe interval, no B-frames,
    one keyframe only, a rotated phone video, an odd size in 4:4:4, HEVC."""
    root = tmp_path_factory.mktemp("videos")
    kinds = {"bframes": dict(keyint=24, bframes=3), "no_bframes": dict(keyint=30, bframes=0),
             "one_keyframe": dict(keyint=250, bframes=2), "rotated": dict(keyint=20, rotation=90),
             "odd_size_444": dict(keyint=16, width=97, height=61, pix_fmt="yuv444p"), "hevc": dict(keyint=24, codec="libx265")}
    out = {}
    for i, (name, kw) in enumerate(kinds.items()):
        kw = {"width": 112, "height": 80, **kw}
        out[name] = write_video(root / f"{name}.mp4", frames=72, seed=i, **kw)
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("video_folder")
    write_video_folder(root, per_class=3, classes=2, frames=48, sizes=((112, 80), (96, 64)), keyint=16)
    return root


def test_the_index_holds_every_frame_in_presentation_order_and_the_keyframes(videos):
    index = probe(videos["bframes"].read_bytes())
    assert index.frames == 72 and index.codec == "h264" and (index.width, index.height) == (112, 80)
    assert index.keyframes.tolist() == [0, 24, 48]
    assert np.all(np.diff(index.pts) > 0) and index.fps == pytest.approx(30, rel=0.01)
    assert index.keyframe_before(23) == 0 and index.keyframe_before(24) == 24 and index.keyframe_before(71) == 48
    assert probe(videos["rotated"].read_bytes()).display_size == (80, 112)
    again = type(index).from_json(index.to_json())
    assert again.to_json() == index.to_json()


@pytest.mark.parametrize("kind", ["bframes", "no_bframes", "one_keyframe", "rotated", "odd_size_444", "hevc"])
@pytest.mark.parametrize("levers", [(True, True), (False, True), (False, False)])
def test_every_frame_a_clip_returns_is_the_frame_of_the_whole_decode(videos, kind, levers):
    data = videos[kind].read_bytes()
    index = probe(data)
    w, h = index.display_size
    box = Box(3, 5, h - 9, w - 12, 24, 20)
    whole = reference_frames(data, index, box)
    assert len(whole) == index.frames
    decoder = ClipDecoder(skip_nonref=levers[0], seek=levers[1])
    rng = np.random.default_rng(0)
    for _ in range(6):
        start = int(rng.integers(0, index.frames - 16))
        frames = list(range(start, start + 16, 2))
        clip = decoder.clip(data, index, frames, box)
        assert clip.shape == (8, 24, 20, 3) and clip.dtype == np.uint8
        for k, f in enumerate(frames):
            assert np.array_equal(clip[k], whole[f]), (kind, levers, f)


def test_the_levers_decode_fewer_frames_per_frame_returned(videos):
    data = videos["bframes"].read_bytes()
    index = probe(data)
    box = Box.whole(index, 16, 16)
    per_returned = {}
    for name, kw in {"none": dict(skip_nonref=False, seek=False), "seek": dict(skip_nonref=False),
                     "all": {}}.items():
        decoder = ClipDecoder(**kw)
        for start in range(30, 56, 5):
            decoder.clip(data, index, list(range(start, start + 16, 2)), box)
        per_returned[name] = decoder.counts.per_returned
    assert per_returned["all"] < per_returned["seek"] < per_returned["none"], per_returned


def test_what_is_not_a_video_is_named(tmp_path):
    with pytest.raises(VideoError, match="not a readable video"):
        probe(b"\x00" * 1000)
    audio = tmp_path / "audio.m4a"
    with av.open(str(audio), "w") as out:
        stream = out.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    with pytest.raises(VideoError, match="no video stream"):
        probe(audio.read_bytes())


def test_a_file_cut_short_serves_the_frames_before_the_cut(videos):
    data = videos["no_bframes"].read_bytes()
    cut = data[: len(data) * 2 // 3]
    try:
        index = probe(cut)
    except VideoError:
        return  # the demuxer found nothing it could trust: the whole video is refused, also fine
    assert 0 < index.frames <= 72
    decoder = ClipDecoder()
    clip = decoder.clip(cut, index, [0, 1], Box.whole(index, 8, 8))
    assert clip.shape[0] == 2


@settings(max_examples=200, deadline=None)
@given(frames=st.integers(1, 20), stride=st.integers(1, 5), available=st.integers(1, 200),
       short=st.sampled_from(list(ShortVideo)), seed=st.integers(0, 2**31))
def test_a_clip_is_its_frames_stride_apart_inside_the_video(frames, stride, available, short, seed):
    shape = ClipShape(frames, stride, short)
    gen = torch.Generator().manual_seed(seed)
    try:
        got = shape.frames_of(available, generator=gen)
    except TooShort:
        assert short is ShortVideo.SKIP and available < shape.span
        return
    assert len(got) == frames and all(0 <= f < available for f in got)
    if available >= shape.span:
        assert all(b - a == stride for a, b in zip(got, got[1:]))
    elif short is ShortVideo.PAD:
        assert got == sorted(got) and got[-1] == min(available - 1, (frames - 1) * stride)
    again = shape.frames_of(available, generator=torch.Generator().manual_seed(seed))
    assert again == got  # a pure function of the generator's state


def test_clip_options_are_checked_and_named():
    with pytest.raises(ConfigError, match="frames_per_clip=0 must be an integer >= 1"):
        ClipShape(0)
    with pytest.raises(ConfigError, match="short_video='cut' must be 'pad'"):
        ClipShape(4, 1, "cut")  # type: ignore[arg-type]


def load(folder: Path, **options):
    return PipelineSpec(TARGET, {"data_dir": str(folder), "image_size": 32, "batch_size": 2, "frames_per_clip": 4,
                                 **options}).load()


def test_batches_are_uint8_clips_a_pure_function_of_seed_epoch_and_index(folder):
    pipe = load(folder)
    cfg = pipe.epoch_shape()
    assert cfg.num_samples == 6
    batch = build_batch(pipe, cfg, seed=3, epoch=0, index=1)
    assert batch["video"].shape == (2, 3, 4, 32, 32) and batch["video"].dtype == torch.uint8
    assert torch.equal(build_batch(pipe, cfg, seed=3, epoch=0, index=1)["video"], batch["video"])
    assert not torch.equal(build_batch(pipe, cfg, seed=3, epoch=1, index=1)["video"], batch["video"])
    other = load(folder, layout="BTCHW")
    assert torch.equal(build_batch(other, other.epoch_shape(), 3, 0, 1)["video"], batch["video"].transpose(1, 2))
    finished = pipe.finish(batch)
    assert finished["video"].dtype == torch.float32 and finished["video"].shape == batch["video"].shape
    # every lever gives the same clips
    plain = load(folder, levers="none")
    assert torch.equal(build_batch(plain, plain.epoch_shape(), 3, 0, 1)["video"], batch["video"])


def test_a_video_that_does_not_decode_is_named_or_skipped(tmp_path, folder):
    import shutil

    root = tmp_path / "v"
    shutil.copytree(folder, root)
    bad = sorted(root.glob("*/*.mp4"))[0]
    bad.write_bytes(b"not a video at all" * 50)
    pipe = load(root, batch_size=6)
    with pytest.raises(SampleError, match=rf"{bad.name}.*not a readable video.*on_corrupt=skip"):
        build_batch(pipe, pipe.epoch_shape(), 0, 0, 0)
    skip = load(root, batch_size=6, on_corrupt="skip")
    assert len(build_batch(skip, skip.epoch_shape(), 0, 0, 0)["label"]) == 5 and skip.samples_skipped == 1


def test_bad_options_and_an_empty_folder_are_named(tmp_path, folder):
    with pytest.raises(ConfigError, match="crop='middle' must be 'random'"):
        load(folder, crop="middle")
    with pytest.raises(ConfigError, match="unknown video pipeline option"):
        load(folder, frames=3)
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "a.jpg").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"not videos by their name.*\.mp4"):
        load(tmp_path)


def test_clips_through_a_data_server_are_the_clips_built_in_process(folder):
    from data_service.server import DataServer, ServerOptions
    from dnn_worker import RemoteDataset

    options = {"data_dir": str(folder), "image_size": 32, "batch_size": 2, "frames_per_clip": 4}
    pipe = PipelineSpec(TARGET, options).load()
    cfg = pipe.epoch_shape()
    server = DataServer(PipelineSpec(TARGET, options), "tok", ServerOptions(num_workers=2)).start()
    try:
        got = list(RemoteDataset([server.address], "tok", seed=5, connect_timeout=60.0))
    finally:
        server.shutdown(grace_s=2.0)
    assert len(got) == cfg.num_batches

    local = [build_batch(pipe, cfg, seed=5, epoch=0, index=i) for i in range(cfg.num_batches)]
    assert all(torch.equal(g["video"], w["video"]) and torch.equal(g["label"], w["label"])
               for g, w in zip(got, local))


def test_a_rotated_video_is_served_as_displayed(videos):
    data = videos["rotated"].read_bytes()
    index = probe(data)
    assert index.rotation == 90
    with av.open(str(videos["rotated"])) as c:
        coded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)][7]
    shown = np.rot90(coded, k=1)  # the display matrix turns the coded frame 90 degrees counter-clockwise
    w, h = index.display_size
    assert np.array_equal(ClipDecoder().clip(data, index, [7], Box(0, 0, h, w, h, w))[0], shown)
    part = ClipDecoder().clip(data, index, [7], Box(10, 6, 30, 20, 30, 20))[0]
    assert np.array_equal(part, shown[10:40, 6:26])


def test_hetero_synth_videos_writes_a_folder_the_pipeline_reads(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hetero", "synth", "--videos", str(tmp_path / "v"), "--frames", "20",
                          "--per-class", "1", "--classes", "2", "--keyint", "10"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "2 videos written" in out.stdout and "examples.video:small3d" in out.stdout
    files = sorted((tmp_path / "v").glob("*/*.mp4"))
    assert [f.parent.name for f in files] == ["circle", "square"]
    index = probe(files[0].read_bytes())
    assert index.frames == 20 and index.keyframes.tolist() == [0, 10]


def test_the_example_model_takes_a_finished_batch_and_trains_a_step(folder):
    from examples import video

    pipe = load(folder)
    batch = build_batch(pipe, pipe.epoch_shape(), 0, 0, 0)
    model = video.small3d(data_dir=str(folder), width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = video.train_step(model, batch, optimizer, torch.device("cpu"))
    assert np.isfinite(loss) and model[-1].out_features == 2


@pytest.mark.slow  # a whole local job: a data node and a trainer (about 30 s)
def test_hetero_local_trains_a_video_job_end_to_end(folder, tmp_path):
    from hetero.local import LocalJob, run_local

    hps = {"pipeline": TARGET, "pipeline.batch_size": 2, "pipeline.image_size": 32, "pipeline.frames_per_clip": 4,
           "model": "examples.video:small3d", "model.width": 4, "step": "examples.video:train_step",
           "evaluate": "examples.video:evaluate", "epochs": 2}
    result = run_local(LocalJob(output=tmp_path / "out", data=folder, hyperparameters=hps, data_nodes=1,
                                dnn_nodes=1, timeout_s=240, echo=False))
    assert result.ok and set(result.exit_codes.values()) == {0}, result.exit_codes
    assert result.metrics["steps"] == 2 * 3 and result.metrics["step_kind"] == "real"
