"""Video decoding for training clips: what a clip costs is the frames decoded from the keyframe before
its first frame to its last, and this room decodes no more than those need.

``probe`` (a video's frames and keyframes from its packets, no decoding: the index ``hetero prepare
--videos`` stores), ``clips`` (which frames a clip is, drawn from the batch's generator; videos
shorter than a clip), ``decode`` (the clip decoder: seek, skip, one swscale pass out; and the whole
decode every clip is held to). PyAV (FFmpeg in its wheels) is imported only when a video is read.
"""
