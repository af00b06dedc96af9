import pytest
import torch

from data_service import Pipeline, PipelineSpec
from data_service.errors import ConfigError
from data_service.contract.pipeline import SampleError, build_batch


def not_a_pipeline():
    return [1, 2, 3]


def iterable_only():
    return Pipeline(dataset=iter([1, 2]), batch_size=1)


@pytest.mark.parametrize("target, options, match", [
    ("no_colon_here", {}, "package.module:function"),
    ("no_such_module_xyz:build", {}, "cannot import module 'no_such_module_xyz'"),
    ("examples.synthetic:nope", {}, "no callable 'nope'"),
    ("examples.synthetic:build_pipeline", {"bogus": 1}, "rejected options"),
    ("examples.synthetic:build_pipeline", {"batch_size": 0}, "batch_size=0"),
    ("examples.synthetic:build_pipeline", {"size": 0}, "empty"),
    # By this module's own name (pytest puts tests/ on sys.path): `tests.` may resolve to another
    # distribution's top-level tests package in site-packages (smdebug-rulesconfig installs one).
    ("test_pipeline:not_a_pipeline", {}, "returned list"),
    ("test_pipeline:iterable_only", {}, "not map-style"),
])
def test_bad_pipelines_fail_with_the_value_and_the_fix(target, options, match):
    with pytest.raises(ConfigError, match=match):
        PipelineSpec(target, options).load()


def test_options_must_be_json():
    with pytest.raises(ConfigError, match="JSON"):
        PipelineSpec("a:b", {"x": object()})


def test_fingerprint_tracks_target_and_options():
    a = PipelineSpec("examples.synthetic:build_pipeline", {"size": 10})
    assert a.fingerprint() == PipelineSpec.from_json(a.to_json()).fingerprint()
    assert a.fingerprint() != PipelineSpec("examples.synthetic:build_pipeline", {"size": 11}).fingerprint()


def test_augmentation_is_seeded_per_batch_not_per_process():
    spec = PipelineSpec("examples.synthetic:build_pipeline", {"size": 50, "batch_size": 5})
    pipe = spec.load()
    cfg = pipe.epoch_shape()
    first = build_batch(pipe, cfg, 1, 0, 3)
    torch.manual_seed(999)  # global RNG state must not leak into batches
    build_batch(pipe, cfg, 1, 0, 4)
    again = build_batch(pipe, cfg, 1, 0, 3)
    assert torch.equal(first["image"], again["image"])
    assert not torch.equal(first["image"], build_batch(pipe, cfg, 2, 0, 3)["image"])


def test_failing_sample_is_named():
    pipe = PipelineSpec("examples.synthetic:build_pipeline", {"size": 10, "batch_size": 10, "fail_at": 7}).load()
    with pytest.raises(SampleError) as info:
        build_batch(pipe, pipe.epoch_shape(), 0, 0, 0)
    assert info.value.sample_index == 7 and isinstance(info.value.cause, ValueError)
