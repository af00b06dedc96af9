"""Ready-made pipelines: ``images`` (image folders and image shards: decode, random crop, flip)."""
