"""benchmarks.gpu: its CPU mode runs every feed end to end; the sweep's verdict; the photo-like
JPEGs written from the bundled source photographs where scikit-image is absent."""
from __future__ import annotations

import json

import pytest

from benchmarks import gpu, photos


def test_smallest_k_is_the_first_within_five_percent_of_the_limit():
    runs = [{"feed": "servers", "k": 8, "images_per_s": 960.0}, {"feed": "servers", "k": 4, "images_per_s": 700.0},
            {"feed": "servers", "k": 12, "images_per_s": 990.0}, {"feed": "local", "k": 4, "images_per_s": 500.0},
            {"feed": "local", "k": 8, "images_per_s": 900.0}, {"feed": "dali", "k": 4, "skipped": "absent"},
            {"feed": "resident", "k": None, "images_per_s": 1000.0}]
    reach = gpu.smallest_k(runs, 1000.0)
    assert reach["servers"] == {"k": 8, "best_share": 0.99, "best_k": 12}
    assert reach["local"] == {"k": None, "best_share": 0.9, "best_k": 8}
    assert reach["dali"] == {"k": None, "best_share": None, "best_k": None}
    assert "resident" not in reach


@pytest.mark.parametrize("text, message", [("0", "each k must be 1..3"), ("4", "each k must be 1..3"),
                                           ("two", "must be comma-separated core counts")])
def test_bad_k_names_the_value(text, message):
    with pytest.raises(SystemExit, match=message):
        gpu.parse_ks(text, 4)
    assert gpu.parse_ks("3,1,1", 4) == [1, 3]


def test_photos_without_scikit_image_come_from_the_bundled_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(photos, "photo_sources", lambda: "bundled")
    assert photos.write_photo_folder(tmp_path, 12) == 12
    classes = sorted(p.name for p in tmp_path.iterdir())
    assert len(classes) == 9 and "stereo_motorcycle" not in classes and set(classes) <= set(photos.SOURCES)
    from PIL import Image

    sizes = [Image.open(p).size for p in tmp_path.glob("*/*.jpg")]
    assert len(sizes) == 12 and all(250 <= max(s) <= 500 for s in sizes)


@pytest.mark.slow  # a data server and DataLoader workers start: about 10 s on 2 cores
def test_cpu_mode_runs_every_feed(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--steps", "2", "--warmup", "1", "--batch-size", "4", "--image-size", "32",
                     "--images", "16", "--k", "1", "--images-dir", str(tmp_path / "photos"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| feed | k | images/s |" in printed and "cores to reach the limit" in printed
    assert ("fused decoder: the C extension is built" in printed) != ("FALLBACK DECODER" in printed)
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["model"] == "small" and res["k"] == [1]
    runs = {r["feed"]: r for r in res["results"]}
    assert set(runs) == {"resident", "servers", "local", "gpu-decode", "dali"}
    for name in ("resident", "servers", "local", "gpu-decode"):
        r = runs[name]
        assert r["images_per_s"] > 0 and r["steps"] == 2 and r["gpu_busy_share"] is None, r
        assert r["loss"] == r["loss"], f"{name}: the loss is NaN"
    for name in ("servers", "local", "gpu-decode"):  # /proc counts CPU in 10 ms ticks: 8 images may show 0
        assert runs[name]["k"] == 1 and runs[name]["data_cpu_ms_per_image"] >= 0, runs[name]
    assert runs["gpu-decode"]["data_cpu_ms_per_image"] > 0  # the decode thread's own CPU clock
    assert "skipped" in runs["dali"] or runs["dali"]["images_per_s"] > 0
    assert set(res["smallest_k"]) == {"servers", "local", "gpu-decode", "dali"}


BLOCK_PSUTIL = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "psutil":
            raise ModuleNotFoundError("No module named 'psutil'", name="psutil")
sys.meta_path.insert(0, Block())
from hetero.cli import main
try:
    main(["serve", "--help"])
except SystemExit as exc:
    print("serve --help exit", exc.code)
print("bench exit", main(["bench"]))
"""


def test_hetero_serve_runs_without_psutil():
    """``psutil`` is the bench extra's: a machine without it (the reference GPU machine) still
    serves, and ``hetero bench`` says what it needs."""
    import subprocess
    import sys

    from conftest import ROOT

    out = subprocess.run([sys.executable, "-c", BLOCK_PSUTIL], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--workers" in out.stdout and "serve --help exit 0" in out.stdout, out.stdout[-2000:]
    assert "needs the Python package 'psutil'" in out.stderr and "bench exit 2" in out.stdout, out.stdout + out.stderr
