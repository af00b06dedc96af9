"""Writing a data set as shards plus an index (``hetero prepare``), beside the format it writes.

``writer`` converts samples and writes the tar shards and the index; ``plan`` splits a data set
into shards, parts and resumable steps and merges the parts' manifests. The format itself is
``data_service.shards.format``; data nodes only read it and never import this room.
"""
