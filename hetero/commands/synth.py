"""``hetero synth``: write synthetic training data for offline use.

``hetero synth DIR`` writes MNIST-format IDX files (train + t10k); ``hetero synth --images DIR``
writes a JPEG image folder (``DIR/<class>/*.jpg``) for ``data_service.pipelines.images``;
``hetero synth --videos DIR`` a folder of web-like videos (``DIR/<class>/*.mp4``) for
``data_service.pipelines.video``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "synth", "write synthetic MNIST IDX files, a JPEG image folder (--images) or videos "
                    "(--videos)",
                    "Without --images: drawn seven-segment digits (shifted, scaled, noisy) in MNIST's "
                    "IDX format: train-images-idx3-ubyte, train-labels-idx1-ubyte and the t10k pair. "
                    "With --images DIR: JPEGs of drawn shapes, DIR/<shape>/<n>.jpg, 300-500 px a "
                    "side, for the image-folder pipeline (data_service.pipelines.images). With --videos "
                    "DIR: web-like H.264 videos, DIR/<shape>/<n>.mp4 (a textured background panned across, "
                    "a moving shape, noise; a keyframe every --keyint frames, B-frames) for the video "
                    "pipeline (data_service.pipelines.video).")
    p.add_argument("out", type=Path, nargs="?", default=None, help="folder for MNIST IDX files (created)")
    p.add_argument("--images", type=Path, default=None, metavar="DIR",
                   help="write a JPEG image folder here instead (created)")
    p.add_argument("--videos", type=Path, default=None, metavar="DIR",
                   help="write a folder of videos here instead (created; needs the video extra)")
    p.add_argument("--frames", type=int, default=300, help="--videos: frames per video, at 30 fps (default 300)")
    p.add_argument("--keyint", type=int, default=250,
                   help="--videos: frames from one keyframe to the next (default 250, as web videos)")
    p.add_argument("--train", type=int, default=60000, help="MNIST: training images (default 60000)")
    p.add_argument("--test", type=int, default=10000, help="MNIST: test images (default 10000; 0 = none)")
    p.add_argument("--gzip", action="store_true", help="MNIST: write .gz files, as MNIST is distributed")
    p.add_argument("--classes", type=int, default=4,
                   help="--images, --videos: classes, one shape each (1-6, default 4)")
    p.add_argument("--per-class", type=int, default=None,
                   help="--images, --videos: files per class (default 64 images, 4 videos)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawings: the same seed writes the same files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if sum(x is not None for x in (args.out, args.images, args.videos)) != 1:
        print("hetero synth: give one of a folder for MNIST IDX files (hetero synth DIR), --images DIR for a "
              "JPEG image folder or --videos DIR for a folder of videos, not two of them", file=sys.stderr)
        return 2
    if args.videos is not None:  # a ConfigError is hetero.cli's to say
        from hetero.synthetic.videos import write_video_folder

        written = write_video_folder(args.videos, per_class=args.per_class or 4, classes=args.classes,
                                     frames=args.frames, keyint=args.keyint, seed=args.seed)
        print(f"{written} videos written under {args.videos} ({args.classes} classes, {args.frames} frames each)")
        print(f"train on them: hetero local --data {args.videos} --hp pipeline=data_service.pipelines.video:build_pipeline"
              " --hp model=examples.video:small3d --hp step=examples.video:train_step"
              " --hp evaluate=examples.video:evaluate")
        return 0
    if args.images is not None:  # a ConfigError is hetero.cli's to say
        from hetero.synthetic.images import write_image_folder

        paths = write_image_folder(args.images, per_class=args.per_class or 64, classes=args.classes,
                                   seed=args.seed)
        classes = sorted({p.parent.name for p in paths})
        print(f"{len(paths)} JPEG images in {len(classes)} classes ({', '.join(classes)}) under {args.images}")
        print(f"train on them: hetero local --data {args.images} --hp pipeline=data_service.pipelines.images:build_pipeline"
              " --hp model=examples.imagefolder:resnet18 --hp step=examples.imagefolder:train_step"
              " --hp evaluate=examples.imagefolder:evaluate")
        return 0
    from hetero.synthetic.mnist import write_synthetic

    paths = write_synthetic(args.out, args.train, args.test, args.seed, args.gzip)
    for path in paths:
        print(path)
    return 0
