"""From a batch on the host to tensors on the accelerator: the device feeder, its CUDA-only operations behind a small seam, and the DDP backend choice."""
