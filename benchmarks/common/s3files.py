"""The baseline the shard source replaces: an image folder in S3 read one GET per file (FastFile's access pattern).

``build_pipeline(prefix=s3://bucket/files, ...)`` is the image pipeline with a data set whose
sample ``i`` is one S3 GET of file ``i`` (keys listed once, ``<class>/<name>.jpg``); everything
else (decode, crop, flip, collate) is the product's image pipeline.
"""
from __future__ import annotations

from data_service import Pipeline
from data_service.pipelines.images import FINISH_DTYPES, Augment, collate, decode_bytes, finish
from data_service.storage import S3Store


class S3Files:
    """The JPEGs under an S3 prefix as a map-style data set of (image, class index)."""

    def __init__(self, prefix: str, limit: int = 0) -> None:
        self.store = S3Store(prefix)
        keys = sorted(k for k, _ in self.store.list(".jpg"))
        self.classes = sorted({k.split("/")[0] for k in keys})
        self.samples = [(k, self.classes.index(k.split("/")[0])) for k in keys][:limit or None]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        key, label = self.samples[i]
        return decode_bytes(self.store.read(key), key), label


def build_pipeline(prefix: str, batch_size: int = 32, image_size: int = 224, limit: int = 0) -> Pipeline:
    """The image pipeline over :class:`S3Files` of ``prefix`` (its first ``limit`` files; 0: all)."""
    return Pipeline(dataset=S3Files(prefix, limit), batch_size=batch_size, transform=Augment(image_size, 0.08),
                    collate_fn=collate, drop_last=False, shuffle=True, finish=finish, finish_dtypes=FINISH_DTYPES)
